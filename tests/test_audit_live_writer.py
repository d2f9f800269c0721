"""Issue 15, defect 2: ``--delete-orphans`` at grace 0 beside a live writer loses nothing.

A writer thread checkpoints every ~100 ms through the public API with a 0.5 s pause
between writing and acknowledging (files exist long before any ``_metadata`` names them),
reusing shared state, in WITHIN and ACROSS mode (a pool file stays open across
checkpoints). Its coordinator publishes its state (``fastimpl.writer_state``). Meanwhile
the audit deletes at grace 0: through the CLI (``--grace 0s --allow-short-grace``), and
through the library with its clock a day ahead, so that the grace and the hard floor
protect nothing and only the writer's fence, its open files and the references do. Old
strays planted on the way are deleted (the collection works); every checkpoint is
readable while retained and restorable at the end. The same race without the fence
loses files: the test can fail. On S3 (moto) the race runs in WITHIN (ACROSS is refused
there, R16), with a pause between acknowledging and completing: an object store writes a
pool file when it is acknowledged, so only then is it there, unreferenced.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from ckpt.cli import app
from fastimpl import CheckpointStore, CompletionFailed
from fastimpl.api import publish_state
from pipeline import deletion, fence
from pipeline.location import Location
from pipeline.single import audit_single
from spec.config import Config, JobSpec, MergingMode, StateKind, VertexSpec
from spec.handles import stream_of
from tests.lockstep import S3_BUCKET

KS = StateKind.KEYED_SHARED
OP = StateKind.OPERATOR_LIST
DAY = 86400.0
JOB = JobSpec((VertexSpec("w", 2),), num_tms=1)


class Writer(threading.Thread):
    def __init__(self, store: CheckpointStore, checkpoints: int, after_ack: float = 0.0) -> None:
        super().__init__(daemon=True)
        self.store = store
        self.checkpoints = checkpoints
        self.after_ack = after_ack
        """Seconds between acknowledging and completing (an object store writes a pool
        file when it is acknowledged: only then is it there unreferenced)."""
        self.errors: list[str] = []
        self.completed = 0

    def check_retained(self) -> None:
        for r in self.store.coordinator.retained():
            for e in r.entries:
                s = stream_of(e.handle)
                if s is None:
                    continue
                try:
                    self.store.read(e)
                except Exception as err:
                    self.errors.append(f"chk-{r.checkpoint} {s.path}: {err}")

    def run(self) -> None:
        try:
            coord = self.store.coordinator
            for n in range(self.checkpoints):
                cid = coord.trigger()
                for sub, tm in self.store.placement().items():
                    mgr = self.store.task_manager(tm)
                    mgr.write(cid, sub, KS, f"sst-{cid}", os.urandom(300))
                    if n and mgr.reuse_shared(cid, sub, f"sst-{cid - 1}") is None:
                        self.errors.append(f"reuse of sst-{cid - 1} failed")
                    mgr.write(cid, sub, OP, "offsets", os.urandom(40))
                time.sleep(0.5)  # written, not yet acknowledged: no _metadata names it
                for sub, tm in self.store.placement().items():
                    self.store.task_manager(tm).acknowledge(cid, sub)
                time.sleep(self.after_ack)
                try:
                    coord.complete(cid)
                except CompletionFailed:
                    self.errors.append(f"chk-{cid} did not complete")
                self.store.deliver_notifications()
                self.completed += 1
                self.check_retained()
                time.sleep(0.1)
        except Exception as err:  # reported by the test
            self.errors.append(f"writer: {type(err).__name__}: {err}")


def _stray(loc: Location, n: int) -> str:
    """An old file nothing references (written three days ago)."""
    rel = f"{loc.job_dir}/shared/stray-{n}.sst"
    t = time.time() - 3 * DAY
    if loc.local:
        p = Path(loc.full(rel))
        p.write_bytes(b"s" * 10)
        os.utime(p, (t, t))
    else:
        loc.fs().pipe_file(loc.full(rel), b"s" * 10)
        _backdate_in_moto(loc.full(rel), t)
    return rel


def _backdate_in_moto(key: str, when: float) -> None:
    """S3 cannot backdate an object; moto's server runs in this process, so its record of
    the object's time is set, as ``os.utime`` does on a disk."""
    from moto.core.models import DEFAULT_ACCOUNT_ID
    from moto.s3.models import s3_backends

    bucket, name = key.split("/", 1)
    stamp = dt.datetime.fromtimestamp(when, dt.UTC).replace(tzinfo=None)
    for version in s3_backends[DEFAULT_ACCOUNT_ID]["aws"].buckets[bucket].keys.getlist(name):
        version.last_modified = stamp


