"""Two runs on one base (issue 14, defect 4): a second ``CheckpointStore`` opened on a base
that holds a job, taking the same id, would overwrite its ``_metadata``, delete its kept
checkpoint at its next subsume, and with ``cancel(retain=False)`` delete the first run's
directories recursively without a deletion record.

So opening a base that holds a job is refused unless the caller asks for a fresh id
(``on_existing="fresh-id"``: a new job beside the old, whose files are never touched);
the store keeps a lease at the root and checks it before every ``_metadata`` write and
every delete, so a store whose base was taken over (a fresh-id open, a ``recover``) stops
changing anything; and a directory delete removes only files the store knows it wrote,
each with a deletion record. Local files, ``memory://`` (every merging mode) and S3 via
moto (WITHIN; ACROSS is refused there, R16).
"""

# ruff: noqa: F811 (pytest fixtures imported above are test parameters of the same name)

from __future__ import annotations

import pytest

from fastimpl import BaseInUseError, CheckpointStore, FencedError, testing
from spec.config import Config, MergingMode
from spec.layout import job_base
from tests.faultyfs import Place
from tests.storage_settings import (
    JOB,
    Listing,
    _checkpoint,
    _listing,
    _options,
    mode,  # noqa: F401
    place,  # noqa: F401
    setting,  # noqa: F401
)


def _config(mode: MergingMode) -> Config:
    return Config.for_mode(mode, num_retained=1)


def _open(place: Place, mode: MergingMode, **kw: object) -> CheckpointStore:
    store = CheckpointStore(
        place.url,
        _config(mode),
        JOB,
        storage_options=_options(place),
        **kw,  # type: ignore[arg-type]
    )
    testing.keep_deletion_log(store)  # the tests compare what went with what was deleted
    return store


def _under(listing: Listing, base: str) -> Listing:
    return {p: v for p, v in listing.items() if p == base or p.startswith(base + "/")}


def _kept(before: Listing, after: Listing) -> None:
    """Every file of ``before`` is still there with its bytes (an ACROSS pooled file the
    fenced writer still had open may have grown: appends never touch earlier bytes)."""
    for p, (kind, _, data) in before.items():
        assert p in after, p
        if kind == "file":
            got = after[p][2]
            assert got is not None and data is not None and got[: len(data)] == data, p


def _only_the_zombies_new_files(store: CheckpointStore, known: Listing) -> None:
    """The store's invariants hold but for files a fenced writer made after the store
    read the base (I3: nobody the store knows owns them; a later recovery collects them)."""
    for v in testing.check_invariants(store):
        assert v.invariant == "I3" and v.detail.split()[0] not in known, v


def _first_run(place: Place, mode: MergingMode) -> tuple[CheckpointStore, Listing]:
    a = _open(place, mode)
    assert a.job_id == "job-0"
    for _ in range(2):
        assert _checkpoint(a) is not None
    return a, _under(_listing(place), job_base("job-0"))


def test_a_second_store_on_a_base_with_a_job_is_refused(place: Place, mode: MergingMode) -> None:
    a, _ = _first_run(place, mode)
    a.coordinator.cancel(retain=True)
    a.close()
    before = _listing(place)
    with pytest.raises(BaseInUseError, match=r"holds job-0.*on_existing='fresh-id'.*recover"):
        _open(place, mode)
    assert _listing(place) == before


def test_a_fresh_id_never_touches_the_first_run(place: Place, mode: MergingMode) -> None:
    """The issue's sequence with ``on_existing="fresh-id"``: the second run checkpoints,
    subsumes and cancels with ``retain=False``; the first run's retained checkpoint is
    there byte for byte, and every file the second run removed has a deletion record."""
    a, kept = _first_run(place, mode)
    a.coordinator.cancel(retain=True)
    a.close()
    b = _open(place, mode, on_existing="fresh-id")
    assert b.job_id == "job-1"
    for _ in range(3):
        assert _checkpoint(b) is not None
    mine = set(_under(_listing(place), job_base("job-1")))
    b.coordinator.cancel(retain=False)
    b.flush()
    after = _listing(place)
    assert _under(after, job_base("job-0")) == kept
    deleted = {d.path for d in testing.observe(b).deletions}
    gone = {p for p in mine if p not in after and after.get(p) is None}
    files_gone = {p for p in gone if not p.endswith("/")} - {
        p for p in gone if any(q.startswith(p + "/") for q in mine)
    }
    assert files_gone <= deleted, sorted(files_gone - deleted)
    assert testing.check_invariants(b) == []
    b.close()


