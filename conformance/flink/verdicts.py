"""The verdict on each kind of divergence (``judge.signature``), after reading the minimal
sequence, Flink 2.3's code and our rules. A signature not listed here is reported as
unclassified: it needs a look before it counts as anything."""

from __future__ import annotations

from attrs import frozen

FLINK_BUG = "Flink bug"
DELIBERATE = "deliberate difference (We)"
ADAPTER = "limit of the adapter"
UNCLASSIFIED = "unclassified"


@frozen
class Verdict:
    kind: str
    rules: str
    """The rules (and invariants) the divergence is about."""
    title: str
    text: str
    """What happens, what is lost or leaked, and why this verdict."""


ROLL = Verdict(
    DELIBERATE,
    "R12",
    "A merged file takes one segment past max_file_size",
    "Flink checks a pooled file's size after a segment is written: the file is returned to "
    "the pool while it is under `max_file_size`, so the segment that crosses the size goes "
    "into it and the file ends larger than the bound (Flink cannot know a stream's size "
    "before it is written). R12 rolls to a new file before a segment would cross the size "
    "(our streams hold their bytes until closed, so the size is known). Nothing is lost or "
    "leaked; only the file boundaries differ.",
)

CRASH = Verdict(
    ADAPTER,
    "R65",
    "A crash in the middle of a stream leaves no bytes on Flink's disk",
    "The model's crash point has `written` bytes durable in the file. Flink's "
    "`FileMergingCheckpointStateOutputStream` keeps up to its write buffer (4096 bytes here) "
    "in memory and `flush()` does not push them to the physical file, so a crash before the "
    "buffer fills leaves nothing (no file, or the pooled file without the partial bytes). "
    "The adapter cannot reach the model's crash point through the stream's API without "
    "closing the stream. Nothing is lost or leaked: Flink leaves less than the model.",
)

FAILOVER_LEAK = Verdict(
    FLINK_BUG,
    "R62 (We), I6; FLIP-306 §4.8",
    "Files of a checkpoint in flight at a failover are never deleted",
    "A subtask writes state for a checkpoint that has not completed, then the job fails "
    "over. Flink closes the TM's manager and builds a new one (FLINK-35400) that restores "
    "from the latest completed checkpoint; neither deletes the segments the in-flight "
    "checkpoint wrote: the old manager's `close()` keeps them (the checkpoint is neither "
    "aborted nor subsumed), and the new manager never learns of them, so no later "
    "notification can discard them. They stay in the subtask's `shared/` and the TM's "
    "`taskowned/` directory for as long as the directory lives, which for a running job is "
    "forever (the storage audit of real Flink 2.3 checkpoints, `docs/foreign-audit.md`, "
    "finds a killed and restarted job's in-flight SSTs still in `shared/`). FLIP-306 §4.8 "
    "promises a best-effort cleanup of such files; our R62 deletes them at the restart, "
    "keeping every file any retained checkpoint uses. Leaked: every byte written for the "
    "checkpoints in flight at each failover.",
)

CANCEL_LEAK = Verdict(
    FLINK_BUG,
    "R90, R34, I6; FLINK-32086",
    "A job that ends with a checkpoint in flight leaves its files",
    "A subtask writes state for a checkpoint that is still pending, then the job ends "
    "(cancel). The manager's `close()` deletes the managed directories only when no "
    "checkpoint in flight refers to them, and it does not discard what in-flight "
    "checkpoints wrote: unless the abort notification reaches the task before it closes "
    "(R34: a notification may be lost or late, and a task being cancelled may not run it), "
    "the segment files and their directories stay for good. Probed directly: with "
    "`notifyCheckpointAborted` before `close()` everything goes; with `close()` alone the "
    "files stay. The storage audit of real Flink 2.3 checkpoints (`docs/foreign-audit.md`) "
    "finds the same after a clean cancel during a checkpoint: its SSTs stay in `shared/`. "
    "R90 has each TM discard at job end what no retained checkpoint references.",
)

EAGER_DISCARD = Verdict(
    DELIBERATE,
    "R31, R34",
    "Output never acknowledged is discarded at a later completion",
    "A subtask wrote state for checkpoint c and never acknowledged it; a later checkpoint "
    "completes. On `complete(c', k)` our TM discards what it wrote and never acknowledged "
    "for checkpoints up to c' (it cannot be part of any completed checkpoint). Flink's "
    "manager is not told about acknowledgements: it keeps those segments until "
    "`notifyCheckpointAborted(c)` or a subsume watermark at or past c, which a later "
    "completion brings (R34), so they go one checkpoint later. In ACROSS mode the bytes "
    "stay anyway while the pooled file is open (see R81). No loss, and a delay when c's "
    "own notification arrives; when it is lost, WITHIN mode leaves the file open for good "
    "(*A lost notification leaves a WITHIN file open*, below).",
)

