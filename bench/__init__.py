"""Benchmarks of fastimpl (issue 3): ``python -m bench`` or ``make bench``.

Four figures, each a ratio against a baseline measured in the same run (never a timed
assertion): write throughput on local disk, small segments per second on ``memory://``,
subsume cost per discarded segment as the number of live segments grows, and memory per
tracked segment. See ``bench/README.md`` for what each one measures and how to read
``bench/results.json``.
"""
