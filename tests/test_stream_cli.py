"""``ckpt stream``'s bad usage is refused before Spark starts (exit code 2, a message that
names what was wrong); the run itself is tests/test_stream_spark.py's."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from ckpt.cli import app


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--merging", "sometimes"], "none, within or across"),
        (["-D", "no-equals-sign"], "KEY=VALUE"),
        (["-D", "execution.checkpointing.file-merging.typo=1"], "typo"),
        (["--max-file-size", "lots"], "max-file-size"),
        (["--num-retained", "0"], "num-retained"),
        (["--window-ms", "0"], "windowing"),
        (["-o", "no-equals-sign"], "key=value"),
        (["--kill-worker-prob", "0.1", "--master", "local[2]"], "retries a failed task"),
        (["--kill-worker-prob", "1.5", "--master", "local[2,4]"], "kill-worker-prob must be"),
        (["--base", "s3://bucket/x", "--merging", "across"], "within-checkpoint merging"),
        (["--rescale-at", "5"], "expected N:P"),
        (["--rescale-at", "19:3", "--batches", "20"], "N must be in 0..18"),
        (["--rescale-at", "3:0"], "P in 1..128"),
        (["--restore-mode", "sometimes"], "claim or no_claim"),
        (["--resume"], "--resume needs the --run-dir of a run that started"),
        (["--die-at", "3:later"], "expected B:running|sunk|completed"),
        (["--stall-at", "3:1"], "--stall-at '3:1': expected B:S:deleting|before-snapshot"),
        (["--state-backend", "lsm"], "rocksdb or working"),
        (["--state-backend", "working", "--slatedb-gc-min-age", "-1"], "must be >= 0"),
        (["--state-backend", "working", "--speculation"], "without --speculation"),
        (
            ["--state-backend", "working", "--merging", "within", "--base", "memory://x"],
            "local directory or S3",
        ),
    ],
)
def test_bad_usage_exits_2_naming_the_problem(tmp_path: Path, args: list[str], says: str) -> None:
    r = CliRunner().invoke(app, ["stream", "--run-dir", str(tmp_path / "run"), *args])
    assert r.exit_code == 2, r.output
    assert says in r.output.replace("\n", "")
    assert not (tmp_path / "run").exists()


def test_a_run_directory_in_use_is_refused(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "x").write_text("someone's")
    r = CliRunner().invoke(app, ["stream", "--run-dir", str(tmp_path / "run")])
    # rich wraps the message in a box as wide as the terminal, so a long temporary path
    # can break "not empty" over two lines: compare the words, not the layout.
    words = " ".join(r.output.replace("│", " ").split())
    assert r.exit_code == 2 and "not empty" in words, r.output
    assert (tmp_path / "run" / "x").read_text() == "someone's"
