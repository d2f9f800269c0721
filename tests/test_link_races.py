"""A link swapped in while the store is using a path (issue 14, threat 49).

A store that checks its tree and then uses it (``lstat`` every component below the
root, then open, create, append to or delete the path by name) leaves a window: whoever
can write under the root can swap a component for a link in between, and the open or
delete follows it out of the base. So nothing below the root is looked up by a path:
every component is opened from its parent's descriptor with ``O_NOFOLLOW`` and the last
name is acted on relative to the directory holding it, so there is no window between a
check and a use.

The test drives the store's one seam for OS calls (``Storage.os``, a ``LocalOS``): a
wrapper counts the calls the store makes and, right after call number ``k`` returns,
renames a directory of the path aside and puts a link to a decoy outside the base in
its place (the decoy holds the same names with other bytes). For every ``k`` from the
first call to past the last, every operation that reads, writes or deletes, and every
directory on the path, nothing outside the base changes and no decoy byte is returned:
the operation is refused (``UnsafePathError`` naming the path and the link), or it acts
on the store's own directory, which it holds open wherever that was moved.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fsspec  # type: ignore[import-untyped]
import pytest

from fastimpl.storage import LocalOS, Storage

OURS = b"ours" * 4
DECOY = b"DECOY" * 4
FILE = "job-0/shared/sub/f"


class _SwapAfter:
    """The ``LocalOS`` seam, counting the calls made through it: right after call number
    ``at`` returns (or fails), ``swap`` runs, once."""

    def __init__(self, real: LocalOS, at: int, swap: Callable[[], None]) -> None:
        self._real = real
        self._at = at
        self._swap = swap
        self.calls = 0
        self.swapped = False

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._real, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            try:
                return attr(*args, **kwargs)
            finally:
                self.calls += 1
                if self.calls == self._at:
                    self._swap()
                    self.swapped = True

        return call


def _read(st: Storage) -> bytes:
    return st.read_range(FILE, 0, len(OURS))


def _create(st: Storage) -> None:
    st.create("job-0/shared/sub/new")
    st.append("job-0/shared/sub/new", 3, b"new")
    st.close("job-0/shared/sub/new")


def _reopen(st: Storage) -> None:
    st.reopen(FILE)
    st.append(FILE, 4, b"more")
    st.close(FILE)


def _metadata(st: Storage) -> None:
    st.write_metadata("job-0/shared/sub/_metadata", b"{}")


def _publish(st: Storage) -> None:
    st.publish("job-0/shared/sub/_writer_state.json", b"{}")


def _unpublish(st: Storage) -> None:
    st.unpublish(FILE)


def _mkdir(st: Storage) -> None:
    st.mkdir("job-0/shared/sub/made")


def _delete_file(st: Storage) -> None:
    st.delete_file(FILE)


def _delete_dir(st: Storage) -> None:
    st.delete_dir("job-0/shared/sub")


OPERATIONS: dict[str, Callable[[Storage], object]] = {
    "read": _read,
    "create": _create,
    "reopen": _reopen,
    "metadata": _metadata,
    "publish": _publish,
    "unpublish": _unpublish,
    "mkdir": _mkdir,
    "delete file": _delete_file,
    "delete dir": _delete_dir,
}


def _tree(top: Path) -> dict[str, bytes | None]:
    """Every entry under ``top``: a file's bytes, None for a directory or a link."""
    return {
        str(p.relative_to(top)): p.read_bytes() if p.is_file() and not p.is_symlink() else None
        for p in sorted(top.rglob("*"))
    }


def _messages(err: BaseException) -> str:
    out = []
    e: BaseException | None = err
    while e is not None:
        out.append(str(e))
        e = e.__cause__ or e.__context__
    return " | ".join(out)