DECLINE = Verdict(
    DELIBERATE,
    "R14, R32",
    "A decline does not discard the subtask's output",
    "Our subtask discards what it wrote for a checkpoint when it declines it, and closes its "
    "WITHIN file. Flink's manager has no call for a decline: the bytes go when the abort "
    "notification (or a later watermark) arrives. No loss; a delay.",
)

OPEN_POOL = Verdict(
    DELIBERATE,
    "R81 (We), R80",
    "An ACROSS pool keeps dead bytes while the file is open",
    "The segments of an aborted checkpoint are discarded, but their physical file is still "
    "open in the ACROSS pool: Flink deletes and bounds only closed files, so the dead bytes "
    "stay and the file goes on taking segments up to `max_file_size` (BRIEF §7 measured "
    "109x amplification). R81 closes and rolls an open pooled file as soon as its "
    "amplification passes the bound, and deletes it at ref count 0. Flink's behaviour is "
    "bounded by `max_file_size`, not a permanent leak.",
)

AMPLIFICATION = Verdict(
    DELIBERATE,
    "R80, R81 (We), R20",
    "Space amplification is bounded per file, not per TM",
    "R80 marks a file not reusable when its own size over its live bytes passes "
    "`max_space_amplification` (and R81 rolls an open pooled one); the next reuse of its "
    "live segments uploads them again. Flink's `controlSpace` compares the manager's total "
    "physical bytes with its total live bytes and only then marks closed files with the "
    "most dead bytes, so a single bloated file below the TM-wide ratio stays reusable and "
    "Flink reuses where we upload again. Which closed files Flink marks among files with "
    "as many dead bytes is the iteration order of a hash set of its file objects, so one "
    "corpus case (`r20-reuse-from-file-no-longer-reusable-uploads-again-merg-2`) passes in "
    "some runs and diverges in others (6 of 8 in a probe): the counts above may move by "
    "one between runs. No loss; Flink keeps more dead bytes.",
)

ZOMBIE = Verdict(
    DELIBERATE,
    "R64 (We)",
    "A replaced attempt's files are deleted before the attempt is known to have stopped",
    "A TM is lost and the job fails over; its subtasks' new attempt restores the files the "
    "lost TM wrote and, once they are subsumed, Flink's new manager deletes them at once "
    "(they are under its managed directory, so it owns them). R64 keeps a lost attempt's "
    "files pending until the attempt is known to have stopped, since a zombie may still "
    "write into them (on an object store a late write recreates a deleted object and leaks "
    "it). No retained checkpoint refers to the deleted files: nothing is lost here.",
)

LOST_NOTICE = Verdict(
    FLINK_BUG,
    "R31, R34, R15, I6",
    "A lost notification leaves a WITHIN file open, and its bytes, for the rest of the job",
    "In WITHIN_CHECKPOINT mode Flink keeps one pool of physical files per checkpoint and "
    "closes checkpoint c's pool on `notifyCheckpointComplete(c)` or "
    "`notifyCheckpointAborted(c)` for that very c, or in `tryDiscardCheckpoint(c)`. "
    "`notifyCheckpointSubsumed(k)` discards the segments of every checkpoint up to k but "
    "calls `tryDiscardCheckpoint` with k alone. An aborted checkpoint is never subsumed, so "
    "when its abort notification is lost, the segments go (ref count 0) while the file "
    "stays open in c's pool, and an open file is never deleted: it stays until the manager "
    "closes (`close()` does delete it: job end or failover). Probed directly: a 10-byte "
    "exclusive segment of checkpoint 1, `abort(1)` lost, checkpoints 2-4 completed with "
    "watermarks 0, 2, 3: the file stays; with `notifyCheckpointSubsumed(1)` it goes. R34 "
    "asks that a later notification cover a lost one; R31 has `complete(c', k)` close the "
    "WITHIN files of every checkpoint up to c'. Leaked until the job ends: every byte of a "
    "checkpoint whose abort a TM missed.",
)

