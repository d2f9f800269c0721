"""A coordinator restarted in a new process while its TMs run on (R95, issue 16).

``CheckpointCoordinator.restart`` rebuilds retention and the registry in the same object.
When the coordinator's process dies, nothing of it is left but what storage holds and what
the engine's HA services keep (Flink keeps the job id and the checkpoint id counter in
ZooKeeper or Kubernetes; here ``HaState``, which ``ha_state`` reads from a running
coordinator and the engine persists). ``resume`` builds a new coordinator from those
alone and the engine's list of running TMs:

- the checkpoint store is the job's ``chk-N/_metadata`` files on storage: each is read
  and validated (a ``MetadataError`` naming the file, before anything changes), the latest
  ``num_retained`` are retained and registered, their whole files and directories are the
  coordinator's (R42, R43);
- every other file under the job's base that no running TM records (``Holdings``) was the
  dead coordinator's (taken from a stopped attempt, R64, or handed over for a pending
  checkpoint, R43): it is the new one's, and goes unless a kept checkpoint refers to it
  (R95: nothing retained is deleted, nothing unreferenced is kept);
- every file outside the job's base is the user's (an earlier job's checkpoints given to
  the user, savepoints, another job's files): read where referenced, never deleted;
- then every subtask restarts as in a failover (R60-R62), with the epoch after the HA
  one, so each TM applies the new coordinator's duties.

A TM that is lost and may still run (R64) is not known to the new coordinator: the engine
resumes a coordinator only with every TM it knows of running or stopped.
"""

from __future__ import annotations

import re

from attrs import frozen

from fastimpl.coordinator import CheckpointCoordinator, CoordinatorEngine
from fastimpl.ids import IdSource
from fastimpl.records import ManagedDir, StoredFile
from fastimpl.storage import Storage
from spec.config import Config, VertexSpec
from spec.effects import COORDINATOR, USER
from spec.handles import FileHandle, stream_of
from spec.ids import SubtaskId, TmId
from spec.layout import METADATA, is_under, job_base
from spec.messages import Held, Holdings


@frozen
class HaState:
    """What the engine's HA services keep of a running coordinator (Flink's job id and
    checkpoint id counter): enough for ids to keep increasing (R50) and for TMs to tell
    the new coordinator's duties from the old one's."""

    job: str
    job_seq: int
    next_checkpoint: int
    epoch: int
    watermark: int


def ha_state(co: CheckpointCoordinator) -> HaState:
    return HaState(co.job, co.job_seq, co.next_checkpoint, co.epoch, co.watermark)


def resume(
    config: Config,
    vertices: tuple[VertexSpec, ...],
    storage: Storage,
    ids: IdSource,
    engine: CoordinatorEngine,
    ha: HaState,
    placement: dict[SubtaskId, TmId],
    *,
    deletion_log: bool = False,
) -> CheckpointCoordinator:
    """A new coordinator for the running job ``ha.job`` whose subtasks run where
    ``placement`` says (all those TMs alive); see the module docstring."""
    tms = sorted(set(placement.values()))
    co = CheckpointCoordinator(
        config, vertices, len(tms), storage, ids, engine, ha.job, deletion_log=deletion_log
    )
    files = storage.list_files()
    own = job_base(ha.job)
    pattern = re.compile(rf"{re.escape(own)}/chk-(\d+)/{METADATA}")
    metas = sorted((int(m.group(1)), p) for p in files if (m := pattern.fullmatch(p)) is not None)
    completed = [co.load_completed(path, ha.job) for _, path in metas]  # validated first
    keep = [d for d in completed if not d.savepoint][-config.num_retained :]
    co.job_seq = ha.job_seq
    co.next_checkpoint = ha.next_checkpoint
    co.epoch = ha.epoch
    co.watermark = ha.watermark
    co.placement = dict(placement)
    for t in tms:
        co._add_tm(t)
    for done in keep:
        co.catalog.files[done.metadata] = StoredFile(files[done.metadata], False, COORDINATOR, None)
        for e in done.entries:
            h = e.handle
            if isinstance(h, FileHandle) and h.path in files:  # R43: handed over by its ack
                co.catalog.files[h.path] = StoredFile(files[h.path], False, COORDINATOR, None)
        for d in done.directories:  # R42: a completed checkpoint's directories
            co.catalog.dir_owner[d] = COORDINATOR
            md = co.catalog.dirs.setdefault(d, ManagedDir(d, ""))  # its creator is not known
            md.handed_over = True
        co._register(done)
        co.retained.append(done)
    co.latest_completed = keep[-1].id if keep else 0
    for path, size in files.items():
        if not is_under(path, own):  # other bases and savepoints: the user's (as recover())
            co.catalog.files[path] = StoredFile(size, False, USER, None)
    referenced = {d.metadata for d in keep} | {
        s.path for d in keep for e in d.entries if (s := stream_of(e.handle)) is not None
    }
    unknown = {p for p in files if is_under(p, own) and p not in co.catalog.files}
    held: set[str] = set()
    if unknown:
        asked = tuple(sorted({p.rsplit("/", 1)[0] for p in unknown}))
        for t in tms:
            answer = engine.duty(t, Holdings(ha.job, t, asked))
            if isinstance(answer, Held):
                held |= set(answer.paths)
    for path in sorted(unknown - held):  # what no running TM holds is the coordinator's
        co.catalog.files[path] = StoredFile(files[path], False, COORDINATOR, None)
        if path not in referenced:  # R95: what the dead coordinator held for nothing goes
            co.catalog.delete_file(path, COORDINATOR)
    co.failover()
    return co
