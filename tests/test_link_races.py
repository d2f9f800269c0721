"""A link swapped in while the store is using a path (issue 14, threat 49).

The store used to check its tree and then use it: ``lstat`` every component below the
root, then open, create, append to or delete the path by name. Whoever can write under the
root could swap a component for a link in between, and the open or delete followed it
out of the base. Now nothing below the root is looked up by a path: every component is
opened from its parent's descriptor with ``O_NOFOLLOW`` and the last name is acted on
relative to the directory holding it, so there is no window between a check and a use.

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
