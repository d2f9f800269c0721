"""Runnable examples of the public API (``from fastimpl import CheckpointStore, ...``).

Not part of the wheel: they live in the repository for users to read and run
(``python -m examples.scripted_job``, ``make demo DEMO=scripted``).
"""
