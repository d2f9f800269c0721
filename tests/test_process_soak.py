"""The multi-process soak (issue 16; the harness and its knobs: ``tests.process_soak``):
one seeded sequence per setting in ``make test``, many in the soak mode."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from spec import commands as c
from spec.config import MergingMode, StateKind
from spec.layout import is_under, shared_dir
from tests.file_compare import compare_with_model
from tests.process_soak import (
    LOG,
    SEED,
    SEQUENCES,
    SETTINGS,
    STEPS,
    TOTALS,
    Soak,
    SoakFailure,
    make_setting,
)
from tests.tm_cluster import TmDied


@pytest.mark.parametrize(("mode", "where"), SETTINGS, ids=[f"{m.value}-{w}" for m, w in SETTINGS])
def test_the_multi_process_soak(
    mode: MergingMode, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    done: Counter[str] = Counter()
    for n in range(SEQUENCES):
        seed = f"{SEED + n}-{mode.value}-{where}"
        config, fs, root, target = make_setting(mode, where, tmp_path, request)
        soak = Soak(seed, config, fs, root, target)
        try:
            soak.check(quiet=True)
            for _ in range(STEPS):
                soak.step()
                soak.check()
            soak.finish()
        except (AssertionError, TmDied) as err:
            if isinstance(err, SoakFailure):
                raise
            raise SoakFailure(soak.failure(f"{type(err).__name__}: {err}")) from err
        finally:
            codes = soak.engine.stop_all()
        assert all(code == 0 for code in codes), soak.failure(f"TM exit codes {codes}")
        done.update(soak.counts)
        done["sequences"] += 1
        if LOG:  # one line per sequence, for long soaks
            with open(LOG, "a", encoding="utf-8") as out:
                out.write(json.dumps({"seed": seed, **soak.counts}) + "\n")
    TOTALS.update(done)
    print(f"\nsoak {mode.value}-{where}: {dict(sorted(done.items()))}")
    assert done["sequences"] == SEQUENCES


def test_the_file_comparison_catches_a_file_the_model_does_not_have(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """The comparison of the real files with the model's (``tests.file_compare``) is not
    vacuous: a sequence that agrees stops agreeing when one file is added to one step's
    snapshot, or its owner changed."""
    config, fs, root, target = make_setting(MergingMode.NONE, "local", tmp_path, request)
    soak = Soak("file-compare", config, fs, root, target)
    try:
        soak.full_checkpoint()
        soak.full_checkpoint()
        soak.check()
    finally:
        soak.engine.stop_all()
    lines = soak.out.getvalue().splitlines()
    compared, diff = compare_with_model(lines, soak.snapshots, ())
    assert diff is None and compared >= 1
    n, last = soak.snapshots[-1]
    extra = last.copy()
    extra[("job-0/chk-2", "*", "coordinator", 7)] += 1
    _, diff = compare_with_model(lines, [*soak.snapshots[:-1], (n, extra)], ())
    assert diff is not None and "only on storage" in diff
    (key, count), *_ = last.items()
    moved = last.copy()
    del moved[key]
    moved[(key[0], key[1], "user" if key[2] != "user" else "coordinator", key[3])] = count
    _, diff = compare_with_model(lines, [*soak.snapshots[:-1], (n, moved)], ())
    assert diff is not None


def test_a_zombies_stale_notice_does_not_delete_a_file_twice(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """R64, I2: the long soak's sequence of seed ``1004-within-local`` (40 steps). After
    two failovers the replacement ``tm-3`` of the lost attempt ``tm-2`` (a zombie: its
    process runs on) is killed, and ``tm-2`` still deletes its own file in ``map-1-2``
    applying a notice it already had. So the sweep of what ``tm-3`` left there must leave
    a file another attempt that may still run created (its name says whose) to that
    attempt: taken as ``tm-3``'s, it would be deleted twice (I2). The file comparison
    with the model runs too."""
    mode, where = MergingMode.WITHIN_CHECKPOINT, "local"
    config, fs, root, target = make_setting(mode, where, tmp_path, request)
    soak = Soak("1004-within-local", config, fs, root, target)
    try:
        soak.check(quiet=True)
        for _ in range(40):
            soak.step()
            soak.check()
        soak.finish()
    finally:
        soak.engine.stop_all()
    assert soak.counts["zombies"] >= 1 and soak.counts["failovers"] >= 2


def test_a_reupload_takes_the_bytes_from_the_tms_own_copy(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """R20: state that may not be reused is uploaded again, and the model accepts the
    ``ReuseShared`` whatever storage still holds of the old upload. The soak's TM process
    takes the bytes from its own copy of what it uploaded, as a backend does from its
    local files, never from storage: on S3 storage does not have them while the old
    upload's WITHIN file is open (an object is written when its file is closed, R12; the
    soak's seed ``1008-within-s3``) nor after the store deleted them (their checkpoint
    aborted), and a read back would refuse with ``NO_SUCH_STATE``. Both re-uploads are
    accepted, and the model agrees."""
    config, fs, root, target = make_setting(MergingMode.WITHIN_CHECKPOINT, "s3", tmp_path, request)
    soak = Soak("reupload", config, fs, root, target)
    s = sorted(soak.coord.placement, key=str)[0]
    sub = (s.vertex, s.index, s.parallelism)

    def keyed(cid: int, name: str) -> None:
        data = b"k" * 100
        reply = soak.engine.call(
            soak.host(s), ("write", sub, cid, "keyed_shared", name, data, False)
        )
        assert reply == ("ok",)
        soak.run(c.WriteState(cid, s, StateKind.KEYED_SHARED, name, len(data), 1), lambda: None)
        soak.check()

    def reuse(cid: int, name: str) -> None:
        reply = soak.engine.call(soak.host(s), ("reuse", sub, cid, name, False))
        assert reply == ("ok",), reply
        soak.run(c.ReuseShared(cid, s, name), lambda: None)
        soak.check()

    try:
        first = soak.run_trigger()
        keyed(first, "a")
        keyed(first, "b")
        second = soak.run_trigger()
        reuse(second, "b")  # the old bytes lie in the first checkpoint's open file
        soak.ack(first, s)
        soak.abort(first)
        soak.drain_notices()  # the TM deletes the aborted checkpoint's file
        soak.check()
        listed = soak.coord.storage.list_files()
        assert not [p for p in listed if is_under(p, shared_dir(soak.coord.job, s))]
        reuse(soak.run_trigger(), "a")  # the old bytes are gone from storage
        soak.finish()
    finally:
        soak.engine.stop_all()
    assert soak.counts["commands replayed"] > 0
