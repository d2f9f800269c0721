"""Configuration values, mirroring Flink's option names and defaults where they exist."""

from __future__ import annotations

import difflib
import enum
import math
import re
from collections.abc import Callable, Mapping

import attrs
from attrs import field, frozen

MIB = 1024 * 1024


class MergingMode(enum.Enum):
    """How checkpoint files are merged (FLIP-306 §4.1.1)."""

    NONE = "none"
    """No merging: one file per handle, owned by the coordinator once acknowledged."""
    WITHIN_CHECKPOINT = "within"
    """A physical file holds segments of one checkpoint only."""
    ACROSS_CHECKPOINT = "across"
    """A pooled physical file stays open across checkpoints until ``max_file_size``."""


class RestoreMode(enum.Enum):
    """Who owns a restored checkpoint (FLIP-193)."""

    CLAIM = "claim"
    NO_CLAIM = "no_claim"


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
        raise ValueError(f"{attribute} must be >= 1, got {value}")


@frozen
class Config:
    """Checkpoint storage options, named after Flink's keys (Flink 1.20 and 2.x,
    ``CheckpointingOptions``, ``StateRecoveryOptions``, ``PipelineOptions``).

    ``Config.from_flink`` reads them from a Flink configuration and ``to_flink`` writes them
    back; ``FLINK_OPTIONS`` is the one table of key -> field both use."""

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
    max_parallelism: int = field(default=128, validator=_positive)
    """Number of key groups (pipeline.max-parallelism; ours defaults to 128, Flink's -1
    derives it from the parallelism)."""
    restore_mode: RestoreMode = RestoreMode.NO_CLAIM
    """execution.state-recovery.claim-mode (default NO_CLAIM; deprecated key
    execution.savepoint-restore-mode). Flink 1.x's LEGACY mode is not supported."""
    pool_blocking: bool = False
    """execution.checkpointing.file-merging.pool-blocking (default false). Flink's non-blocking
    pool opens another physical file when the pooled one is busy with another stream.
    fastimpl's streams hold their bytes until they are closed and append them under the
    store's lock, so a pooled file is never busy when a stream closes: both values write
    the same files (the blocking pool's count, without its waiting). Not in the model."""
    open_files_readable: bool = True
    """Whether flushed bytes of a still-open file are durable and readable on the file
    system (local, HDFS: yes; object stores: no, a file appears only on close). Ours: no
    Flink key (pass it to ``from_flink`` as an override)."""

    def __attrs_post_init__(self) -> None:
        if self.merging_mode is MergingMode.ACROSS_CHECKPOINT and not self.open_files_readable:
            raise ValueError(
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
        unknown: list[str] = []
        for key in options:
            if not isinstance(key, str):
                raise TypeError(f"Flink option keys are strings, got {key!r}")
            if key in _FLINK_KEYS:
                continue
            _refuse_misspelt_file_merging_key(key)
            unknown.append(key)
        if unknown and not ignore_unknown:
            raise ValueError(
                f"unknown Flink option(s) {', '.join(map(repr, sorted(unknown)))}: this store "
                f"reads only {', '.join(_known_keys())}; pass ignore_unknown=True to skip the "
                "rest of a Flink configuration"
            )
        values: dict[str, object] = {}
        for option in FLINK_OPTIONS:
            for key in option.keys:  # the key first: it wins over its deprecated keys
                if key in options:
                    values[option.field_name] = option.parse(key, options[key])
                    break
        fields = {a.name for a in attrs.fields(cls)}
        stray = sorted(set(overrides) - fields)
        if stray:
            raise TypeError(
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
        return {
            option.key: option.format(getattr(self, option.field_name)) for option in FLINK_OPTIONS
        }


# --- Flink configuration keys -------------------------------------------------------------

FLINK_FILE_MERGING_PREFIX = "execution.checkpointing.file-merging."
"""The namespace of Flink's file merging options (FLIP-306), all of which this store models
or knows: an unknown key in it is a typo."""
_PRE_RELEASE_FILE_MERGING_PREFIX = "state.checkpoints.file-merging."
FLINK_UNMODELLED_FILE_MERGING_KEYS = frozenset(
    {"execution.checkpointing.file-merging.max-subtasks-per-file"}
)
"""Real Flink keys in the file merging namespace that this store does not model (Flink 2.x
declares max-subtasks-per-file, undocumented and not implemented): treated like the rest of a
Flink configuration, refused unless ``ignore_unknown``."""
_INT_MAX = 2**31 - 1
_LONG_MAX = 2**63 - 1


class _BadValue(ValueError):
    """A value that does not parse; ``FlinkOption.parse`` adds the key and the value."""


@frozen
class FlinkOption:
    """One Flink key read into (and written from) one ``Config`` field."""

    key: str
    field_name: str
    kind: str
    """``bool``, ``int``, ``float``, ``memory`` (a MemorySize, in bytes) or ``claim-mode``."""
    deprecated_keys: tuple[str, ...] = ()
    hint: str = ""
    """Added to the message for a bad value."""

    @property
    def keys(self) -> tuple[str, ...]:
        """The key, then its deprecated keys: Flink's order of precedence."""
        return (self.key, *self.deprecated_keys)

    def parse(self, key: str, value: object) -> object:
        """The field value for ``value`` given under ``key`` (this key or a deprecated one)."""
        try:
            return _PARSERS[self.kind](value)
        except _BadValue as e:
            raise ValueError(f"Flink option {key}: bad value {value!r}: {e}{self.hint}") from None

    def format(self, value: object) -> str:
        """``value`` as Flink prints it."""
        try:
            return _FORMATTERS[self.kind](value)
        except _BadValue as e:
            raise ValueError(
                f"Config.{self.field_name} = {value!r} has no {self.key}: {e}"
            ) from None


FLINK_OPTIONS: tuple[FlinkOption, ...] = (
    FlinkOption("execution.checkpointing.file-merging.enabled", "file_merging_enabled", "bool"),
    FlinkOption(
        "execution.checkpointing.file-merging.across-checkpoint-boundary",
        "across_checkpoint_boundary",
        "bool",
    ),
    FlinkOption("execution.checkpointing.file-merging.max-file-size", "max_file_size", "memory"),
    FlinkOption("execution.checkpointing.file-merging.pool-blocking", "pool_blocking", "bool"),
    FlinkOption(
        "execution.checkpointing.file-merging.max-space-amplification",
        "max_space_amplification",
        "float",
    ),
    FlinkOption(
        "execution.checkpointing.num-retained",
        "num_retained",
        "int",
        deprecated_keys=("state.checkpoints.num-retained",),
    ),
    FlinkOption(
        "execution.state-recovery.claim-mode",
        "restore_mode",
        "claim-mode",
        deprecated_keys=("execution.savepoint-restore-mode",),
    ),
    FlinkOption(
        "pipeline.max-parallelism",
        "max_parallelism",
        "int",
        hint=" (the number of key groups; Flink's -1, derive it from the parallelism, has no"
        " equivalent here)",
    ),
)
"""Flink key -> ``Config`` field: the one table ``from_flink``, ``to_flink`` and the README's
configuration table (checked by model_tests/test_config.py) follow."""

_FLINK_KEYS: dict[str, FlinkOption] = {k: o for o in FLINK_OPTIONS for k in o.keys}


def _known_keys() -> list[str]:
    return [
        o.key + (f" (or {', '.join(o.deprecated_keys)})" if o.deprecated_keys else "")
        for o in FLINK_OPTIONS
    ]


def _refuse_misspelt_file_merging_key(key: str) -> None:
    """Raise for a key in the file merging namespace that is not a Flink option (a typo), or
    in the pre-release namespace Flink never released."""
    if key.startswith(_PRE_RELEASE_FILE_MERGING_PREFIX):
        released = FLINK_FILE_MERGING_PREFIX + key.removeprefix(_PRE_RELEASE_FILE_MERGING_PREFIX)
        hint = (
            f"use {released}"
            if released in _FLINK_KEYS
            else f"released Flink names these {FLINK_FILE_MERGING_PREFIX}*"
        )
        raise ValueError(
            f"Flink option {key!r} is a pre-release name of FLIP-306 that no released Flink "
            f"reads: {hint}"
        )
    if key.startswith(FLINK_FILE_MERGING_PREFIX) and key not in FLINK_UNMODELLED_FILE_MERGING_KEYS:
        known = sorted(k for k in _FLINK_KEYS if k.startswith(FLINK_FILE_MERGING_PREFIX))
        close = difflib.get_close_matches(key, known, n=1)
        raise ValueError(
            f"unknown file merging option {key!r}"
            + (f" (did you mean {close[0]!r}?)" if close else "")
            + f"; the known ones are {', '.join(known)}"
        )


def _parse_bool(value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("true", "false"):
            return text == "true"
    raise _BadValue("expected true or false (case-insensitive)")


_JAVA_INT = re.compile(r"[+-]?[0-9]+")


def _parse_int(value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str) and _JAVA_INT.fullmatch(value.strip()):
        number = int(value.strip())
    else:
        raise _BadValue("expected an integer")
    if number > _INT_MAX or number < -_INT_MAX - 1:
        raise _BadValue("overflows Flink's (Java) int")
    if number < 1:
        raise _BadValue("must be at least 1")
    return number


# Java's Float.parseFloat, decimal forms: 2, 2.0, .5, 1e3, 2f, 2.5d, NaN, Infinity.
_JAVA_FLOAT = re.compile(
    r"[+-]?(?:NaN|Infinity|(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?[fFdD]?)"
)


def _parse_float(value: object) -> float:
    if isinstance(value, float):
        number = value
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            raise _BadValue("too large for a float") from None
    elif isinstance(value, str) and _JAVA_FLOAT.fullmatch(value.strip()):
        number = float(value.strip().rstrip("fFdD"))
    else:
        raise _BadValue(
            "expected a number such as 2.0 (a float, as Flink's Float.parseFloat reads)"
        )
    if math.isnan(number):
        raise _BadValue("NaN bounds nothing; use a value below 1 to disable the bound")
    return number


# MemorySize.MemoryUnit: the units of each multiplier, in the order MemorySize prints them.
_MEMORY_UNITS: tuple[tuple[int, tuple[str, ...]], ...] = (
    (1, ("b", "bytes")),
    (1 << 10, ("k", "kb", "kibibytes")),
    (1 << 20, ("m", "mb", "mebibytes")),
    (1 << 30, ("g", "gb", "gibibytes")),
    (1 << 40, ("t", "tb", "tebibytes")),
)
_MEMORY_MULTIPLIER = {unit: mult for mult, units in _MEMORY_UNITS for unit in units}
_MEMORY_SIZE = re.compile(r"([0-9]+)\s*(.*)", re.S)


def _parse_memory(value: object) -> int:
    """Flink's ``MemorySize.parseBytes``: digits, optional whitespace, an optional binary unit
    (any case); no sign, no fraction. A typed int is bytes, as Flink reads its string."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str):
        raise _BadValue("expected a memory size such as 32mb")
    m = _MEMORY_SIZE.fullmatch(value.strip())
    if m is None:
        raise _BadValue("a memory size starts with a number of units, such as 32mb or 1024")
    unit = m.group(2).lower()
    if unit and unit not in _MEMORY_MULTIPLIER:
        units = " / ".join(f"({' | '.join(u)})" for _, u in _MEMORY_UNITS)
        raise _BadValue(f"unit {m.group(2)!r} is none of the memory units {units}")
    size = int(m.group(1)) * _MEMORY_MULTIPLIER.get(unit, 1)
    if size > _LONG_MAX:
        raise _BadValue("overflows a 64-bit number of bytes")
    if size < 1:
        raise _BadValue("a physical file holds at least 1 byte")
    return size


def _parse_claim_mode(value: object) -> RestoreMode:
    if isinstance(value, RestoreMode):
        return value
    if isinstance(value, str):
        name = value.strip().upper()
        if name == "LEGACY":
            raise _BadValue(
                "LEGACY (Flink 1.x, removed in 2.0) is not supported: only CLAIM and NO_CLAIM"
            )
        for mode in RestoreMode:
            if mode.name == name:
                return mode
    raise _BadValue("expected CLAIM or NO_CLAIM (case-insensitive)")


def _format_bool(value: object) -> str:
    if not isinstance(value, bool):
        raise _BadValue("not a bool")
    return "true" if value else "false"


def _format_int(value: object) -> str:
    if not isinstance(value, int) or isinstance(value, bool) or value > _INT_MAX:
        raise _BadValue(f"Flink's option is a Java int (at most {_INT_MAX})")
    return str(value)


def _format_float(value: object) -> str:
    if not isinstance(value, int | float) or isinstance(value, bool) or math.isnan(value):
        raise _BadValue("not a number")
    if math.isinf(value):
        return "Infinity" if value > 0 else "-Infinity"
    return repr(float(value))


def _format_memory(value: object) -> str:
    """``MemorySize.toString``: the largest unit that divides the size exactly, with its
    second name (``32 mb``); a multiple of 1 TiB prints in bytes, as Flink's does."""
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= _LONG_MAX:
        raise _BadValue(f"a MemorySize is 0 to {_LONG_MAX} bytes")
    chosen = _MEMORY_UNITS[0]
    for i, unit in enumerate(_MEMORY_UNITS):
        if value % unit[0] != 0:
            chosen = _MEMORY_UNITS[max(i - 1, 0)]
            break
    return f"{value // chosen[0]} {chosen[1][1]}"


def _format_claim_mode(value: object) -> str:
    if not isinstance(value, RestoreMode):
        raise _BadValue("not a RestoreMode")
    return value.name


_PARSERS: dict[str, Callable[[object], object]] = {
    "bool": _parse_bool,
    "int": _parse_int,
    "float": _parse_float,
    "memory": _parse_memory,
    "claim-mode": _parse_claim_mode,
}
_FORMATTERS: dict[str, Callable[[object], str]] = {
    "bool": _format_bool,
    "int": _format_int,
    "float": _format_float,
    "memory": _format_memory,
    "claim-mode": _format_claim_mode,
}


@frozen
class VertexSpec:
    """A vertex of the job graph and its parallelism."""

    name: str
    parallelism: int = field(validator=_positive)


@frozen
class JobSpec:
    """The job's vertices and how many task managers host its subtasks."""

    vertices: tuple[VertexSpec, ...]
    num_tms: int = field(default=2, validator=_positive)

    def __attrs_post_init__(self) -> None:
        names = [v.name for v in self.vertices]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"vertex names must be non-empty and unique: {names}")
