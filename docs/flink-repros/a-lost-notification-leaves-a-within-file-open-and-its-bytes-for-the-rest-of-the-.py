"""A lost notification leaves a WITHIN file open, and its bytes, for the rest of the job

In WITHIN_CHECKPOINT mode Flink keeps one pool of physical files per checkpoint and
closes checkpoint c's pool on `notifyCheckpointComplete(c)` or
`notifyCheckpointAborted(c)` for that very c, or in `tryDiscardCheckpoint(c)`.
`notifyCheckpointSubsumed(k)` discards the segments of every checkpoint up to k but
calls `tryDiscardCheckpoint` with k alone. An aborted checkpoint is never subsumed, so
when its abort notification is lost, the segments go (ref count 0) while the file stays
open in c's pool, and an open file is never deleted: it stays until the manager closes
(`close()` does delete it: job end or failover). Probed directly: a 10-byte exclusive
segment of checkpoint 1, `abort(1)` lost, checkpoints 2-4 completed with watermarks 0,
2, 3: the file stays; with `notifyCheckpointSubsumed(1)` it goes. R34 asks that a later
notification cover a lost one; R31 has `complete(c', k)` close the WITHIN files of every
checkpoint up to c'. Leaked until the job ends: every byte of a checkpoint whose abort a
TM missed.

Rules: R31, R34, R15, I6.

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
JOB = jvm.org.apache.flink.api.common.JobID.fromHexString("ec67b2acc821cb4830f954b9786c1c59")


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
    builder = fm.FileMergingSnapshotManagerBuilder(JOB, resource, fm.FileMergingType.MERGE_WITHIN_CHECKPOINT)
    builder.setMaxFileSize(L(33554432))
    builder.setMaxSpaceAmplification(2.0)
    builder.setFilePoolType(fm.PhysicalFilePool.Type.NON_BLOCKING)
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
    out = {}
    for top in ("shared", "taskowned"):
        for dirpath, dirs, names in os.walk(os.path.join(BASE, top)):
            rel = os.path.relpath(dirpath, ROOT)
            if not names and not dirs:
                out.setdefault(rel, [])
            for name in names:
                out.setdefault(rel, []).append(os.path.getsize(os.path.join(dirpath, name)))
    return {d: sorted(v) for d, v in sorted(out.items())}


m = {}  # TM id -> its manager
h = {}  # handle number -> SegmentFileStateHandle
crashed = []
m['tm-1'] = manager('tm-1')
m['tm-1'].registerSubtaskForSharedStates(key('agg', 0, 2))
m['tm-1'].registerSubtaskForSharedStates(key('src', 0, 2))
m['tm-2'] = manager('tm-2')
m['tm-2'].registerSubtaskForSharedStates(key('agg', 1, 2))
m['tm-2'].registerSubtaskForSharedStates(key('src', 1, 2))
m['tm-1'].notifyCheckpointStart(key('agg', 0, 2), L(1))
m['tm-1'].notifyCheckpointStart(key('src', 0, 2), L(1))
m['tm-2'].notifyCheckpointStart(key('agg', 1, 2), L(1))
m['tm-2'].notifyCheckpointStart(key('src', 1, 2), L(1))
h[1] = write(m['tm-1'], key('agg', 0, 2), 1, EXCLUSIVE, 10)
m['tm-1'].notifyCheckpointStart(key('agg', 0, 2), L(2))
m['tm-1'].notifyCheckpointStart(key('src', 0, 2), L(2))
m['tm-2'].notifyCheckpointStart(key('agg', 1, 2), L(2))
m['tm-2'].notifyCheckpointStart(key('src', 1, 2), L(2))
m['tm-1'].notifyCheckpointComplete(key('agg', 0, 2), L(2))
m['tm-1'].notifyCheckpointComplete(key('src', 0, 2), L(2))
m['tm-2'].notifyCheckpointComplete(key('agg', 1, 2), L(2))
m['tm-2'].notifyCheckpointComplete(key('src', 1, 2), L(2))
m['tm-2'].notifyCheckpointComplete(key('agg', 1, 2), L(2))
m['tm-2'].notifyCheckpointAborted(key('agg', 1, 2), L(1))
m['tm-2'].notifyCheckpointComplete(key('src', 1, 2), L(2))
m['tm-2'].notifyCheckpointAborted(key('src', 1, 2), L(1))
m['tm-1'].notifyCheckpointStart(key('agg', 0, 2), L(3))
m['tm-1'].notifyCheckpointStart(key('src', 0, 2), L(3))
m['tm-2'].notifyCheckpointStart(key('agg', 1, 2), L(3))
m['tm-2'].notifyCheckpointStart(key('src', 1, 2), L(3))
h[2] = write(m['tm-1'], key('agg', 0, 2), 3, SHARED, 50)
h[3] = write(m['tm-2'], key('agg', 1, 2), 3, SHARED, 50)
h[4] = write(m['tm-1'], key('src', 0, 2), 3, SHARED, 50)
h[5] = write(m['tm-2'], key('src', 1, 2), 3, SHARED, 50)
m['tm-1'].notifyCheckpointComplete(key('agg', 0, 2), L(3))
m['tm-1'].notifyCheckpointSubsumed(key('agg', 0, 2), L(2))
m['tm-1'].notifyCheckpointComplete(key('src', 0, 2), L(3))
m['tm-1'].notifyCheckpointSubsumed(key('src', 0, 2), L(2))
m['tm-2'].notifyCheckpointComplete(key('agg', 1, 2), L(3))
m['tm-2'].notifyCheckpointSubsumed(key('agg', 1, 2), L(2))
m['tm-2'].notifyCheckpointComplete(key('src', 1, 2), L(3))
m['tm-2'].notifyCheckpointSubsumed(key('src', 1, 2), L(2))
m['tm-1'].notifyCheckpointStart(key('agg', 0, 2), L(4))
m['tm-1'].notifyCheckpointStart(key('src', 0, 2), L(4))
m['tm-2'].notifyCheckpointStart(key('agg', 1, 2), L(4))
m['tm-2'].notifyCheckpointStart(key('src', 1, 2), L(4))
h[6] = write(m['tm-1'], key('agg', 0, 2), 4, SHARED, 50)
h[7] = write(m['tm-2'], key('agg', 1, 2), 4, SHARED, 50)
h[8] = write(m['tm-1'], key('src', 0, 2), 4, SHARED, 50)
h[9] = write(m['tm-2'], key('src', 1, 2), 4, SHARED, 50)
m['tm-1'].notifyCheckpointComplete(key('agg', 0, 2), L(4))
m['tm-1'].notifyCheckpointSubsumed(key('agg', 0, 2), L(3))
m['tm-1'].notifyCheckpointComplete(key('src', 0, 2), L(4))
m['tm-1'].notifyCheckpointSubsumed(key('src', 0, 2), L(3))
m['tm-2'].notifyCheckpointComplete(key('agg', 1, 2), L(4))
m['tm-2'].notifyCheckpointSubsumed(key('agg', 1, 2), L(3))
m['tm-2'].notifyCheckpointComplete(key('src', 1, 2), L(4))
m['tm-2'].notifyCheckpointSubsumed(key('src', 1, 2), L(3))

found = files_by_directory()
expected = {'job-0/shared/job_ec67b2acc821cb4830f954b9786c1c59_op_25a6634263c1b1f6fc4697a04e2b9904_0_2': [50],
 'job-0/shared/job_ec67b2acc821cb4830f954b9786c1c59_op_25a6634263c1b1f6fc4697a04e2b9904_1_2': [50],
 'job-0/shared/job_ec67b2acc821cb4830f954b9786c1c59_op_548e750b9cadc2a9336fcb9bcb3362d1_0_2': [50],
 'job-0/shared/job_ec67b2acc821cb4830f954b9786c1c59_op_548e750b9cadc2a9336fcb9bcb3362d1_1_2': [50],
 'job-0/taskowned/job_ec67b2acc821cb4830f954b9786c1c59_tm_tm-1': [],
 'job-0/taskowned/job_ec67b2acc821cb4830f954b9786c1c59_tm_tm-2': []}
wrong = {
    d: (found.get(d, []), expected.get(d, []))
    for d in sorted(set(found) | set(expected))
    if found.get(d, []) != expected.get(d, [])
}
for d, (got, want) in wrong.items():
    print(f"{d}: file sizes on disk {got}, expected by the rules {want}")
print("DIVERGES" if wrong else "as the rules expect")
sys.exit(1 if wrong else 0)
