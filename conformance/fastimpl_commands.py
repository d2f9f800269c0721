"""Spec commands as calls on fastimpl's parties: the translation the conformance suite,
the lockstep machine, the traces and the refusal checks drive the product through.

The product has no command dispatcher, no fault commands and no test flags: its calls
are typed and carry real bytes. What a command says beyond a call is done here:
``WriteState`` and a re-upload by ``ReuseShared`` write zeros of the stated size (the
model knows sizes, not bytes); ``FailNextCall`` arms the storage's one fault seam;
``DropNotification`` and ``DuplicateNotification`` act on the transport (the network,
not the product); ``CrashDuringWrite`` stands for a TM process killed half-way through
an append. Each is recorded in the engine's trace as the command it is.
"""

from __future__ import annotations

from conformance.compare import unmarked
from fastimpl.checkpoint_lifecycle import CompletionFailed
from fastimpl.engine import InProcessEngine
from fastimpl.storage import StorageFault
from spec import commands as c
from spec.errors import CommandError, Reason
from spec.handles import StreamHandle
from spec.ids import SubtaskId


def _zeros(stream: StreamHandle) -> bytes:
    return bytes(stream.length)


def _as_named(engine: InProcessEngine, path: str) -> str:
    """The file on storage the model's ``path`` names: the model draws names without the
    creator's mark the product's parties add (``conformance.compare.unmarked``); a path
    nothing on storage answers to is passed on as it is, for the product to refuse."""
    head = path.rsplit("/", 1)[0]
    try:
        listed = engine.storage.files_under(head)
    except Exception:  # a failing listing: the product meets the path as given
        return path
    named = [p for p in sorted(listed) if p != path and unmarked(p) == path]
    return named[0] if len(named) == 1 and path not in listed else path


def _state_named(engine: InProcessEngine, subtask: SubtaskId, name: str) -> str:
    """The shared state ``name`` of ``subtask`` as the product's parties name it: a
    database's small file uploaded as shared state is named after the file (R103), whose
    name carries its creator's mark in the product (``_as_named``)."""
    named = {
        n
        for party in engine.parties.values()
        for (s, n) in party.backend
        if s == subtask and n != name and unmarked(n) == name
    }
    return named.pop() if len(named) == 1 else name


def apply(engine: InProcessEngine, cmd: c.Command) -> None:
    """Run ``cmd`` on ``engine``; raise ``CommandError`` (nothing changed) if it is
    refused. A storage fault the command meets is the command's outcome, not an error:
    the subtask declined (R17), as the model has it."""
    try:
        _apply(engine, cmd)
    except StorageFault:
        if not isinstance(cmd, c.WriteState | c.ReuseShared):
            raise


def _apply(engine: InProcessEngine, cmd: c.Command) -> None:
    match cmd:
        case c.Trigger():
            engine.trigger(cmd.savepoint)
        case c.WriteState():
            data = bytes(cmd.size)
            engine.write(
                cmd.checkpoint, cmd.subtask, cmd.kind, cmd.name, data, cmd.entries, cmd.attempt
            )
        case c.ReuseShared():
            name = _state_named(engine, cmd.subtask, cmd.name)
            engine.reuse_shared(cmd.checkpoint, cmd.subtask, name, cmd.attempt, _zeros)
        case c.Acknowledge():
            engine.acknowledge(cmd.checkpoint, cmd.subtask, cmd.attempt)
        case c.Decline():
            engine.decline(cmd.checkpoint, cmd.subtask)
        case c.Complete():
            try:
                engine.complete(cmd.checkpoint)
            except CompletionFailed:
                pass  # R51: it aborted instead, as the model's Complete does
        case c.Abort():
            engine.abort(cmd.checkpoint)
        case c.DeliverNotification():
            engine.deliver(cmd.index)
        case c.DropNotification():
            engine.recorded(cmd, lambda: _on_channel(engine, cmd))
        case c.DuplicateNotification():
            engine.recorded(cmd, lambda: _on_channel(engine, cmd))
        case c.CrashTm():
            engine.crash_tm(cmd.tm)
        case c.AttemptStopped():
            engine.attempt_stopped(cmd.tm)
        case c.CrashDuringWrite():
            engine.recorded(cmd, lambda: _crash_during_write(engine, cmd))
        case c.Failover():
            engine.failover()
        case c.ReplaceTm():
            engine.replace_tm(cmd.tm)
        case c.RestartCoordinator():
            engine.restart()
        case c.Restore():
            engine.restore(
                cmd.checkpoint, cmd.parallelism, cmd.mode, cmd.max_parallelism, cmd.num_tms
            )
        case c.FailNextCall():
            engine.recorded(cmd, lambda: engine.storage.arm(cmd.op))
        case c.RetryDeletes():
            engine.retry_deletes()
        case c.Cancel():
            engine.cancel(cmd.retain)
        case c.WriteWorking():
            engine.write_working(cmd.subtask, bytes(cmd.size), cmd.attempt)
        case c.DropWorking():
            engine.drop_working(cmd.subtask, _as_named(engine, cmd.path), cmd.attempt)
        case c.SnapshotWorking():
            engine.snapshot_working(cmd.checkpoint, cmd.subtask, cmd.inline_below, cmd.attempt)
        case c.CollectWorking():
            engine.collect_working()
        case _:
            raise CommandError(Reason.BAD_ARGUMENT, f"unknown command {cmd!r}")


def _on_channel(engine: InProcessEngine, cmd: c.DropNotification | c.DuplicateNotification) -> None:
    """The network loses or repeats a notice in flight, once the engine's guards let it."""
    engine.check(cmd)
    if isinstance(cmd, c.DropNotification):
        engine.channel.drop(cmd.index)
    else:
        engine.channel.duplicate(cmd.index)


def _crash_during_write(engine: InProcessEngine, cmd: c.CrashDuringWrite) -> None:
    """R65: the TM's process dies after ``written`` of ``size`` bytes reached storage;
    the half-written bytes stay with the crashed attempt, and the TM is lost."""
    engine.check(cmd)
    tm = engine.acting(cmd.subtask, None)
    party = engine.parties[tm]
    party.note(cmd.checkpoint, engine.coord._is_savepoint(cmd.checkpoint))
    try:
        party._write_stream(
            cmd.subtask,
            cmd.checkpoint,
            cmd.kind,
            cmd.name,
            cmd.size,
            1,
            bytes(cmd.written),
            partial=True,
        )
    except StorageFault:
        pass  # the process died here
    engine.coord.lose(tm)
