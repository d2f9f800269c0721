"""Issue 15 on S3 (moto): the hostile bases an object store can hold, through both engines,
and an unreadable writer state.

An object store has no FIFOs, links, devices, names that are not UTF-8 or PATH_MAX-deep
trees (``hostile_bases.NOT_ON_OBJECT_STORES`` says why for each case); the rest of the
corpus is uploaded as it is (``hostile_bases.upload``): a ``_metadata`` that is a
"directory" (a key below it), nested too deeply, over the size limit, a checkpoint id of
2**70, names with markup and control characters. Both engines give the same tables, the
hostile part is a row, and ``--delete-orphans`` deletes exactly the orphans or, while a
``_metadata`` is unreadable, nothing. S3 cannot backdate an object: the audit's clock
moves ten days ahead instead.
"""

from __future__ import annotations

import itertools
import json
import time
from pathlib import Path
from typing import Any

import pytest

from pipeline import deletion, fence
from pipeline.deletion import DeletionRefused, plan_deletion
from pipeline.location import Location
from pipeline.single import audit_single
from tests.hostile_bases import (
    CASES,
    JOB,
    NOT_ON_OBJECT_STORES,
    ON_OBJECT_STORES,
    Hostile,
    check,
    deadline,
    upload,
    valid,
)
from tests.lockstep import S3_BUCKET, s3

HOUR = 3600.0
LATER = 10 * 86400.0
_n = itertools.count()


def options(endpoint: str) -> dict[str, Any]:
    return {"key": "testing", "secret": "testing", "client_kwargs": {"endpoint_url": endpoint}}


def s3_case(name: str, tmp_path: Path) -> Hostile:
    h = CASES[name](tmp_path / name)
    for n in [o for o in h.orphans if "\n" in o]:
        # moto's server answers 404 to a PUT of a key with a newline (S3 stores it): the
        # name stays in the local corpus only.
        (h.base.parent / n).unlink()
        h.orphans.discard(n)
    return h


def location(container: str, endpoint: str) -> Location:
    return Location.parse(f"s3://{container}/{JOB}", options(endpoint))


def test_every_hostile_case_is_placed_on_object_stores_or_said_why_not() -> None:
    assert set(ON_OBJECT_STORES) | set(NOT_ON_OBJECT_STORES) == set(CASES)
    assert not set(ON_OBJECT_STORES) & set(NOT_ON_OBJECT_STORES)


@pytest.mark.parametrize("name", ON_OBJECT_STORES)
def test_hostile_base_on_s3_is_reported_and_collected_safely(
    s3_endpoint: str,
    tmp_path: Path,
    name: str,
) -> None:
    fs = s3(s3_endpoint)
    h = s3_case(name, tmp_path)
    container = f"{S3_BUCKET}/hostile{next(_n)}"
    keys = set(upload(h, fs, container))
    loc = location(container, s3_endpoint)
    now = time.time() + LATER
    with deadline(60, f"{name} on S3"):
        t = audit_single(loc, grace=HOUR, now=now)
    check(h, t)
    orphans = {loc.full(p) for p in h.orphans}
    if h.corrupt:
        with pytest.raises(DeletionRefused, match="cannot be read"):
            plan_deletion(loc, t.summary, t["orphans"], grace=HOUR, now=now)
        orphans = set()
    else:
        plan = plan_deletion(loc, t.summary, t["orphans"], grace=HOUR, now=now)
        assert {loc.full(c.path) for c in plan.delete} == orphans
        log = tmp_path / "log.jsonl"
        assert not deletion.execute(loc, plan, str(log), rate=0).failed
        events = [json.loads(x) for x in log.read_text().splitlines()]
        assert {e["path"] for e in events if e["event"] == "deleted"} == h.orphans
    assert set(fs.find(loc.container)) == keys - orphans


@pytest.mark.spark  # starts Spark itself (tests/conftest.py: spark)
def test_the_hostile_bases_on_s3_give_the_same_tables_on_both_engines(
    spark: Any,
    s3_endpoint: str,
    tmp_path: Path,
) -> None:
    """Every case an object store can hold, in one base (one Spark audit: each case's
    hostile ``chk-2`` renamed apart), through both engines."""
    from pipeline.spark_audit import audit_spark
    from tests.audit_fixtures import comparable

    fs = s3(s3_endpoint)
    container = f"{S3_BUCKET}/hostile{next(_n)}"
    whole = Hostile(tmp_path)
    for i, name in enumerate(ON_OBJECT_STORES):
        h = s3_case(name, tmp_path)

        def apart(p: str, i: int = i) -> str:
            head = f"{JOB}/chk-2/"
            return f"{JOB}/chk-{20 + i}/{p[len(head) :]}" if p.startswith(head) else p

        upload(h, fs, container, apart)
        whole.corrupt |= {apart(p) for p in h.corrupt}
        whole.unreadable |= {apart(p) for p in h.unreadable}
        whole.orphans |= h.orphans
    assert len(whole.corrupt) >= 4  # a directory, nested, too large, id 2**70
    loc = location(container, s3_endpoint)
    now = time.time() + LATER
    with deadline(180, "the hostile bases on S3 with Spark"):
        got = audit_spark(spark, loc, grace=HOUR, now=now).collect()
    single = audit_single(loc, grace=HOUR, now=now)
    check(whole, single)
    check(whole, got)
    assert comparable(got) == comparable(single)


STATES = {
    "not-json": b'{"format": "ckpt-wr',
    "wrong-type": json.dumps(
        {
            "format": "ckpt-writer-state",
            "published_at": "now",
            "seq": 1,
            "running": True,
            "pending": [],
            "open_files": [],
        }
    ).encode(),
}


@pytest.mark.parametrize("kind", ["not-json", "wrong-type", "a-directory", "oversized"])
def test_an_unreadable_writer_state_refuses_the_deletion_on_s3(
    s3_endpoint: str,
    tmp_path: Path,
    kind: str,
) -> None:
    fs = s3(s3_endpoint)
    h = valid(tmp_path)
    container = f"{S3_BUCKET}/state{next(_n)}"
    keys = set(upload(h, fs, container))
    loc = location(container, s3_endpoint)
    state = loc.full(fence.state_path(loc))
    if kind == "a-directory":
        fs.pipe_file(state + "/inside", b"{}")
    elif kind == "oversized":
        with fs.open(state, "wb") as f:
            for _ in range(fence.LIMIT >> 20):
                f.write(bytes(1 << 20))
            f.write(b"\0")
    else:
        fs.pipe_file(state, STATES[kind])
    keys = set(fs.find(loc.container))
    now = time.time() + LATER
    t = audit_single(loc, grace=HOUR, now=now)
    assert h.orphans <= {o["path"] for o in t["orphans"]}
    with pytest.raises(DeletionRefused, match="writer state is unreadable"):
        plan_deletion(loc, t.summary, t["orphans"], grace=HOUR, now=now)
    assert set(fs.find(loc.container)) == keys
