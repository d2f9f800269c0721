"""Flink's configuration keys for :class:`spec.config.Config`: the one table of key ->
field (``FLINK_OPTIONS``), and how values are read and printed by Flink's rules.

``Config.from_flink`` and ``Config.to_flink`` are the entry points; they call
``read_flink`` and ``write_flink`` here.
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Callable, Mapping

from attrs import frozen

from spec.errors import UsageError, WrongTypeError
from spec.keygroups import UPPER_BOUND_MAX_PARALLELISM
from spec.restore_mode import RestoreMode

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
    """``bool``, ``int``, ``float``, ``memory`` (a MemorySize of at least 1 byte, a file
    size), ``memory-threshold`` (a MemorySize of 0 to 1 MiB) or ``claim-mode``."""
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
            raise UsageError(f"Flink option {key}: bad value {value!r}: {e}{self.hint}") from None

    def format(self, value: object) -> str:
        """``value`` as Flink prints it."""
        try:
            return _FORMATTERS[self.kind](value)
        except _BadValue as e:
            raise UsageError(
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
        "state.storage.fs.memory-threshold",
        "inline_threshold",
        "memory-threshold",
        deprecated_keys=("state.backend.fs.memory-threshold",),
    ),
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
        "max-parallelism",
        hint=" (the number of key groups; Flink's -1, derive it from the parallelism, has no"
        " equivalent here)",
    ),
)
"""Flink key -> ``Config`` field: the one table ``from_flink``, ``to_flink`` and the README's
configuration table (checked by tests/test_config.py) follow."""

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
        raise UsageError(
            f"Flink option {key!r} is a pre-release name of FLIP-306 that no released Flink "
            f"reads: {hint}"
        )
    if key.startswith(FLINK_FILE_MERGING_PREFIX) and key not in FLINK_UNMODELLED_FILE_MERGING_KEYS:
        known = sorted(k for k in _FLINK_KEYS if k.startswith(FLINK_FILE_MERGING_PREFIX))
        close = difflib.get_close_matches(key, known, n=1)
        raise UsageError(
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


def _parse_max_parallelism(value: object) -> int:
    number = _parse_int(value)
    if number > UPPER_BOUND_MAX_PARALLELISM:
        raise _BadValue(f"more than Flink's upper bound {UPPER_BOUND_MAX_PARALLELISM} (R78)")
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
    """A file size: a MemorySize (``_parse_bytes``) of at least 1 byte."""
    size = _parse_bytes(value)
    if size < 1:
        raise _BadValue("a physical file holds at least 1 byte")
    return size


INLINE_THRESHOLD_LIMIT = 1 << 20
"""Flink's bound on state.storage.fs.memory-threshold (1 MB, ``MAX_FILE_STATE_THRESHOLD``)."""


def _parse_threshold(value: object) -> int:
    """``state.storage.fs.memory-threshold``: a MemorySize of 0 to 1 MiB, the bound
    Flink's ``FsStateBackend`` checks (``MAX_FILE_STATE_THRESHOLD``)."""
    size = _parse_bytes(value)
    if size > INLINE_THRESHOLD_LIMIT:
        raise _BadValue(f"at most {INLINE_THRESHOLD_LIMIT} bytes (1 MiB), Flink's bound")
    return size


def _parse_bytes(value: object) -> int:
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
    "max-parallelism": _parse_max_parallelism,
    "float": _parse_float,
    "memory": _parse_memory,
    "memory-threshold": _parse_threshold,
    "claim-mode": _parse_claim_mode,
}
_FORMATTERS: dict[str, Callable[[object], str]] = {
    "bool": _format_bool,
    "int": _format_int,
    "max-parallelism": _format_int,
    "float": _format_float,
    "memory": _format_memory,
    "memory-threshold": _format_memory,
    "claim-mode": _format_claim_mode,
}


def read_flink(options: Mapping[str, object], *, ignore_unknown: bool = False) -> dict[str, object]:
    """The field values ``options`` sets (see ``Config.from_flink`` for the rules)."""
    unknown: list[str] = []
    for key in options:
        if not isinstance(key, str):
            raise WrongTypeError(f"Flink option keys are strings, got {key!r}")
        if key in _FLINK_KEYS:
            continue
        _refuse_misspelt_file_merging_key(key)
        unknown.append(key)
    if unknown and not ignore_unknown:
        raise UsageError(
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
    return values


def write_flink(fields: Mapping[str, object]) -> dict[str, str]:
    """The Flink keys of ``FLINK_OPTIONS`` with the values of a ``Config``'s ``fields``
    (field name -> value) as Flink prints them. A mapping, not the ``Config``: this module
    is imported by ``spec.config`` and imports nothing of it."""
    return {o.key: o.format(fields[o.field_name]) for o in FLINK_OPTIONS}
