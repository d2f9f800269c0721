"""The conformance suite (issues 5 and 16): the reference model's judgement, packaged for
other implementations and shipped in the wheel. Cases are JSON (``corpus/``, checked
against ``schema.json``; both package data); ``adapter`` is the in-process plug-in,
``process`` the JSON-lines one; ``runner`` runs cases; ``kit`` is the pytest test kit;
``live`` runs the model's random state machine (``machine``, driving the model through
``harness``) against a candidate. ``ckpt conformance`` is the command line. The corpus is
built and checked by ``model_tests/corpus_tool.py``. See CONFORMANCE.md."""
