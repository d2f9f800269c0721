"""What an implementation shows of itself after a command: the files on storage and the
bookkeeping that decides who may delete them. Two implementations that agree on every
observation after every command are equivalent for this project."""

from __future__ import annotations

from collections.abc import Mapping

from attrs import field, frozen

from spec.handles import StateEntry


def _frozen_map(value: Mapping[str, object]) -> Mapping[str, object]:
    return dict(sorted(value.items()))


@frozen
class RetainedView:
    """A retained checkpoint with its handles resolved to the bytes they stand for."""

    checkpoint: int
    job: str
    metadata: str
    entries: tuple[StateEntry, ...]
    directories: tuple[str, ...]


@frozen
class RegistryView:
    """One entry of the coordinator's shared-state registry (R30-R33)."""

    path: str
    refs: frozenset[int]
    owned: bool
    """True when the coordinator deletes the file (NONE mode, directories)."""


@frozen
class DeletionRecord:
    path: str
    actor: str
    owner: str | None
    """The owner of the path when it was deleted; None if nobody owned it."""
    existed: bool
    protected: bool
    """The path was outside every base the actor may delete in, or belongs to the user."""


@frozen(eq=True)
class Observation:
    files: Mapping[str, int] = field(converter=_frozen_map)
    """Every file that exists on storage, with its size in bytes."""
    open_files: frozenset[str]
    directories: Mapping[str, str] = field(converter=_frozen_map)
    """Managed directories that exist, with their owner."""
    owners: Mapping[str, str] = field(converter=_frozen_map)
    """The owner of each existing file (a file with no owner is missing here)."""
    claims: Mapping[str, frozenset[str]] = field(converter=_frozen_map)
    """For each path, the live parties whose bookkeeping says they own it."""
    retained: tuple[RetainedView, ...]
    restoring: tuple[StateEntry, ...]
    """What the subtasks of the running job restored from, until its first checkpoint."""
    ref_counts: Mapping[str, int] = field(converter=_frozen_map)
    """Physical file -> the ref count its manager keeps."""
    live_segments: Mapping[str, tuple[tuple[int, int], ...]] = field(converter=_frozen_map)
    """Physical file -> (offset, length) of each live segment in the manager's segment table."""
    registry: Mapping[str, RegistryView] = field(converter=_frozen_map)
    deletions: tuple[DeletionRecord, ...]
    pending_deletes: tuple[str, ...]
    """Deletions that failed or wait for a lost attempt to stop: reported, not forgotten."""
    pool_files: frozenset[str]
    """Files open in the pool of a live TM."""
    metadata_files: frozenset[str]
    live_parties: frozenset[str]
    """``coordinator`` and ``tm:<id>`` of every TM alive in the running job."""


@frozen
class WorkingFileView:
    """One existing working file of disaggregated state (§11): written whole (R101). What a
    failed write left is no working file: only its attempt's pending delete (R45)."""

    owner: str
    state: str
    """``private`` (its attempt's, no snapshot refers to it), ``pinned`` (its attempt's, an
    unacknowledged snapshot refers to it) or ``shared`` (an acknowledgement referred to it:
    the coordinator's, R100; a zombie's acknowledgement, ignored, leaves it the zombie's
    until it stopped, R103)."""
    users: frozenset[str]
    """The live databases that use it, as ``<subtask>@tm:<id>``."""
    refs: frozenset[int]
    """Checkpoints, pending or retained, whose acknowledgements refer to it in place."""


@frozen
class WorkingObservation:
    """What a model shows of its working files (§11): states, users and in-place
    references, which the invariants I6 and I7 judge. Kept apart from ``Observation``,
    whose stored form the conformance corpus holds: an implementation shows its working
    files there as files with owners (the lockstep machine compares those) and its
    collection's outcome as deletions."""

    files: Mapping[str, WorkingFileView] = field(converter=_frozen_map)
    uses: Mapping[str, frozenset[str]] = field(converter=_frozen_map)
    """Every live database (``<subtask>@tm:<id>``) -> the files it uses."""
    retained: Mapping[int, frozenset[str]]
    """Every retained checkpoint -> the working files it refers to in place."""
    operators: Mapping[str, str] = field(converter=_frozen_map)
    """Every live database (as in ``uses``) -> the operator (vertex) of its subtask: I7
    asks that it use files of that operator's working directories only (R105)."""
