"""bench/stream_files.py: why the stream job's state files are opened, and the least number
any rule could open at the amplification bound (issue 17's closing figures)."""

from __future__ import annotations

import argparse

from bench.stream_files import measure, report


def _args(mode: str) -> argparse.Namespace:
    return argparse.Namespace(
        mode=mode,
        batches=9,
        rows=1000,
        vocabulary=1000,
        start_parallelism=3,
        parallelism=4,
        kill=5,
        rescale=3,
    )


def test_across_opens_no_fewer_files_than_the_least_and_says_why_each_closed() -> None:
    fig = measure(_args("ACROSS_CHECKPOINT"))
    assert fig.checkpoints == 9 and fig.least is not None
    # The least rests on this: a file that took EXCLUSIVE state of k checkpoints holds
    # the k - 1 older ones dead at the last one's sample. Measured, never less.
    assert any(k >= 2 for _, k, _, _ in fig.premise)
    for last, k, least_amp, measured in fig.premise:
        assert measured >= least_amp - 1e-9, (last, k, least_amp, measured)
    if max(fig.amplification) <= 2.0:  # a run within the bound opens at least that many
        assert fig.least <= fig.created
    # Each subtask's TM opens a SHARED and an EXCLUSIVE file: 3 x 2 at the start, 4 x 2
    # after the rescale, 2 for the new TM of the subtask whose task was killed; any more
    # follow a roll
    ended = "the job ended (rescale, R90)"
    bound = "given up by the amplification bound (R80, R81)"
    assert {why for (_scope, why) in fig.closes} <= {ended, bound}
    rolls = fig.closes[("shared", bound)] + fig.closes[("exclusive", bound)]
    assert 16 <= fig.created <= 16 + rolls
    assert "least files any rule could create" in report(fig)


def test_within_closes_each_file_at_its_checkpoint_boundary() -> None:
    fig = measure(_args("WITHIN_CHECKPOINT"))
    assert fig.least is None
    reasons = {why for (_scope, why) in fig.closes}
    assert reasons == {"its checkpoint is over (WITHIN, R14)"}
    # one EXCLUSIVE file per TM and checkpoint (the goal of issue 17): a TM per subtask,
    # 3 for the 4 checkpoints before the rescale, 4 for the 5 after
    assert fig.closes[("exclusive", "its checkpoint is over (WITHIN, R14)")] == 3 * 4 + 4 * 5
