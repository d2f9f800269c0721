"""After a run: the storage audit (``pipeline.spark_audit``) of every job base the run
wrote, on the run's own SparkSession, with no grace period (the run is quiet: every
checkpoint completed or aborted, every notice delivered, every decided delete done), so
any unreferenced file is an orphan.

A rescale or a driver restart starts a new job under the same root (``job-1``, ...): each
is audited. An old job a CLAIM restore took over may be empty (its files were deleted once
subsumed): nothing to audit there, and no Spark job is run to say so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from attrs import frozen


@frozen
class JobAudit:
    job: str
    files: int
    checkpoints: int
    references: int
    orphans: int
    dangling: int
    corrupt_metadata: int
    verdict: str

    @property
    def clean(self) -> bool:
        return self.orphans == 0 and self.dangling == 0 and self.corrupt_metadata == 0


def audit_jobs(
    spark: Any, base: str, jobs: Sequence[str], storage_options: Mapping[str, Any] | None = None
) -> list[JobAudit]:
    """Audit ``<base>/<job>`` for every job of the run (in order)."""
    import fsspec  # type: ignore[import-untyped]

    from pipeline.location import Location
    from pipeline.spark_audit import audit_spark

    opts = dict(storage_options or {})
    fs, root = fsspec.core.url_to_fs(base, **opts)
    out: list[JobAudit] = []
    for job in dict.fromkeys(jobs):
        path = f"{str(root).rstrip('/')}/{job}"
        if not fs.exists(path) or not fs.find(path):
            out.append(JobAudit(job, 0, 0, 0, 0, 0, 0, "empty (nothing left to audit)"))
            continue
        url = f"{base.rstrip('/')}/{job}"
        s = audit_spark(spark, Location.parse(url, opts), grace=0.0).summary
        out.append(
            JobAudit(
                job,
                s.files,
                s.checkpoints,
                s.references,
                s.orphans,
                s.dangling,
                s.corrupt_metadata,
                s.verdict,
            )
        )
    return out