def _run(tmp_path: Path, op: str, component: str, at: int) -> tuple[_SwapAfter, object]:
    """One run in a fresh base: the operation, with ``component`` swapped for a link to a
    decoy right after seam call ``at`` (0: never). Checks that nothing outside changed
    and no decoy byte came back; returns the seam and the outcome (a result or an
    error)."""
    case = tmp_path / f"{op.replace(' ', '-')}-{component.replace('/', '-')}-{at}"
    base, outside = case / "base", case / "outside"
    (base / "job-0/shared/sub").mkdir(parents=True)
    (base / FILE).write_bytes(OURS)
    (base / "job-0/kept").write_bytes(OURS)
    decoy = outside / "decoy"
    shutil.copytree(base / component, decoy)
    for p in decoy.rglob("*"):
        if p.is_file():
            p.write_bytes(DECOY)
    before = _tree(outside)

    def swap() -> None:
        victim = base / component
        if victim.exists():  # not once the operation deleted it: the link goes in alone
            victim.rename(victim.with_name(victim.name + ".moved"))
        victim.symlink_to(decoy, target_is_directory=True)

    st = Storage(fsspec.filesystem("file"), str(base), background_deletes=False)
    seam = _SwapAfter(st.os, at, swap)
    st.os = seam  # type: ignore[assignment]
    outcome: object
    try:
        outcome = OPERATIONS[op](st)
    except Exception as err:
        outcome = err
    finally:
        st.close_all()
    where = f"{op}, {component} swapped after seam call {at}"
    assert _tree(outside) == before, f"{where}: the decoy outside the base changed"
    assert not (isinstance(outcome, bytes) and DECOY[: len(outcome)] == outcome), where
    if op == "read" and isinstance(outcome, bytes):
        assert outcome == OURS, where
    if isinstance(outcome, Exception):
        text = _messages(outcome)
        assert "symbolic link" in text and component in text, f"{where}: {text}"
    return seam, outcome


@pytest.mark.parametrize("component", ["job-0", "job-0/shared", "job-0/shared/sub"])
@pytest.mark.parametrize("op", list(OPERATIONS))
def test_a_link_swapped_in_between_check_and_use_is_never_followed(
    tmp_path: Path, op: str, component: str
) -> None:
    dry, outcome = _run(tmp_path, op, component, 0)
    assert not isinstance(outcome, Exception), outcome  # untouched, the operation works
    calls = dry.calls
    assert calls > 0
    outcomes = []
    for at in range(1, calls + 1):
        seam, outcome = _run(tmp_path, op, component, at)
        assert seam.swapped
        outcomes.append(outcome)
    # The swap did land before a use: the first call opens the root, before any
    # component is reached, so a link planted then is met, and refused (a directory
    # being deleted that is the link itself loses the link only, the decoy untouched).
    if op != "delete dir" or component != "job-0/shared/sub":
        assert isinstance(outcomes[0], Exception), outcomes[0]


# --------------------------------------------------------------------------- the audit
# Issue 32, finding 1: the storage audit's ``--delete-orphans`` plans, then deletes. A
# plan made with lstat and realpath and carried out by full path would follow a directory
# renamed away after the plan and a link (or another directory) put in its place, and
# delete outside the base.

AUDIT_JOB = "job-0"
ORPHAN_DIR = f"{AUDIT_JOB}/shared/src-9-9"
ORPHANS = [f"{ORPHAN_DIR}/o-{i}" for i in range(4)]
OTHER_ORPHAN = f"{AUDIT_JOB}/taskowned/tm-gone/leftover"


def _audit_base(case: Path) -> tuple[Path, Path]:
    """A job base with one checkpoint referencing one live file, four old orphans in
    ``shared/src-9-9`` and one in ``taskowned/tm-gone``; and where the decoy goes."""
    from fastimpl.metadata import encode
    from spec.config import Scope, StateKind
    from spec.handles import SegmentHandle, StateEntry
    from spec.ids import SubtaskId
    from tests.audit_fixtures import old

    root, outside = case / "root", case / "outside"
    live = f"{AUDIT_JOB}/shared/v-0-1/live"
    old(root / live, OURS)
    entry = StateEntry(SubtaskId("v", 0, 1), StateKind.KEYED_SHARED, "s",
                       SegmentHandle(live, 0, len(OURS), "u", Scope.SHARED), 1, (0, 127))
    old(root / AUDIT_JOB / "chk-1" / "_metadata", encode(1, AUDIT_JOB, False, (entry,), ()))
    for rel in [*ORPHANS, OTHER_ORPHAN]:
        old(root / rel, OURS)
    outside.mkdir()
    return root, outside


def _decoy(root: Path, outside: Path, component: str) -> dict[str, bytes | None]:
    """A copy of ``component`` outside the base, the same names with other bytes; its
    tree."""
    decoy = outside / "decoy"
    shutil.copytree(root / component, decoy)
    for p in decoy.rglob("*"):
        if p.is_file():
            p.write_bytes(DECOY)
    return _tree(decoy)


