"""A subtask's DB directory on the executor's local disk, between its tasks: what a
task clears that earlier attempts left, and how it leaves its DB for the next task
without destroying another attempt's. Both backends' tasks (``subtask``,
``working_task``) hand their DB over so."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

SET_ASIDE = ".done"
"""The suffix of a DB an attempt put back while another attempt's was in its place."""


def sweep_leftovers(home: Path, keep: set[str]) -> None:
    """Remove the directories other attempts left (see ``BatchOrder.sweep_local``), but
    the DBs put back (the task takes one of those: ``pipeline.stream.subtask``)."""
    for entry in home.iterdir():
        if (
            entry.name not in keep
            and entry.name.startswith(("db.", "chk-"))
            and not entry.name.endswith(SET_ASIDE)
        ):
            shutil.rmtree(entry, ignore_errors=True)


def put_back(mine: Path, shared: Path) -> None:
    """Leave the DB for the subtask's next task. If another attempt's DB is there (a
    speculative copy of this task, or a late attempt of an earlier batch whose Python
    worker Spark had not yet stopped), neither is destroyed: this one is set aside
    (``db.<attempt>.done``) and the next task takes whichever the latest completed
    checkpoint was taken of (``pipeline.stream.subtask``). Replacing would let a late
    attempt remove the DB, and the TM records, of the attempt whose checkpoint
    completed."""
    try:
        os.rename(mine, shared)  # refused, atomically, while another DB is there
    except OSError as err:
        if err.errno not in (errno.ENOTEMPTY, errno.EEXIST):
            raise
        os.rename(mine, mine.with_name(mine.name + SET_ASIDE))
