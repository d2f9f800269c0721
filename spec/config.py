"""Configuration values, mirroring Flink's option names and defaults where they exist."""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping

import attrs
from attrs import field, frozen

from spec.errors import UsageError, WrongTypeError
from spec.flink_options import INLINE_THRESHOLD_LIMIT, read_flink, write_flink
from spec.keygroups import UPPER_BOUND_MAX_PARALLELISM as UPPER_BOUND_MAX_PARALLELISM
from spec.restore_mode import RestoreMode as RestoreMode

MIB = 1024 * 1024
MAX_TMS = UPPER_BOUND_MAX_PARALLELISM
"""The most TMs a job is built with (R78). With Flink's default slot sharing a job needs
as many slots as its largest parallelism, at most ``UPPER_BOUND_MAX_PARALLELISM``: no job
needs more TMs than that, even at one slot each."""


class MergingMode(enum.Enum):
    """How checkpoint files are merged (FLIP-306 §4.1.1)."""

    NONE = "none"
    """No merging: one file per handle, owned by the coordinator once acknowledged."""
    WITHIN_CHECKPOINT = "within"
    """A physical file holds segments of one checkpoint only."""
    ACROSS_CHECKPOINT = "across"
    """A pooled physical file stays open across checkpoints until ``max_file_size``."""


class Scope(enum.Enum):
    """SHARED state is merged per subtask, EXCLUSIVE state per TM (FLIP-306 §4.1.2)."""

    SHARED = "shared"
    EXCLUSIVE = "exclusive"


class StateKind(enum.Enum):
    """What a written piece of state is; decides its scope and how it is redistributed."""

    KEYED_SHARED = "keyed_shared"
    """Incremental keyed state (an SST file): SHARED scope, reusable, split by key groups."""
    KEYED_FULL = "keyed_full"
    """A full keyed snapshot: EXCLUSIVE scope, split by key groups."""
    OPERATOR_LIST = "operator_list"
    """Operator list state: its entries are split evenly on rescale (FLIP-8)."""
    OPERATOR_UNION = "operator_union"
    """Union list state: every new subtask gets all of it (FLIP-8)."""
    CHANNEL = "channel"
    """In-flight channel data of unaligned checkpoints: split like list state."""

    @property
    def scope(self) -> Scope:
        return Scope.SHARED if self is StateKind.KEYED_SHARED else Scope.EXCLUSIVE

    @property
    def keyed(self) -> bool:
        return self in (StateKind.KEYED_SHARED, StateKind.KEYED_FULL)


def _positive(_inst: object, attribute: object, value: int) -> None:
    if value < 1:
        raise UsageError(f"{attribute} must be >= 1, got {value}")


def _size(limit: int, bound: str) -> Callable[[object, attrs.Attribute[int], int], None]:
    """R78: a job size in 1 .. ``limit``, refused when the value is made (an engine
    builds every TM and subtask: a size past what it can build would hang, not fail)."""

    def check(inst: object, attribute: attrs.Attribute[int], value: int) -> None:
        if not 1 <= value <= limit:
            name = getattr(inst, "name", None)
            who = f"vertex {name!r}: " if isinstance(name, str) else ""
            raise UsageError(
                f"{who}{attribute.name} must be in 1 .. {limit} ({bound}), got {value} (R78)"
            )

    return check


def _inline_threshold(_inst: object, attribute: object, value: int) -> None:
    if not 0 <= value <= INLINE_THRESHOLD_LIMIT:
        raise UsageError(
            f"inline_threshold must be in 0 .. {INLINE_THRESHOLD_LIMIT} (1 MiB, Flink's bound),"
            f" got {value}"
        )


_MAX_PARALLELISM = _size(UPPER_BOUND_MAX_PARALLELISM, "Flink's upper bound on a parallelism, 2**15")