def _swap(root: Path, outside: Path, component: str, kind: str) -> Callable[[], None]:
    """Rename ``component`` aside and put in its place a link to the decoy (``link``) or
    the decoy directory itself, moved in (``directory``: no link anywhere)."""

    def swap() -> None:
        victim = root / component
        victim.rename(victim.with_name(victim.name + ".moved"))
        if kind == "link":
            victim.symlink_to(outside / "decoy", target_is_directory=True)
        else:
            (outside / "decoy").rename(victim)

    return swap


def _decoy_now(root: Path, outside: Path, component: str, kind: str) -> dict[str, bytes | None]:
    return _tree(outside / "decoy" if kind == "link" else root / component)


def _plan(root: Path) -> Any:
    from pipeline.deletion import plan_deletion
    from pipeline.location import Location
    from pipeline.single import audit_single
    from tests.audit_fixtures import HOUR

    loc = Location.parse(str(root / AUDIT_JOB))
    t = audit_single(loc, grace=HOUR)
    plan = plan_deletion(loc, t.summary, t["orphans"], grace=HOUR)
    assert {c.path for c in plan.delete} == {*ORPHANS, OTHER_ORPHAN}
    return loc, plan


SWAPPED = ["job-0/shared", ORPHAN_DIR]


@pytest.mark.parametrize("kind", ["link", "directory"])
@pytest.mark.parametrize("component", SWAPPED)
def test_an_audit_delete_refuses_a_directory_swapped_after_the_plan(
    tmp_path: Path, component: str, kind: str
) -> None:
    """The issue's reproduction, small: the plan is made, then the orphans' directory
    (or ``shared`` above it) is swapped. Nothing outside changes, the swapped files are
    ``skip-unknown`` naming the directory, logged; the file elsewhere still goes."""
    from pipeline.deletion import execute

    root, outside = _audit_base(tmp_path)
    loc, plan = _plan(root)
    before = _decoy(root, outside, component)
    _swap(root, outside, component, kind)()
    log = tmp_path / "log.jsonl"
    out = execute(loc, plan, str(log), rate=0)
    assert _decoy_now(root, outside, component, kind) == before, "a delete followed the swap"
    assert set(out.deleted) == {OTHER_ORPHAN}
    skipped = dict(out.skipped)
    assert set(skipped) == set(ORPHANS)
    assert all(component in why for why in skipped.values()), skipped
    moved = root / (component + ".moved")
    assert all((moved / p[len(component) + 1:]).exists() for p in ORPHANS)
    events = [json.loads(x) for x in log.read_text().splitlines()]
    assert {e["path"] for e in events if e["event"] == "skip-unknown"} == set(ORPHANS)


@pytest.mark.parametrize("kind", ["link", "directory"])
@pytest.mark.parametrize("component", SWAPPED)
def test_an_audit_delete_swapped_at_any_call_never_leaves_the_plan(
    tmp_path: Path, component: str, kind: str
) -> None:
    """The swap after every OS call of the deletion's descriptor walk
    (``pipeline.dirwalk.CALLS``): nothing outside changes, and once a delete met the
    changed directory, no later file of it is deleted (the rest of it is refused)."""
    from pipeline import dirwalk
    from pipeline.deletion import execute

    real = dirwalk.CALLS
    root, outside = _audit_base(tmp_path / "dry")
    loc, plan = _plan(root)
    seam = _SwapAfter(real, 0, lambda: None)  # type: ignore[arg-type]
    dirwalk.CALLS = seam  # type: ignore[assignment]
    try:
        execute(loc, plan, str(tmp_path / "dry.jsonl"), rate=0)
    finally:
        dirwalk.CALLS = real
    assert seam.calls > 0
    for at in range(1, seam.calls + 1):
        case = tmp_path / f"at-{at}"
        root, outside = _audit_base(case)
        loc, plan = _plan(root)
        before = _decoy(root, outside, component)
        seam = _SwapAfter(real, at, _swap(root, outside, component, kind))  # type: ignore[arg-type]
        dirwalk.CALLS = seam  # type: ignore[assignment]
        try:
            out = execute(loc, plan, str(case / "log.jsonl"), rate=0)
        finally:
            dirwalk.CALLS = real
        where = f"{component} swapped for a {kind} after call {at}"
        assert seam.swapped, where
        assert _decoy_now(root, outside, component, kind) == before, f"{where}: decoy changed"
        order = [c.path for c in plan.delete if c.path.startswith(component + "/")]
        refused = [p for p in order if p in dict(out.skipped)]
        if refused:
            first = order.index(refused[0])
            assert set(order[first:]) == set(refused), f"{where}: deleted after a refusal"
