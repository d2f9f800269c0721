"""``python -m examples.embedding [BASE_DIR] [--mode none|within|across]``: run the job
(``examples.embedding.job``) on ``BASE_DIR/checkpoints``, then audit the job's base with
``ckpt audit`` (one process, no grace period: the job ended, so every file nothing
references is an orphan). Exit status 0 only if the audit finds no orphan and no dangling
reference; the audit's summary is left in ``BASE_DIR/audit-summary.json``."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from examples.embedding.job import JOB, run_job
from spec.config import MergingMode

MODES = {
    "none": MergingMode.NONE,
    "within": MergingMode.WITHIN_CHECKPOINT,
    "across": MergingMode.ACROSS_CHECKPOINT,
}


def audit(base: Path) -> tuple[int, dict[str, object]]:
    """``ckpt audit`` of the job's base: its exit status and summary."""
    summary = base / "audit-summary.json"
    cmd = [
        sys.executable,
        "-m",
        "ckpt",
        "audit",
        str(base / "checkpoints" / JOB),
        "--engine",
        "single",
        "--grace",
        "0s",
        "--json",
        str(summary),
        "--quiet",
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if not summary.exists():
        print(done.stdout + done.stderr, file=sys.stderr)
        return done.returncode or 2, {}
    found: dict[str, object] = json.loads(summary.read_text())
    return done.returncode, found


def run(base: Path, mode: MergingMode) -> int:
    started = time.monotonic()
    retained = run_job(base / "checkpoints", mode)
    code, s = audit(base)
    print(
        f"audit of {JOB}: exit {code}, {s.get('checkpoints')} checkpoints, "
        f"{s.get('references')} references, {s.get('orphans')} orphans, "
        f"{s.get('dangling')} dangling, {s.get('pending')} pending"
    )
    ok = (
        code == 0
        and s.get("orphans") == 0
        and s.get("dangling") == 0
        and s.get("checkpoints") == len(retained)
    )
    print(f"{'clean' if ok else 'NOT CLEAN'} after {time.monotonic() - started:.1f} s")
    return 0 if ok else 1


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m examples.embedding", description=__doc__)
    ap.add_argument("base", nargs="?", type=Path, help="where to write (default: a temp dir)")
    ap.add_argument("--mode", choices=sorted(MODES), default="within", help="file merging")
    args = ap.parse_args(argv)
    if args.base is not None:
        return run(args.base.resolve(), MODES[args.mode])
    with tempfile.TemporaryDirectory(prefix="ckpt-embedding-") as tmp:
        return run(Path(tmp), MODES[args.mode])


if __name__ == "__main__":
    sys.exit(main())
