"""The multi-process soak (issue 16; the harness and its knobs: ``tests.process_soak``):
one seeded sequence per setting in ``make test``, many in the soak mode."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from spec.config import MergingMode
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
    """R64, I2: the sequence of seed ``1004-within-local`` (40 steps), found by a long
    soak. After two failovers the replacement ``tm-3`` of the lost attempt ``tm-2`` (a
    zombie: its process runs on) is killed; the sweep of what ``tm-3`` left in ``map-1-2``
    took ``tm-2``'s file there as ``tm-3``'s and deleted it, and ``tm-2`` deleted it again
    applying a notice it already had. The sweep now leaves a file another attempt that
    may still run created (its name says whose) to that attempt; the file comparison
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
