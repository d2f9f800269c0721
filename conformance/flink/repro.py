"""A divergence as a Java-free Python script against the ``apache-flink`` package: the Flink
calls the adapter made (``FlinkSession.calls``), then the files Flink left on disk against
the files the rules expect, per managed directory. It exits 1 while Flink diverges."""

from __future__ import annotations

import pprint
import textwrap

from spec.config import Config, MergingMode

HEADER = '''\
"""{title}

{body}

Reproduction for Apache Flink 2.3.0's FileMergingSnapshotManager, written by
`make conformance-flink` (ckpt-ownership, conformance/flink). Needs only
`pip install apache-flink==2.3.0` and Java 17: every call goes through the py4j gateway
that pyflink starts; no I/O executor is set, so deletes run inside the call.
Exit status 1 while the files on disk differ from what the rules expect.
"""

import hashlib
import os
import sys
import tempfile

from pyflink.java_gateway import get_gateway

jvm = get_gateway().jvm
fm = jvm.org.apache.flink.runtime.checkpoint.filemerging
scope = jvm.org.apache.flink.runtime.state.CheckpointedStateScope
SHARED, EXCLUSIVE = scope.SHARED, scope.EXCLUSIVE
ROOT = tempfile.mkdtemp(prefix="flink-repro-")
BASE = os.path.join(ROOT, "job-0")
JOB = jvm.org.apache.flink.api.common.JobID.fromHexString("{job_hex}")


def L(n):  # a java.lang.Long: py4j would send a small int as an Integer
    return jvm.java.lang.Long.valueOf(str(n))


def jlist(*items):
    out = jvm.java.util.ArrayList()
    for item in items:
        out.add(item)
    return out


def key(vertex, index, parallelism):
    """A subtask's key as a task builds it: job and vertex ids in hex."""
    vertex_id = hashlib.sha256(vertex.encode()).hexdigest()[:32]
    subtask_key = fm.FileMergingSnapshotManager.SubtaskKey
    return subtask_key(JOB.toHexString(), vertex_id, index, parallelism)


def manager(tm):
    """One TM's manager, as the TaskExecutor builds it for a job."""
    resource = jvm.org.apache.flink.runtime.clusterframework.types.ResourceID(tm)
    builder = fm.FileMergingSnapshotManagerBuilder(JOB, resource, fm.FileMergingType.{kind})
    builder.setMaxFileSize(L({max_file_size}))
    builder.setMaxSpaceAmplification({amplification})
    builder.setFilePoolType(fm.PhysicalFilePool.Type.{pool})
    mgr = builder.build()
    path = jvm.org.apache.flink.core.fs.Path
    local = jvm.org.apache.flink.core.fs.local.LocalFileSystem.getSharedInstance()
    mgr.initFileSystem(local, path(BASE), path(BASE + "/shared"), path(BASE + "/taskowned"), 4096)
    return mgr


def write(mgr, subtask, checkpoint, scope, size):
    """A state stream of `size` bytes: its SegmentFileStateHandle (None when empty)."""
    stream = mgr.createCheckpointStateOutputStream(subtask, L(checkpoint), scope)
    if size:
        stream.write(bytearray(size))
    return stream.closeAndGetHandle()


def partial(mgr, subtask, checkpoint, scope, size):
    """A stream a crashing TM wrote `size` bytes to and never closed."""
    stream = mgr.createCheckpointStateOutputStream(subtask, L(checkpoint), scope)
    stream.write(bytearray(size))
    stream.flush()
    return stream


def delete_as_jobmanager(relative):
    """What the JobManager deletes (a directory handed over to it): done here by hand."""
    os.remove(os.path.join(ROOT, relative))


def files_by_directory():
    out = {{}}
    for top in ("shared", "taskowned"):
        for dirpath, dirs, names in os.walk(os.path.join(BASE, top)):
            rel = os.path.relpath(dirpath, ROOT)
            if not names and not dirs:
                out.setdefault(rel, [])
            for name in names:
                out.setdefault(rel, []).append(os.path.getsize(os.path.join(dirpath, name)))
    return {{d: sorted(v) for d, v in sorted(out.items())}}


m = {{}}  # TM id -> its manager
h = {{}}  # handle number -> SegmentFileStateHandle
crashed = []
'''

FOOTER = """
found = files_by_directory()
expected = {expected}
wrong = {{
    d: (found.get(d, []), expected.get(d, []))
    for d in sorted(set(found) | set(expected))
    if found.get(d, []) != expected.get(d, [])
}}
for d, (got, want) in wrong.items():
    print(f"{{d}}: file sizes on disk {{got}}, expected by the rules {{want}}")
print("DIVERGES" if wrong else "as the rules expect")
sys.exit(1 if wrong else 0)
"""


def script(
    title: str,
    body: str,
    config: Config,
    job_hex: str,
    calls: list[str],
    expected: dict[str, list[int]],
) -> str:
    kind = (
        "MERGE_ACROSS_CHECKPOINT"
        if config.merging_mode is MergingMode.ACROSS_CHECKPOINT
        else "MERGE_WITHIN_CHECKPOINT"
    )
    head = HEADER.format(
        title=title,
        body="\n\n".join(textwrap.fill(p, 88) for p in body.split("\n\n")),
        job_hex=job_hex,
        kind=kind,
        max_file_size=config.max_file_size,
        amplification=float(config.max_space_amplification),
        pool="BLOCKING" if config.pool_blocking else "NON_BLOCKING",
    )
    shown = pprint.pformat(expected, width=88)
    return head + "\n".join(calls) + "\n" + FOOTER.format(expected=shown)
