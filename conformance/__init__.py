"""The conformance suite (issue 5): the reference model's judgement, packaged for other
implementations. Cases are JSON (``corpus/``, ``schema.json``); ``adapter`` is the in-process
plug-in, ``process`` the JSON-lines one; ``runner`` runs cases; ``kit`` is the pytest test
kit; ``corpus_tool`` builds and checks the corpus. See CONFORMANCE.md."""