def test_a_store_whose_base_was_taken_over_changes_nothing(place: Place, mode: MergingMode) -> None:
    """The first run still runs when a second takes the base (a fresh-id open): the first
    run's metadata writes and deletes are fenced; what it had is kept."""
    a, _ = _first_run(place, mode)
    b = _open(place, mode, on_existing="fresh-id")
    before_a = _under(_listing(place), job_base("job-0"))
    assert _checkpoint(a) is None  # its _metadata write was fenced: aborted (R51)
    a.flush()
    _kept(before_a, _listing(place))
    assert a.delete_failures()
    assert all(isinstance(f.error, FencedError) for f in a.delete_failures())
    assert _checkpoint(b) is not None
    a.close()
    b.close()


def test_a_recovered_store_is_fenced_when_another_takes_the_base(
    place: Place, mode: MergingMode
) -> None:
    """The store a recovery returns holds the lease the recovery took: once another
    store takes the base, its metadata writes and deletes are fenced and what it had is
    kept."""
    a, _ = _first_run(place, mode)
    a.close()
    b, _ = CheckpointStore.recover(place.url, _config(mode), JOB, storage_options=_options(place))
    assert _checkpoint(b) is not None
    c = _open(place, mode, on_existing="fresh-id")
    before = _under(_listing(place), job_base(b.job_id))
    assert _checkpoint(b) is None
    b.flush()
    _kept(before, _listing(place))
    # ACROSS keeps the aborted checkpoint's pooled files: nothing to delete there
    assert b.delete_failures() or mode is MergingMode.ACROSS_CHECKPOINT
    assert all(isinstance(f.error, FencedError) for f in b.delete_failures())
    assert _checkpoint(c) is not None
    b.close()
    c.close()


def test_recover_fences_a_writer_still_running(place: Place, mode: MergingMode) -> None:
    a, _ = _first_run(place, mode)
    b, report = CheckpointStore.recover(
        place.url, _config(mode), JOB, storage_options=_options(place)
    )
    testing.keep_deletion_log(b)
    assert report.checkpoints == (2,)
    known = _listing(place)
    assert _checkpoint(a) is None  # the zombie coordinator can no longer complete
    a.flush()
    assert a.delete_failures()
    assert all(isinstance(f.error, FencedError) for f in a.delete_failures())
    _kept(known, _listing(place))
    _only_the_zombies_new_files(b, known)
    assert _checkpoint(b) is not None
    _only_the_zombies_new_files(b, known)
    a.close()
    b.close()


def test_two_stores_opened_on_an_empty_base(place: Place, mode: MergingMode) -> None:
    """The second store on a base the first has opened but not yet written to is refused
    too: the lease marks the base as taken."""
    a = _open(place, mode)
    with pytest.raises(BaseInUseError, match="lease"):
        _open(place, mode)
    a.close()


def test_a_directory_delete_keeps_files_the_store_did_not_write(
    place: Place, mode: MergingMode
) -> None:
    """A file planted in a directory the store deletes recursively (another run's, a
    user's) survives; the store's own files there go, each with a deletion record."""
    a, _ = _first_run(place, mode)
    owned = f"{place.root}/{job_base('job-0')}/taskowned"
    listing = _listing(place)
    tm_dirs = sorted(
        {p.split("/")[2] for p in listing if p.startswith("job-0/taskowned/") and p.count("/") > 2}
    )
    planted = [f"{owned}/{t}/not-the-stores" for t in tm_dirs] + [
        f"{place.root}/job-0/shared/src-0-2/not-the-stores"
    ]
    for p in planted:
        place.inner.pipe_file(p, b"precious")
    a.coordinator.cancel(retain=False)
    a.flush()
    for p in planted:
        assert place.inner.cat_file(p) == b"precious", p
    after = _listing(place)
    deleted = {d.path for d in testing.observe(a).deletions}
    for p in listing:
        if listing[p][0] == "file" and p not in after:
            assert p in deleted, p
    # each by its owner (I5): the one-by-one deletes name who deleted, as a whole one does
    assert [v for v in testing.check_invariants(a) if v.invariant == "I5"] == []
    a.close()


@pytest.mark.parametrize("value", ["overwrite", "continue", "", None, "FRESH-ID"])
def test_an_unknown_on_existing_is_refused_before_anything_changes(
    place: Place, mode: MergingMode, value: object
) -> None:
    """Only the two documented answers are taken: anything else (a guess at "continue"
    or "overwrite" included) is refused naming the value, with the base untouched."""
    a, _ = _first_run(place, mode)
    a.coordinator.cancel(retain=True)
    a.close()
    before = _listing(place)
    with pytest.raises(ValueError, match=r"on_existing must be 'refuse' or 'fresh-id'"):
        _open(place, mode, on_existing=value)
    assert _listing(place) == before