@frozen
class Config:
    """Checkpoint storage options, named after Flink's keys (Flink 1.20 and 2.x,
    ``CheckpointingOptions``, ``StateRecoveryOptions``, ``PipelineOptions``).

    ``Config.from_flink`` reads them from a Flink configuration and ``to_flink`` writes them
    back; ``spec.flink_options.FLINK_OPTIONS`` is the one table of key -> field both use."""

    file_merging_enabled: bool = False
    """execution.checkpointing.file-merging.enabled (Flink default: false)."""
    across_checkpoint_boundary: bool = False
    """execution.checkpointing.file-merging.across-checkpoint-boundary (default: false)."""
    max_file_size: int = field(default=32 * MIB, validator=_positive)
    """execution.checkpointing.file-merging.max-file-size, in bytes (a MemorySize in Flink;
    default "32MB", i.e. 32 MiB)."""
    max_space_amplification: float = 2.0
    """execution.checkpointing.file-merging.max-space-amplification (default 2.0; < 1
    disables)."""
    num_retained: int = field(default=1, validator=_positive)
    """execution.checkpointing.num-retained (default 1; deprecated key
    state.checkpoints.num-retained)."""
    max_parallelism: int = field(default=128, validator=_MAX_PARALLELISM)
    """Number of key groups (pipeline.max-parallelism; ours defaults to 128, Flink's -1
    derives it from the parallelism); at most ``UPPER_BOUND_MAX_PARALLELISM`` (R78)."""
    restore_mode: RestoreMode = RestoreMode.NO_CLAIM
    """execution.state-recovery.claim-mode (default NO_CLAIM; deprecated key
    execution.savepoint-restore-mode). Flink 1.x's LEGACY mode is not supported."""
    pool_blocking: bool = False
    """execution.checkpointing.file-merging.pool-blocking (default false). Flink's non-blocking
    pool opens another physical file when the pooled one is busy with another stream.
    fastimpl's streams hold their bytes until they are closed and append them under the
    store's lock, so a pooled file is never busy when a stream closes: both values write
    the same files (the blocking pool's count, without its waiting). Not in the model."""
    inline_threshold: int = field(default=0, validator=_inline_threshold)
    """state.storage.fs.memory-threshold, in bytes (deprecated key
    state.backend.fs.memory-threshold; Flink's default 20 KB, ours 0: off, every write
    makes a file unless asked). Private state smaller than this is carried inline, in
    the acknowledgement and the ``_metadata``, not written to a file (R107); at most
    1 MiB, Flink's bound."""
    open_files_readable: bool = True
    """Whether flushed bytes of a still-open file are durable and readable on the file
    system (local, HDFS: yes; object stores: no, a file appears only on close). Ours: no
    Flink key (pass it to ``from_flink`` as an override)."""

    def __attrs_post_init__(self) -> None:
        if self.merging_mode is MergingMode.ACROSS_CHECKPOINT and not self.open_files_readable:
            raise UsageError(
                "across-checkpoint-boundary file merging needs a file system where flushed "
                "bytes of an open file are durable and readable; this one (an object store?) "
                "shows a file only once it is closed: use within-checkpoint merging (R16)"
            )

    @property
    def merging_mode(self) -> MergingMode:
        if not self.file_merging_enabled:
            return MergingMode.NONE
        if self.across_checkpoint_boundary:
            return MergingMode.ACROSS_CHECKPOINT
        return MergingMode.WITHIN_CHECKPOINT

    @property
    def amplification_bound(self) -> float | None:
        """The bound on space amplification, or None where it is disabled (< 1, R82)."""
        return self.max_space_amplification if self.max_space_amplification >= 1 else None

    @classmethod
    def for_mode(cls, mode: MergingMode, **kwargs: object) -> Config:
        """A configuration for one merging mode; other options as keyword arguments."""
        return cls(
            file_merging_enabled=mode is not MergingMode.NONE,
            across_checkpoint_boundary=mode is MergingMode.ACROSS_CHECKPOINT,
            **kwargs,  # type: ignore[arg-type]
        )

    @classmethod
    def from_flink(
        cls, options: Mapping[str, object], *, ignore_unknown: bool = False, **overrides: object
    ) -> Config:
        """The configuration a Flink configuration sets: the keys of ``FLINK_OPTIONS``.

        ``options`` is a flat Flink configuration (``-D key=value``, a flink-conf.yaml or
        config.yaml flattened to dotted keys): values are strings, parsed by Flink's rules
        (booleans ``true``/``false`` in any case, MemorySize like ``MemorySize.parse``, the
        claim mode by name in any case; surrounding whitespace ignored), or already typed
        Python values (bool, int, float, ``RestoreMode``; an int is bytes for a MemorySize).
        A key not given keeps the field's default. A deprecated key is read when its key is
        absent; when both are given the key wins and the deprecated one is not read
        (Flink's rule). ``overrides`` are field values applied last (``open_files_readable``
        has no Flink key); the field validators and the ACROSS check run as for ``Config()``.

        Raises ValueError: naming the key and the value, for a value that does not parse
        or that the field refuses; for an unknown key in ``FLINK_FILE_MERGING_PREFIX`` (a
        typo: refused even with ``ignore_unknown``) or in the pre-release namespace
        ``state.checkpoints.file-merging.``; for any other key outside the table (the rest
        of a Flink configuration) unless ``ignore_unknown``. TypeError for an override that
        is not a field."""
        values = read_flink(options, ignore_unknown=ignore_unknown)
        fields = {a.name for a in attrs.fields(cls)}
        stray = sorted(set(overrides) - fields)
        if stray:
            raise WrongTypeError(
                f"Config.from_flink() got unexpected override(s) {', '.join(stray)}; "
                f"the fields are {', '.join(sorted(fields))}"
            )
        values.update(overrides)
        return cls(**values)  # type: ignore[arg-type]

    def to_flink(self) -> dict[str, str]:
        """The Flink keys of ``FLINK_OPTIONS`` with their values as Flink prints them
        (``true``, ``32 mb``, ``2.0``, ``NO_CLAIM``); ``open_files_readable`` has no key.
        ``Config.from_flink(cfg.to_flink()) == cfg`` when ``cfg.open_files_readable``.
        Raises ValueError for a value Flink cannot hold (an int option past 2**31 - 1, a
        size past 2**63 - 1 bytes, a NaN amplification)."""
        return write_flink({a.name: getattr(self, a.name) for a in attrs.fields(type(self))})


