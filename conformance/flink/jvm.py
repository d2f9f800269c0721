"""Flink's classes through the py4j gateway that pyflink starts (Java 17): one JVM per run.

pyflink is imported here, lazily, so that the conformance package never needs it."""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Iterable
from typing import Any

from spec.config import Config, MergingMode, Scope
from spec.ids import SubtaskId

FM = "org.apache.flink.runtime.checkpoint.filemerging"


class Jvm:
    """The gateway and the few Flink classes the adapter calls."""

    def __init__(self) -> None:
        from pyflink.java_gateway import get_gateway

        self.gateway: Any = get_gateway()
        self.jvm: Any = self.gateway.jvm
        fm = self.jvm.org.apache.flink.runtime.checkpoint.filemerging
        self.fm: Any = fm
        self.subtask_key: Any = fm.FileMergingSnapshotManager.SubtaskKey
        self.path: Any = self.jvm.org.apache.flink.core.fs.Path
        self.fs: Any = self.jvm.org.apache.flink.core.fs.local.LocalFileSystem.getSharedInstance()
        scope = self.jvm.org.apache.flink.runtime.state.CheckpointedStateScope
        self.scopes: dict[Scope, Any] = {
            Scope.SHARED: scope.SHARED,
            Scope.EXCLUSIVE: scope.EXCLUSIVE,
        }

    def long(self, n: int) -> Any:
        """A ``java.lang.Long``: py4j sends a small Python int as an ``Integer``, which
        picks the wrong overload or fails where Flink takes a ``long``."""
        return self.jvm.java.lang.Long.valueOf(str(n))

    def list(self, items: Iterable[Any]) -> Any:
        out = self.jvm.java.util.ArrayList()
        for item in items:
            out.add(item)
        return out

    def manager(self, job_hex: str, tm: str, config: Config) -> Any:
        """A new manager for TM ``tm`` of the job, built as Flink's TaskExecutor builds
        it; no I/O executor, so deletes run inside the call that causes them."""
        kind = (
            self.fm.FileMergingType.MERGE_ACROSS_CHECKPOINT
            if config.merging_mode is MergingMode.ACROSS_CHECKPOINT
            else self.fm.FileMergingType.MERGE_WITHIN_CHECKPOINT
        )
        job = self.jvm.org.apache.flink.api.common.JobID.fromHexString(job_hex)
        resource = self.jvm.org.apache.flink.runtime.clusterframework.types.ResourceID(tm)
        builder = self.fm.FileMergingSnapshotManagerBuilder(job, resource, kind)
        builder.setMaxFileSize(self.long(config.max_file_size))
        builder.setMaxSpaceAmplification(float(config.max_space_amplification))
        pool = self.fm.PhysicalFilePool.Type
        builder.setFilePoolType(pool.BLOCKING if config.pool_blocking else pool.NON_BLOCKING)
        return builder.build()

    def key(self, job_hex: str, subtask: SubtaskId) -> Any:
        """Flink's ``SubtaskKey`` as a task builds it: the job's and the vertex's ids in
        hex (a ``JobVertexID``), so that no vertex name reaches a path (FLINK-35778)."""
        return self.subtask_key(job_hex, hex_id(subtask.vertex), subtask.index, subtask.parallelism)


def hex_id(name: str) -> str:
    """A Flink id (``JobID``, ``JobVertexID``: 32 hex digits) for one of our names."""
    return hashlib.sha256(name.encode()).hexdigest()[:32]


@functools.cache
def shared_jvm() -> Jvm:
    """The one gateway of this Python process."""
    return Jvm()
