"""The scripted job of ``make demo DEMO=scripted``, written on the public API.

A simulated stream job on real local files, in each merging mode: checkpoints with
RocksDB-like incremental state, a declined checkpoint, a late notice, a TM lost mid-checkpoint
with a zombie that keeps writing, a failover, a CLAIM restore that rescales, and quiet at
the end, every invariant checked on the real files after every call. Read it in this order:

* ``job.py``: the job itself, every call one of the public API or, for the faults and
  the checks, of its test seam ``fastimpl.testing`` (start here);
* ``rocks_like.py``: the RocksDB-like local state that makes incremental checkpoints;
* ``figures.py``: files created and deleted per checkpoint, space amplification;
* ``report.py``: the tables; ``runner.py``: one run per merging mode;
* ``__main__.py``: ``python -m examples.scripted_job --help``.
"""

from examples.scripted_job.figures import DemoResult, ModeResult
from examples.scripted_job.job import MIN_CHECKPOINTS
from examples.scripted_job.runner import MODES, run_demo

__all__ = ["MIN_CHECKPOINTS", "MODES", "DemoResult", "ModeResult", "run_demo"]
