"""An engine embedding the two parties of the store (``fastimpl.parties``): the
coordinator in the engine's process, each TM in an OS process of its own, meeting only
through encoded ``spec.messages`` over pipes and the files on storage. Run it with
``python -m examples.embedding [BASE_DIR]``; read ``job.py`` first."""
