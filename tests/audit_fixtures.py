"""Checkpoint bases for the audit tests: written by fastimpl from the conformance corpus's
random command sequences, then damaged in known ways (:func:`plant`), with the exact
answer the audit owes for each damage.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]
from attrs import define, field
from typer.testing import CliRunner

from ckpt.cli import app
from conformance.case import CORPUS, load
from conformance.fastimpl_commands import apply
from fastimpl.engine import InProcessEngine
from fastimpl.ids import CounterIds
from fastimpl.metadata import encode
from pipeline.location import Location
from pipeline.result import BEYOND, MISSING, Row, Tables
from pipeline.single import audit_single
from spec.config import Scope, StateKind
from spec.errors import CommandError
from spec.handles import SegmentHandle, StateEntry, extent_of, stream_of
from spec.ids import SubtaskId
from spec.layout import job_base
from spec.observation import Observation

DAY = 86400.0
HOUR = 3600.0


@define
class Built:
    loc: Location
    cluster: InProcessEngine
    obs: Observation

    @property
    def job_dir(self) -> str:
        return self.loc.job_dir

    def retained_refs(self) -> set[tuple[str, str, int, int]]:
        """(checkpoint key, path, offset, length) of every stream handle the store says
        its retained checkpoints hold."""
        out = set()
        for r in self.obs.retained:
            for e in r.entries:
                s = stream_of(e.handle)
                if s is not None:
                    out.add((f"{job_base(r.job)}/chk-{r.checkpoint}", *extent_of(s)))
        return out


def build(
    case_file: str, fs: Any, root: str, uri_prefix: str = "", options: dict[str, Any] | None = None
) -> Built:
    """Run a corpus case's commands on fastimpl under ``root``; the audited base is the
    job base of the newest retained checkpoint."""
    case = load(CORPUS / case_file)
    cluster = InProcessEngine(case.config, case.job, fs, root, CounterIds(), deletion_log=True)
    for step in case.steps:
        try:
            apply(cluster, step.command)
        except CommandError:
            pass
    cluster.storage.drain()
    obs = cluster.observe()
    assert obs.retained, f"{case_file} ends without a retained checkpoint"
    job = job_base(obs.retained[-1].job)
    return Built(Location.parse(f"{uri_prefix}{root}/{job}", options), cluster, obs)


@define
class Planted:
    """What was done to a base, and so what the audit must now say."""

    orphans: set[str] = field(factory=set)
    pending: set[str] = field(factory=set)
    dangling: set[tuple[str, str, int, int, str]] = field(factory=set)
    """(checkpoint, path, offset, length, reason)"""
    corrupt: dict[str, str] = field(factory=dict)
    """_metadata path -> the field the audit must blame"""


def _write(loc: Location, rel: str, data: bytes, mtime: float | None) -> None:
    fs = loc.fs()
    full = loc.full(rel)
    if loc.local:
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
        if mtime is not None:
            os.utime(full, (mtime, mtime))
    else:
        fs.pipe_file(full, data)


def plant(loc: Location, before: Tables, *, young: bool) -> Planted:
    """Damage the base in every way the issue names. ``young``: also add a half-written
    file with a fresh modification time (local disks only: S3 cannot backdate objects,
    so there the test moves the audit's clock instead)."""
    job = loc.job_dir
    fs = loc.fs()
    p = Planted()
    streams = [r for r in before["references"] if r["handle"] in ("segment", "file")]
    by_path: dict[str, list[Row]] = {}
    for r in streams:
        if r["path"].startswith(job + "/"):
            by_path.setdefault(r["path"], []).append(r)
    # The most referenced file goes (data loss for every reference to it) ...
    ranked = sorted(by_path, key=lambda q: (-len(by_path[q]), q))
    assert len(ranked) >= 2, "the case needs two referenced files in the base"
    gone = ranked[0]
    fs.rm_file(loc.full(gone))
    for r in by_path[gone]:
        p.dangling.add((r["checkpoint"], gone, r["offset"], r["length"], MISSING))
    # ... and the next loses its last byte: every range that reached it dangles.
    cut = ranked[1]
    end = max(r["offset"] + r["length"] for r in by_path[cut])
    data = bytes(fs.cat_file(loc.full(cut)))
    mtime = os.stat(loc.full(cut)).st_mtime if loc.local else None
    _write(loc, cut, data[: end - 1], mtime)
    for r in by_path[cut]:
        if r["offset"] + r["length"] > end - 1:
            p.dangling.add((r["checkpoint"], cut, r["offset"], r["length"], BEYOND))
    # Strays, old enough to be orphans: at the top of shared/, in a TM's directory, in a
    # checkpoint directory that never got its _metadata, and a file copied in from
    # another job's shared directory.
    old = time.time() - 3 * DAY
    subdir = os.path.dirname(ranked[0])
    for rel, blob in (
        (f"{job}/shared/stray.sst", b"s" * 100),
        (f"{job}/taskowned/tm-gone/leftover", b"l" * 33),
        (f"{job}/chk-9999/incomplete-state", b"i" * 7),
        (f"{subdir}/copied-from-other-job", b"o" * 4096),
    ):
        _write(loc, rel, blob, old)
        p.orphans.add(rel)
    if young:
        rel = f"{subdir}/half-written.part"
        _write(loc, rel, b"h" * 10, None)
        p.pending.add(rel)
    # Metadata the audit must report and read past: another job's, and a truncated one.
    other = SubtaskId("v", 0, 1)
    foreign = encode(
        9998,
        "other-job",
        False,
        (
            StateEntry(
                other,
                StateKind.KEYED_SHARED,
                "s",
                SegmentHandle("other-job/shared/v-0-1/f", 0, 10, "x", Scope.SHARED),
                1,
                (0, 127),
            ),
        ),
        (),
    )
    _write(loc, f"{job}/chk-9998/_metadata", foreign, old)
    p.corrupt[f"{job}/chk-9998/_metadata"] = "payload.job"
    some_meta = sorted(r["checkpoint"] for r in streams if r["checkpoint"].startswith(job + "/"))[0]
    whole = bytes(fs.cat_file(loc.full(some_meta + "/_metadata")))
    _write(loc, f"{job}/chk-9997/_metadata", whole[: len(whole) // 2], old)
    p.corrupt[f"{job}/chk-9997/_metadata"] = "file"
    return p


def comparable(t: Tables) -> dict[str, Any]:
    """A table set in a form two engines can be compared on (rows as sorted tuples,
    floats rounded)."""

    def norm(v: Any) -> Any:
        return round(v, 9) if isinstance(v, float) else v

    out: dict[str, Any] = {
        "summary": {k: norm(v) for k, v in t.summary.to_json().items() if k != "engine"}
    }
    for name, rows in t.tables.items():
        out[name] = sorted((tuple((k, norm(r[k])) for k in sorted(r)) for r in rows), key=repr)
    return out


# --------------------------------------------------------------------------- stray files

CASE = "random-within-002.json.gz"
"""The corpus case whose files the stray-file bases start from."""


def old(path: Path, data: bytes = b"x" * 64) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    t = time.time() - 3 * DAY
    os.utime(path, (t, t))
    return path


def base_with_strays(tmp_path: Path) -> tuple[Built, set[str]]:
    b = build(CASE, fsspec.filesystem("file"), str(tmp_path / "root"))
    b.cluster.storage.close_all()
    root = Path(b.loc.container)
    j = b.job_dir
    strays = {
        f"{j}/shared/stray.sst",
        f"{j}/taskowned/tm-gone/leftover",
        f"{j}/chk-9999/incomplete",
    }
    for s in strays:
        old(root / s)
    return b, strays


def snapshot(b: Built) -> dict[str, int]:
    return {f["path"]: f["size"] for f in audit_single(b.loc, grace=HOUR)["files"]}


def run(*args: str) -> Any:
    return CliRunner().invoke(app, ["audit", *args], catch_exceptions=False)