REUSE_BASELINE = Verdict(
    ADAPTER,
    "R20, R21, R23",
    "Shared state the latest completed checkpoint left out is reused",
    "A subtask uploads shared state for checkpoint 1, which completes; its acknowledgement of "
    "checkpoint 2 leaves that name out; it reuses the name for checkpoint 4 and, once it has "
    "learned that 2 completed, for 5. Our TM reuses the checkpoint-1 segment at 5: R23 keeps "
    "the name past `complete(2)` because checkpoint 4, newer, reused it, and R20 holds (it "
    "came from checkpoint 1, which the TM knows completed, and its segment, whose last use the "
    "reuse for 4 advanced (R21), is live in a reusable file). The adapter makes the state "
    "backend's choice as Flink 2.3's RocksDB incremental strategy does: the baseline is the "
    "SST list of the last checkpoint the backend learned completed "
    "(`RocksIncrementalSnapshotStrategy.snapshotMetaData`: "
    "`uploadedSstFiles.tailMap(lastCompletedCheckpoint)`; `PreviousSnapshot."
    "pruneFirstCheckpointSstFiles` starts from that checkpoint's list and only removes from "
    "it); checkpoint 2's list has nothing of the subtask, so the bytes are uploaded again: a "
    "new file in checkpoint 5's WITHIN pool. Flink's manager agrees with the model: probed, "
    "`couldReusePreviousStateHandle` of the checkpoint-1 handle is true at that step "
    "(`reusePreviousStateHandle` for 4 advanced its last used checkpoint), and with the "
    "backend offering that handle the minimal sequence passes and quiesces clean. A RocksDB "
    "cannot have this history: each snapshot, taken in checkpoint order, hard-links every "
    "live SST file of the database (`takeDBNativeCheckpoint`) and an SST file once gone never "
    "comes back (its number is not reused), so a file in checkpoints 1 and 4 is in checkpoint "
    "2's list and Flink would reuse it at 5 as we do; our machine draws each checkpoint's "
    "state on its own. Nothing is lost or leaked: the new copy is checkpoint 5's and goes "
    "with it (the minimal sequence, quiesced, leaves nothing; the live sequence that leaks "
    "once quiet does so through its failovers). Not emulated, so shown nowhere: the pruning "
    "also drops a name a later checkpoint uploaded again (the notification of the earlier "
    "one came late), where our TM reuses the earlier, confirmed handle (R23) and Flink "
    "uploads once more, a history a RocksDB can have.",
)

VERDICTS: dict[tuple[str, str, str], Verdict] = {
    **{("*", cmd, f"missing+size in {d}"): ROLL
       for cmd in ("WriteState", "ReuseShared") for d in ("shared", "taskowned")},
    **{("*", "CrashDuringWrite", f"{k} in {d}"): CRASH
       for k in ("missing", "size", "missing+size") for d in ("shared", "taskowned")},
    **{("*", cmd, f"kept in {d}"): FAILOVER_LEAK
       for cmd in ("Failover", "RestartCoordinator")
       for d in ("shared", "taskowned", "shared+taskowned")},
    **{("*", "Cancel", f"kept in {d}"): CANCEL_LEAK
       for d in ("shared", "taskowned", "shared+taskowned")},
    **{("*", "DeliverNotification:complete", f"kept in {d}"): EAGER_DISCARD
       for d in ("shared", "taskowned", "shared+taskowned")},
    **{("*", "Decline", f"kept in {d}"): DECLINE for d in ("shared", "taskowned")},
    ("across", "DeliverNotification:abort", "kept in shared"): OPEN_POOL,
    ("across", "DeliverNotification:abort", "kept in taskowned"): OPEN_POOL,
    ("across", "DeliverNotification:abort", "kept in shared+taskowned"): OPEN_POOL,
    ("*", "ReuseShared", "missing in shared"): AMPLIFICATION,
    ("*", "ReuseShared", "size in shared"): AMPLIFICATION,
    ("within", "ReuseShared", "extra in shared"): REUSE_BASELINE,
    ("*", "DeliverNotification:complete", "deleted in shared"): ZOMBIE,
}  # fmt: skip
"""(merging mode or ``*``, command, kinds) -> verdict."""


def verdict(signature: tuple[str, str, str]) -> Verdict:
    mode, command, kinds = signature
    for key in (signature, ("*", command, kinds)):
        if key in VERDICTS:
            return VERDICTS[key]
    return Verdict(UNCLASSIFIED, "", f"{command}: {kinds} ({mode})", "Not looked at yet.")


QUIET_CLASSES = {
    "failover": FAILOVER_LEAK,
    "cancel": CANCEL_LEAK,
    "open pool": OPEN_POOL,
    "lost notification": LOST_NOTICE,
}
"""What a sequence that leaves Flink not quiet (judge.quiet) is, by ``quiet_class``."""


def quiet_class(mode: str, command_names: set[str]) -> str:
    """The likely cause of a leak once quiet, from the shrunk sequence: a failover or a job
    end in it; otherwise, in ACROSS mode, the open pool; otherwise a lost notification."""
    if command_names & {"Failover", "RestartCoordinator"}:
        return "failover"
    if "Cancel" in command_names:
        return "cancel"
    if mode == "across":
        return "open pool"
    if "DropNotification" in command_names:
        return "lost notification"
    return "other"


def quiet_verdict(cls: str) -> Verdict:
    return QUIET_CLASSES.get(
        cls, Verdict(UNCLASSIFIED, "I6", f"A leak once quiet ({cls})", "Not looked at yet.")
    )