def _race(
    tmp_path: Path,
    mode: MergingMode,
    *,
    fenced: bool,
    url: str | None = None,
    options: dict[str, Any] | None = None,
    checkpoints: int = 12,
    after_ack: float = 0.0,
) -> tuple[Writer, set[str], Any]:
    config = Config.for_mode(mode, num_retained=2)
    root = url or str(tmp_path / "root")
    store = CheckpointStore(root, config, JOB, storage_options=options)
    if fenced:
        publish_state(store)
    writer = Writer(store, checkpoints, after_ack)
    writer.start()
    while writer.completed == 0:
        time.sleep(0.05)
    loc = Location.parse(f"{root}/{store.job_id}", options)
    cli_store: list[str] = []
    if options:
        cli_store = [
            "--endpoint-url",
            options["client_kwargs"]["endpoint_url"],
            "-o",
            f"key={options['key']}",
            "-o",
            f"secret={options['secret']}",
        ]
    strays: set[str] = set()
    n = 0
    while writer.is_alive():
        n += 1
        strays.add(_stray(loc, n))
        if n % 2 and fenced:
            r = CliRunner().invoke(
                app,
                [
                    "audit",
                    loc.uri(),
                    *cli_store,
                    "--engine",
                    "single",
                    "-q",
                    "--delete-orphans",
                    "--grace",
                    "0s",
                    "--allow-short-grace",
                    "--max-deletes-per-second",
                    "0",
                    "--log",
                    str(tmp_path / "cli.jsonl"),
                ],
                catch_exceptions=False,
            )
            assert r.exit_code in (0, 3), r.output  # 3: a guard stopped this run
            continue
        later = time.time() + DAY  # grace and hard floor protect nothing now
        try:
            state = fence.read_state(loc) if fenced else None
            t = audit_single(loc, grace=0, now=later)
            if t.summary.corrupt_metadata:
                continue  # a _metadata replaced while read: the guard refuses anyway
            plan = deletion.plan_deletion(
                loc,
                t.summary,
                t["orphans"],
                grace=0,
                allow_short_grace=True,
                no_live_writer=not fenced,
                now=later,
                state_before=state,
            )
        except deletion.DeletionRefused:
            continue
        deletion.execute(loc, plan, str(tmp_path / "lib.jsonl"), rate=0)
    writer.join()
    return writer, strays, store


def _deleted(*logs: Path) -> set[str]:
    out: set[str] = set()
    for log in logs:
        if log.exists():
            out |= {
                json.loads(x)["path"]
                for x in log.read_text().splitlines()
                if json.loads(x)["event"] == "deleted"
            }
    return out


def _check_nothing_live_lost(
    tmp_path: Path, writer: Writer, strays: set[str], store: Any, loc: Location, n: int
) -> None:
    with store:
        assert writer.errors == []
        assert writer.completed == n
        deleted = _deleted(tmp_path / "cli.jsonl", tmp_path / "lib.jsonl")
        assert deleted & strays, "the audit never collected a planted orphan"
        for r in store.coordinator.retained():  # every retained checkpoint restores
            for sub, tm in store.placement().items():
                got = store.task_manager(tm).restore(sub)
                assert got and all(len(b) > 0 for _e, b in got)
            assert r.entries
        after = audit_single(loc, grace=0)
        assert after.summary.dangling == 0 and after.summary.corrupt_metadata == 0


@pytest.mark.parametrize(
    "mode", [MergingMode.WITHIN_CHECKPOINT, MergingMode.ACROSS_CHECKPOINT], ids=["WITHIN", "ACROSS"]
)
def test_a_live_writer_loses_nothing_at_grace_zero(tmp_path: Path, mode: MergingMode) -> None:
    writer, strays, store = _race(tmp_path, mode, fenced=True)
    loc = Location.parse(str(tmp_path / "root" / store.job_id))
    _check_nothing_live_lost(tmp_path, writer, strays, store, loc, 12)


def test_a_live_writer_on_s3_loses_nothing_at_grace_zero(
    s3_endpoint: str,
    tmp_path: Path,
) -> None:
    """The race on S3 (moto), WITHIN: ACROSS is refused on object stores (R16: an open
    pool file is not readable there). An object's time is the store's clock and the fence
    the writer's, so the fence keeps a margin of minutes there: the strays are backdated
    in moto so that the collection has something to take."""
    opts = {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": s3_endpoint}}
    url = f"s3://{S3_BUCKET}/race{time.time_ns()}"
    with pytest.raises(ValueError):
        CheckpointStore(
            url, Config.for_mode(MergingMode.ACROSS_CHECKPOINT), JOB, storage_options=opts
        )
    writer, strays, store = _race(
        tmp_path,
        MergingMode.WITHIN_CHECKPOINT,
        fenced=True,
        url=url,
        options=opts,
        checkpoints=6,
        after_ack=0.5,
    )
    loc = Location.parse(f"{url}/{store.job_id}", opts)
    _check_nothing_live_lost(tmp_path, writer, strays, store, loc, 6)


def test_the_same_race_without_the_fence_loses_files(tmp_path: Path) -> None:
    """The test above can fail: without the published state (no fence, no open files)
    and with the clock past the hard floor and the grace (what age-only collection
    did), the same race deletes live files."""
    writer, _strays, store = _race(tmp_path, MergingMode.WITHIN_CHECKPOINT, fenced=False)
    with store:
        after = audit_single(Location.parse(str(tmp_path / "root" / store.job_id)), grace=0)
        assert writer.errors or after.summary.dangling > 0
