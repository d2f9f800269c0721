"""A fastimpl command trace (NDJSON, ``fastimpl/trace.py``) as a TLA+ trace-validation
model: ``tla/TraceCheck.tla`` replays it through ``CheckpointOwnership.tla``, where TLC runs.

    python -m model_tests.trace_tla TRACE.ndjson --name MCTraceRun --out tla/
    python -m model_tests.trace_tla --example --out tla/   # writes tla/MCTrace.{tla,cfg}

The trace must lie inside the TLA+ spec's abstraction, and the converter refuses any
other trace with a ``TraceOutsideModel`` naming the first line that leaves it: one vertex;
its state written as one piece of KEYED_SHARED state per subtask, always of the same size
(the spec's ``SegSize``); crashes mid-write always leaving the same number of bytes
(``PartialSize``); no armed storage faults and no coordinator restart; a restore keeps the
vertex and may change its parallelism. Refused commands are left out (they changed
nothing); a command that failed on storage (``fault``, ``real_faults``) is outside the
model.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from attrs import frozen

from spec import codec
from spec import commands as c
from spec.config import Config, JobSpec, MergingMode, RestoreMode, StateKind

MODES = {
    MergingMode.NONE: "NONE",
    MergingMode.WITHIN_CHECKPOINT: "WITHIN",
    MergingMode.ACROSS_CHECKPOINT: "ACROSS",
}
FIELDS = ("cmd", "i", "c", "t", "p", "mode", "retain")


class TraceOutsideModel(ValueError):
    """The trace does something the TLA+ spec does not model."""


@frozen
class TlaTrace:
    module: str
    cfg: str
    records: int


def _tm(tm: str, where: str) -> int:
    if not tm.startswith("tm-") or not tm[3:].isdigit():
        raise TraceOutsideModel(f"{where}: TM id {tm!r} is not tm-<n> as the spec numbers TMs")
    return int(tm[3:])


def _record(cmd: c.Command, where: str, sizes: set[int], partial: set[int]) -> dict[str, Any]:
    r: dict[str, Any] = {"cmd": type(cmd).__name__, "i": 0, "c": 0, "t": 0, "p": 0}
    r["mode"], r["retain"] = "NO_CLAIM", False
    match cmd:
        case c.Trigger(savepoint=True):
            raise TraceOutsideModel(f"{where}: savepoints are not modelled")
        case c.Trigger():
            pass
        case c.WriteState():
            if cmd.kind is not StateKind.KEYED_SHARED:
                raise TraceOutsideModel(f"{where}: {cmd.kind.value} state is not modelled")
            sizes.add(cmd.size)
            r.update(i=cmd.subtask.index, c=cmd.checkpoint)
            r["t"] = _tm(cmd.attempt, where) if cmd.attempt else 0
        case c.ReuseShared(attempt=None):
            r.update(i=cmd.subtask.index, c=cmd.checkpoint)
        case c.Acknowledge():
            r.update(i=cmd.subtask.index, c=cmd.checkpoint)
            r["t"] = _tm(cmd.attempt, where) if cmd.attempt else 0
        case c.Decline():
            r.update(i=cmd.subtask.index, c=cmd.checkpoint)
        case c.Complete() | c.Abort():
            r["c"] = cmd.checkpoint
        case c.DeliverNotification() | c.DropNotification() | c.DuplicateNotification():
            pass
        case c.CrashTm() | c.AttemptStopped() | c.ReplaceTm():
            r["t"] = _tm(cmd.tm, where)
        case c.CrashDuringWrite():
            if cmd.kind is not StateKind.KEYED_SHARED:
                raise TraceOutsideModel(f"{where}: {cmd.kind.value} state is not modelled")
            partial.add(cmd.written)
            r.update(i=cmd.subtask.index, c=cmd.checkpoint)
        case c.Failover():
            pass
        case c.Restore():
            if cmd.max_parallelism is not None:
                raise TraceOutsideModel(f"{where}: the TLA+ spec has no max parallelism (R77)")
            if cmd.num_tms is not None:
                raise TraceOutsideModel(f"{where}: every job of the TLA+ spec has NumTms TMs")
            r["c"] = cmd.checkpoint
            r["mode"] = "CLAIM" if cmd.mode is RestoreMode.CLAIM else "NO_CLAIM"
        case c.Cancel():
            r["retain"] = cmd.retain
        case _:
            raise TraceOutsideModel(f"{where}: {type(cmd).__name__} is not modelled")
    return r


def _tla_value(v: object) -> str:
    if isinstance(v, bool):
        return "TRUE" if v else "FALSE"
    if isinstance(v, int):
        return str(v)
    return json.dumps(v)


def convert(lines: Iterable[str], name: str = "MCTrace") -> TlaTrace:
    """The module (``name``.tla, EXTENDS TraceCheck) and config of a trace."""
    it = iter(enumerate(lines, 1))
    try:
        _, first = next(it)
    except StopIteration:
        raise TraceOutsideModel("empty trace: no header line") from None
    head = json.loads(first)
    config: Config = codec.decode(Config, head.get("config"), "$.config")
    job: JobSpec = codec.decode(JobSpec, head.get("job"), "$.job")
    if len(job.vertices) != 1:
        raise TraceOutsideModel(f"line 1: {len(job.vertices)} vertices; the spec models one")
    vertex = job.vertices[0].name
    if float(config.max_space_amplification) != int(config.max_space_amplification):
        raise TraceOutsideModel("line 1: max_space_amplification must be a whole number")
    sizes: set[int] = set()
    partial: set[int] = set()
    records: list[dict[str, Any]] = []
    pars = {job.vertices[0].parallelism}
    max_checkpoint = 0
    tms = {job.num_tms}
    restores = 0
    for n, text in it:
        if not text.strip():
            continue
        line = json.loads(text)
        where = f"line {n}"
        if line.get("real_faults"):
            raise TraceOutsideModel(f"{where}: the file system failed; faults are not modelled")
        if line.get("outcome") == "refused":
            continue
        if line.get("outcome") != "ok":
            raise TraceOutsideModel(f"{where}: outcome {line.get('outcome')!r} is not modelled")
        cmd = codec.decode_command(line.get("command"), f"{where}.command")
        sub = getattr(cmd, "subtask", None)
        if sub is not None and sub.vertex != vertex:
            raise TraceOutsideModel(f"{where}: vertex {sub.vertex!r}; the spec has {vertex!r}")
        r = _record(cmd, where, sizes, partial)
        if isinstance(cmd, c.Restore):
            par = dict(cmd.parallelism)
            if set(par) - {vertex}:
                raise TraceOutsideModel(f"{where}: restore names vertices {sorted(par)}")
            r["p"] = par.get(vertex, 0)
            restores += 1
        if r["p"]:
            pars.add(r["p"])
        max_checkpoint = max(max_checkpoint, r["c"])
        if r["t"]:
            tms.add(r["t"])
        records.append(r)
        if len(sizes) > 1 or len(partial) > 1:
            raise TraceOutsideModel(f"{where}: writes of different sizes; the spec has one")
    if not records:
        raise TraceOutsideModel("the trace has no accepted command")
    triggers = sum(r["cmd"] == "Trigger" for r in records)
    body = ",\n    ".join(
        "[" + ", ".join(f"{k} |-> {_tla_value(r[k])}" for k in FIELDS) + "]" for r in records
    )
    module = (
        f"{'-' * 30} MODULE {name} {'-' * 30}\n"
        f"\\* Generated by model_tests/trace_tla.py from a fastimpl command trace of\n"
        f"\\* {len(records)} accepted commands; checked with {name}.cfg (tla/TraceCheck.tla).\n"
        "EXTENDS TraceCheck\n\n"
        f"{name}Log == <<\n    {body}\n>>\n"
        f"{'=' * 80}\n"
    )
    # Failovers and restores draw fresh TM ids: leave room for every one the trace made.
    max_tm = max(tms) + sum(r["cmd"] in ("Failover", "Restore") for r in records) * job.num_tms
    max_tm += sum(r["cmd"] == "ReplaceTm" for r in records)
    consts = {
        "Mode": f'"{MODES[config.merging_mode]}"',
        "NumTms": job.num_tms,
        "Par0": job.vertices[0].parallelism,
        "MaxTm": max_tm,
        "MaxCheckpoint": max(max_checkpoint, triggers, 1),
        "NumRetained": config.num_retained,
        "SegSize": next(iter(sizes), 10),
        "PartialSize": next(iter(partial), 5),
        "MaxFileSize": config.max_file_size,
        "AmpBound": int(config.max_space_amplification),
        "MaxChannel": 1000,
        "MaxJob": 1 + restores,
        "RescalePars": "{" + ", ".join(str(p) for p in sorted(pars)) + "}",
        "Coord": "Coord",
        "User": "User",
    }
    cfg = (
        f"\\* {name}.cfg: generated by model_tests/trace_tla.py; see tla/TraceCheck.tla.\n"
        f"\\* module: {name}\n"
        "\\* expect: violates TraceIncomplete\n"
        "SPECIFICATION TraceSpec\n"
        "CONSTANTS\n"
        + "".join(f"    {k} = {v}\n" for k, v in consts.items())
        + f"    TraceLog <- {name}Log\n"
        "INVARIANTS\n"
        "    TraceIncomplete\n"
        "    NoDanglingInv\n"
        "    NoDoubleDeleteInv\n"
        "    OneOwnerInv\n"
        "    SoundCountsInv\n"
        "    NoForeignDeleteInv\n"
    )
    return TlaTrace(module, cfg, len(records))


def example_trace(*, observations: bool = False) -> list[str]:
    """A short job inside the spec's abstraction, traced through fastimpl: checkpoints with
    writes and reuse, an abort, a lost and a duplicated notice, a TM crash and failover."""
    import fsspec  # type: ignore[import-untyped]

    from conformance.fastimpl_commands import apply
    from fastimpl import CommandTrace, CounterIds
    from fastimpl.engine import InProcessEngine
    from spec.config import VertexSpec
    from spec.ids import SubtaskId

    job = JobSpec((VertexSpec("v", 2),), num_tms=2)
    config = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, max_file_size=25)
    subs = [SubtaskId("v", i, 2) for i in range(2)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.ndjson"
        trace = CommandTrace(str(path), observations=observations)
        fs = fsspec.filesystem("memory")
        root = f"/trace-example-{uuid.uuid4().hex}"  # memory:// is one per process
        cluster = InProcessEngine(config, job, fs, root, CounterIds(), deletion_log=True)
        cluster.start_trace(trace)

        def run(cmd: c.Command) -> None:
            apply(cluster, cmd)

        def checkpoint(cp: int, reuse: bool = False, complete: bool = True) -> None:
            run(c.Trigger())
            for s in subs:
                if reuse:
                    run(c.ReuseShared(cp, s, "sst"))
                else:
                    run(c.WriteState(cp, s, StateKind.KEYED_SHARED, "sst", 10))
                run(c.Acknowledge(cp, s))
            if complete:
                run(c.Complete(cp))

        checkpoint(1)
        run(c.DuplicateNotification(0))
        while cluster.channel:
            run(c.DeliverNotification(0))
        checkpoint(2, reuse=True)
        run(c.DropNotification(0))
        while cluster.channel:
            run(c.DeliverNotification(0))
        run(c.Trigger())
        run(c.WriteState(3, subs[0], StateKind.KEYED_SHARED, "sst", 10))
        run(c.Abort(3))
        while cluster.channel:
            run(c.DeliverNotification(0))
        run(c.CrashTm("tm-2"))
        run(c.AttemptStopped("tm-2"))
        run(c.Failover())
        checkpoint(4)
        while cluster.channel:
            run(c.DeliverNotification(0))
        cluster.storage.drain()
        trace.close()
        if fs.exists(root):
            fs.rm(root, recursive=True)
        return path.read_text(encoding="utf-8").splitlines()


def write(t: TlaTrace, out: Path, name: str) -> tuple[Path, Path]:
    out.mkdir(parents=True, exist_ok=True)
    module, cfg = out / f"{name}.tla", out / f"{name}.cfg"
    module.write_text(t.module, encoding="utf-8")
    cfg.write_text(t.cfg, encoding="utf-8")
    return module, cfg


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m model_tests.trace_tla", description=__doc__)
    ap.add_argument("trace", nargs="?", help="an NDJSON trace written by fastimpl")
    ap.add_argument("--example", action="store_true", help="trace the built-in example job")
    ap.add_argument("--name", default="MCTrace", help="module name (default MCTrace)")
    ap.add_argument("--out", type=Path, default=Path("tla"), help="folder (default tla/)")
    args = ap.parse_args(argv)
    if args.example == bool(args.trace):
        ap.error("give a trace file or --example")
    try:
        lines = example_trace() if args.example else Path(args.trace).read_text().splitlines()
        t = convert(lines, args.name)
    except (OSError, ValueError) as err:
        print(f"trace_tla: {err}", file=sys.stderr)
        return 2
    module, cfg = write(t, args.out, args.name)
    print(f"wrote {module} and {cfg}: {t.records} accepted commands (TLC checks them, not this)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