@frozen
class VertexSpec:
    """A vertex of the job graph and its parallelism."""

    name: str
    parallelism: int = field(validator=_MAX_PARALLELISM)
    """At most ``UPPER_BOUND_MAX_PARALLELISM``, and at most the job's max parallelism
    (``check_parallelism``, where a job meets its configuration) (R78)."""


@frozen
class JobSpec:
    """The job's vertices and how many task managers host its subtasks."""

    vertices: tuple[VertexSpec, ...]
    num_tms: int = field(
        default=2, validator=_size(MAX_TMS, "one per slot of the largest parallelism")
    )

    def __attrs_post_init__(self) -> None:
        names = [v.name for v in self.vertices]
        if not names or len(set(names)) != len(names):
            raise UsageError(f"vertex names must be non-empty and unique: {names}")


def check_parallelism(config: Config, vertices: tuple[VertexSpec, ...]) -> None:
    """R78: every vertex's parallelism is at most the max parallelism (Flink's "Maximum
    parallelism must not be smaller than parallelism"): key group ``g`` goes to subtask
    ``g * p // max_parallelism`` (R75), so a subtask past the max parallelism would get
    no key group. Both parties check it where they are made with a job and its
    configuration, before anything is built or written."""
    for v in vertices:
        if v.parallelism > config.max_parallelism:
            raise UsageError(
                f"vertex {v.name!r}: parallelism {v.parallelism} is more than the max"
                f" parallelism {config.max_parallelism}: it must be at most that (R78)"
            )
