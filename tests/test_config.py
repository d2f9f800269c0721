"""spec.config against Flink's configuration: the released option names and defaults
(Flink 1.20 and 2.x), Flink's parsing rules in ``Config.from_flink``, the way back in
``to_flink``, and the README's configuration table."""

from __future__ import annotations

import math
import re
from pathlib import Path

import attrs
import fsspec  # type: ignore[import-untyped]
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fastimpl import CheckpointStore
from fastimpl.engine import InProcessEngine
from fastimpl.recovery import recover
from refimpl.state import initial_state
from spec.config import (
    MAX_TMS,
    UPPER_BOUND_MAX_PARALLELISM,
    Config,
    JobSpec,
    MergingMode,
    RestoreMode,
    VertexSpec,
)
from spec.flink_options import FLINK_OPTIONS

MIB = 1 << 20
README = Path(__file__).resolve().parent.parent / "docs" / "library.md"

ENABLED = "execution.checkpointing.file-merging.enabled"
ACROSS = "execution.checkpointing.file-merging.across-checkpoint-boundary"
MAX_FILE_SIZE = "execution.checkpointing.file-merging.max-file-size"
POOL_BLOCKING = "execution.checkpointing.file-merging.pool-blocking"
AMPLIFICATION = "execution.checkpointing.file-merging.max-space-amplification"
NUM_RETAINED = "execution.checkpointing.num-retained"
CLAIM_MODE = "execution.state-recovery.claim-mode"
MAX_PARALLELISM = "pipeline.max-parallelism"
INLINE = "state.storage.fs.memory-threshold"
OLD_INLINE = "state.backend.fs.memory-threshold"
OLD_NUM_RETAINED = "state.checkpoints.num-retained"
OLD_CLAIM_MODE = "execution.savepoint-restore-mode"


# --- defaults and the table ---------------------------------------------------------------


def test_defaults_are_flinks() -> None:
    """Flink's defaults, written out here (CheckpointingOptions, StateRecoveryOptions), not
    read back from spec.config's table."""
    cfg = Config()
    assert cfg.file_merging_enabled is False  # FILE_MERGING_ENABLED: false
    assert cfg.across_checkpoint_boundary is False  # FILE_MERGING_ACROSS_BOUNDARY: false
    assert cfg.max_file_size == 32 * MIB  # FILE_MERGING_MAX_FILE_SIZE: MemorySize "32MB"
    assert cfg.pool_blocking is False  # FILE_MERGING_POOL_BLOCKING: false
    assert cfg.max_space_amplification == 2.0  # FILE_MERGING_MAX_SPACE_AMPLIFICATION: 2f
    assert cfg.num_retained == 1  # MAX_RETAINED_CHECKPOINTS: 1
    assert cfg.restore_mode is RestoreMode.NO_CLAIM  # RESTORE_MODE: NO_CLAIM
    assert cfg.max_parallelism == 128  # ours: Flink's -1 derives it from the parallelism
    assert cfg.open_files_readable is True  # ours
    assert cfg.inline_threshold == 0  # ours, off: FS_SMALL_FILE_THRESHOLD is 20 kb
    assert Config.from_flink({}) == cfg


def test_defaults_print_as_flink_does() -> None:
    assert Config().to_flink() == {
        ENABLED: "false",
        ACROSS: "false",
        MAX_FILE_SIZE: "32 mb",
        POOL_BLOCKING: "false",
        AMPLIFICATION: "2.0",
        NUM_RETAINED: "1",
        CLAIM_MODE: "NO_CLAIM",
        MAX_PARALLELISM: "128",
        INLINE: "0 bytes",
    }


def test_table_names_the_released_keys() -> None:
    assert {o.key: o.field_name for o in FLINK_OPTIONS} == {
        ENABLED: "file_merging_enabled",
        ACROSS: "across_checkpoint_boundary",
        MAX_FILE_SIZE: "max_file_size",
        POOL_BLOCKING: "pool_blocking",
        AMPLIFICATION: "max_space_amplification",
        NUM_RETAINED: "num_retained",
        CLAIM_MODE: "restore_mode",
        MAX_PARALLELISM: "max_parallelism",
        INLINE: "inline_threshold",
    }
    assert {o.key: o.deprecated_keys for o in FLINK_OPTIONS if o.deprecated_keys} == {
        NUM_RETAINED: (OLD_NUM_RETAINED,),
        CLAIM_MODE: (OLD_CLAIM_MODE,),
        INLINE: (OLD_INLINE,),
    }


# --- every key, from strings and from typed values -----------------------------------------


@pytest.mark.parametrize(
    ("key", "text", "typed", "field", "expected"),
    [
        (ENABLED, "true", True, "file_merging_enabled", True),
        (ENABLED, "FALSE", False, "file_merging_enabled", False),
        (ACROSS, "True", True, "across_checkpoint_boundary", True),
        (MAX_FILE_SIZE, "64mb", 64 * MIB, "max_file_size", 64 * MIB),
        (POOL_BLOCKING, "tRuE", True, "pool_blocking", True),
        (AMPLIFICATION, "1.5", 1.5, "max_space_amplification", 1.5),
        (AMPLIFICATION, "3", 3, "max_space_amplification", 3.0),
        (AMPLIFICATION, "0.5", 0.5, "max_space_amplification", 0.5),
        (NUM_RETAINED, "3", 3, "num_retained", 3),
        (CLAIM_MODE, "CLAIM", RestoreMode.CLAIM, "restore_mode", RestoreMode.CLAIM),
        (CLAIM_MODE, "no_claim", RestoreMode.NO_CLAIM, "restore_mode", RestoreMode.NO_CLAIM),
        (MAX_PARALLELISM, "256", 256, "max_parallelism", 256),
        (INLINE, "20kb", 20 << 10, "inline_threshold", 20 << 10),
        (INLINE, "0", 0, "inline_threshold", 0),
        (INLINE, "1 mb", 1 << 20, "inline_threshold", 1 << 20),
        (OLD_INLINE, "4096", 4096, "inline_threshold", 4096),
    ],
)
def test_every_key_parses_from_a_string_and_a_typed_value(
    key: str, text: str, typed: object, field: str, expected: object
) -> None:
    assert getattr(Config.from_flink({key: text}), field) == expected
    assert getattr(Config.from_flink({key: typed}), field) == expected
    assert getattr(Config.from_flink({key: f"  {text} "}), field) == expected


def test_a_whole_configuration() -> None:
    cfg = Config.from_flink(
        {
            ENABLED: "true",
            ACROSS: "true",
            MAX_FILE_SIZE: "16 mb",
            POOL_BLOCKING: "true",
            AMPLIFICATION: "0",
            NUM_RETAINED: "2",
            CLAIM_MODE: "claim",
            MAX_PARALLELISM: "32",
        }
    )
    assert cfg.merging_mode is MergingMode.ACROSS_CHECKPOINT
    assert cfg.amplification_bound is None  # below 1 disables
    assert cfg == Config(
        file_merging_enabled=True,
        across_checkpoint_boundary=True,
        max_file_size=16 * MIB,
        pool_blocking=True,
        max_space_amplification=0.0,
        num_retained=2,
        restore_mode=RestoreMode.CLAIM,
        max_parallelism=32,
    )


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2f", 2.0),  # Flink's own default is written 2f
        ("2.5d", 2.5),
        ("+1.25", 1.25),
        ("-1", -1.0),
        (".5", 0.5),
        ("2.", 2.0),
        ("1e1", 10.0),
        ("1.0E-5", 1e-5),
        ("Infinity", math.inf),
    ],
)
def test_amplification_reads_javas_float_forms(text: str, expected: float) -> None:
    assert Config.from_flink({AMPLIFICATION: text}).max_space_amplification == expected


# --- MemorySize ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("32mb", 32 * MIB),
        ("32 mb", 32 * MIB),
        ("32m", 32 * MIB),
        ("32MB", 32 * MIB),
        ("32 Mb", 32 * MIB),
        ("4 mebibytes", 4 * MIB),
        ("1g", 1 << 30),
        ("1 GB", 1 << 30),
        ("2 gibibytes", 2 << 30),
        ("1t", 1 << 40),
        ("1tb", 1 << 40),
        ("1 tebibytes", 1 << 40),
        ("1024", 1024),
        ("1024b", 1024),
        ("1024 bytes", 1024),
        ("64kb", 64 << 10),
        ("64k", 64 << 10),
        ("64 kibibytes", 64 << 10),
        ("0032mb", 32 * MIB),
        (" 8 mb ", 8 * MIB),
        (str(2**63 - 1), 2**63 - 1),
        ("8388607 tb", 8388607 << 40),
    ],
)
def test_memory_size_forms(text: str, size: int) -> None:
    assert Config.from_flink({MAX_FILE_SIZE: text}).max_file_size == size


@pytest.mark.parametrize(
    "text",
    ["", "mb", "32 zb", "32 mib", "1.5mb", "-1mb", "+1mb", "32 m b", "0", "0 mb", "8388608 tb"],
)
def test_bad_memory_sizes_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape(MAX_FILE_SIZE)) as e:
        Config.from_flink({MAX_FILE_SIZE: text})
    assert repr(text) in str(e.value)


@given(
    st.integers(1, 1 << 20),
    st.sampled_from(
        [
            (1, "b"),
            (1, "bytes"),
            (1 << 10, "k"),
            (1 << 10, "KB"),
            (1 << 10, "kibibytes"),
            (1 << 20, "m"),
            (1 << 20, "Mb"),
            (1 << 20, "mebibytes"),
            (1 << 30, "g"),
            (1 << 30, "gb"),
            (1 << 30, "GIBIBYTES"),
            (1 << 40, "t"),
            (1 << 40, "tb"),
            (1 << 40, "tebibytes"),
        ]
    ),
    st.sampled_from(["", " ", "  "]),
)
def test_memory_size_number_unit_any_case_any_space(
    n: int, unit: tuple[int, str], space: str
) -> None:
    multiplier, name = unit
    assert Config.from_flink({MAX_FILE_SIZE: f"{n}{space}{name}"}).max_file_size == n * multiplier


@pytest.mark.parametrize(
    ("size", "text"),
    [
        (1, "1 bytes"),
        (1000, "1000 bytes"),
        (1024, "1 kb"),
        (1536, "1536 bytes"),
        (3 * MIB, "3 mb"),
        (MIB + 1024, "1025 kb"),
        (5 << 30, "5 gb"),
        (1 << 40, "1099511627776 bytes"),  # MemorySize.toString: a whole TiB prints in bytes
    ],
)
def test_memory_size_prints_as_flinks_memory_size_to_string(size: int, text: str) -> None:
    assert Config(max_file_size=size).to_flink()[MAX_FILE_SIZE] == text


# --- deprecated keys -----------------------------------------------------------------------


def test_deprecated_keys_are_read() -> None:
    cfg = Config.from_flink({OLD_NUM_RETAINED: "4", OLD_CLAIM_MODE: "CLAIM"})
    assert cfg.num_retained == 4
    assert cfg.restore_mode is RestoreMode.CLAIM


def test_the_key_wins_over_its_deprecated_key() -> None:
    """Flink's rule: the key is read first; the deprecated key only when it is absent (and
    then not even parsed)."""
    cfg = Config.from_flink(
        {
            OLD_NUM_RETAINED: "4",
            NUM_RETAINED: "2",
            CLAIM_MODE: "NO_CLAIM",
            OLD_CLAIM_MODE: "LEGACY",
        }
    )
    assert cfg.num_retained == 2
    assert cfg.restore_mode is RestoreMode.NO_CLAIM


def test_a_bad_deprecated_value_names_the_deprecated_key() -> None:
    with pytest.raises(ValueError, match=re.escape(OLD_NUM_RETAINED)):
        Config.from_flink({OLD_NUM_RETAINED: "many"})


@pytest.mark.parametrize("key", [CLAIM_MODE, OLD_CLAIM_MODE])
@pytest.mark.parametrize("value", ["LEGACY", "legacy"])
def test_legacy_claim_mode_is_refused(key: str, value: str) -> None:
    with pytest.raises(ValueError, match="LEGACY") as e:
        Config.from_flink({key: value})
    assert key in str(e.value)
    assert "only CLAIM and NO_CLAIM" in str(e.value)


# --- unknown keys --------------------------------------------------------------------------


@pytest.mark.parametrize("ignore_unknown", [False, True])
@pytest.mark.parametrize(
    "key",
    [
        "execution.checkpointing.file-merging.enable",
        "execution.checkpointing.file-merging.max-file-size-mb",
        "execution.checkpointing.file-merging.across-checkpoints-boundary",
        "execution.checkpointing.file-merging.",
    ],
)
def test_a_typo_in_the_file_merging_namespace_is_refused(key: str, ignore_unknown: bool) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(key))) as e:
        Config.from_flink({key: "true"}, ignore_unknown=ignore_unknown)
    for known in (ENABLED, ACROSS, MAX_FILE_SIZE, POOL_BLOCKING, AMPLIFICATION):
        assert known in str(e.value)


def test_a_typo_gets_a_suggestion() -> None:
    with pytest.raises(ValueError, match=re.escape(f"did you mean {ENABLED!r}")):
        Config.from_flink({"execution.checkpointing.file-merging.enable": "true"})


@pytest.mark.parametrize("ignore_unknown", [False, True])
def test_the_pre_release_names_are_refused_with_the_released_one(ignore_unknown: bool) -> None:
    old = "state.checkpoints.file-merging.enabled"
    with pytest.raises(ValueError, match=re.escape(repr(old))) as e:
        Config.from_flink({old: "true"}, ignore_unknown=ignore_unknown)
    assert f"use {ENABLED}" in str(e.value)


def test_other_unknown_keys_are_refused_unless_ignored() -> None:
    flink_conf = {
        "execution.checkpointing.interval": "10 s",
        "state.backend.type": "rocksdb",
        "execution.checkpointing.file-merging.max-subtasks-per-file": "4",  # real, unmodelled
        ENABLED: "true",
    }
    with pytest.raises(ValueError, match="ignore_unknown=True") as e:
        Config.from_flink(flink_conf)
    for key in ("execution.checkpointing.interval", "state.backend.type", "max-subtasks"):
        assert key in str(e.value)
    assert Config.from_flink(flink_conf, ignore_unknown=True) == Config(file_merging_enabled=True)


def test_keys_are_case_sensitive() -> None:
    with pytest.raises(ValueError, match="unknown Flink option"):
        Config.from_flink({"Pipeline.Max-Parallelism": "8"})


# --- bad values ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        (ENABLED, "yes"),
        (ENABLED, "1"),
        (ENABLED, 1),
        (ENABLED, None),
        (ACROSS, ""),
        (POOL_BLOCKING, "on"),
        (MAX_FILE_SIZE, 1.5),
        (MAX_FILE_SIZE, True),
        (MAX_FILE_SIZE, -1),
        (INLINE, "1025kb"),  # above Flink's bound, 1 MB
        (INLINE, -1),
        (INLINE, "20 kB/s"),
        (AMPLIFICATION, "two"),
        (AMPLIFICATION, "NaN"),
        (AMPLIFICATION, math.nan),
        (AMPLIFICATION, "inf"),  # Java reads Infinity, not inf
        (AMPLIFICATION, "1_0"),
        (AMPLIFICATION, True),
        (AMPLIFICATION, 10**400),
        (NUM_RETAINED, "0"),
        (NUM_RETAINED, 0),
        (NUM_RETAINED, "1.5"),
        (NUM_RETAINED, 2.0),
        (NUM_RETAINED, True),
        (NUM_RETAINED, "1_000"),
        (NUM_RETAINED, str(2**31)),
        (NUM_RETAINED, 2**31),
        (CLAIM_MODE, "CLAIMED"),
        (CLAIM_MODE, 1),
        (MAX_PARALLELISM, "-1"),
        (MAX_PARALLELISM, "0"),
        (MAX_PARALLELISM, "many"),
        (MAX_PARALLELISM, "32769"),
        (MAX_PARALLELISM, 2**31 - 1),
    ],
)
def test_bad_values_are_refused_naming_key_and_value(key: str, value: object) -> None:
    with pytest.raises(ValueError) as e:
        Config.from_flink({key: value})
    assert key in str(e.value)
    assert repr(value) in str(e.value)


def test_max_parallelism_minus_one_says_why() -> None:
    with pytest.raises(ValueError, match="derive it from the parallelism"):
        Config.from_flink({MAX_PARALLELISM: "-1"})


def test_non_string_keys_and_stray_overrides_are_refused() -> None:
    with pytest.raises(TypeError, match="strings"):
        Config.from_flink({1: "true"})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="max_filesize"):
        Config.from_flink({}, max_filesize=1)


# --- overrides and the ACROSS check --------------------------------------------------------


def test_overrides_are_field_values_applied_last() -> None:
    cfg = Config.from_flink({NUM_RETAINED: "3"}, num_retained=5, open_files_readable=False)
    assert cfg.num_retained == 5
    assert cfg.open_files_readable is False


def test_across_on_a_store_without_readable_open_files_is_refused() -> None:
    across = {ENABLED: "true", ACROSS: "true"}
    with pytest.raises(ValueError, match="within-checkpoint merging"):
        Config.from_flink(across, open_files_readable=False)
    # WITHIN and NONE are fine there; ACROSS is fine where open files are readable.
    assert not Config.from_flink({ENABLED: "true"}, open_files_readable=False).open_files_readable
    assert Config.from_flink(across).merging_mode is MergingMode.ACROSS_CHECKPOINT


# --- the way back --------------------------------------------------------------------------

memory_sizes = st.one_of(
    st.integers(1, 2**63 - 1),
    st.builds(lambda n, shift: n << shift, st.integers(1, 4096), st.sampled_from([10, 20, 30, 40])),
)
configs = st.builds(
    Config,
    file_merging_enabled=st.booleans(),
    across_checkpoint_boundary=st.booleans(),
    max_file_size=memory_sizes,
    max_space_amplification=st.floats(allow_nan=False),
    num_retained=st.integers(1, 2**31 - 1),
    max_parallelism=st.integers(1, UPPER_BOUND_MAX_PARALLELISM),
    restore_mode=st.sampled_from(RestoreMode),
    pool_blocking=st.booleans(),
    inline_threshold=st.integers(0, 1 << 20),
    open_files_readable=st.just(True),
)


@given(configs)
def test_from_flink_of_to_flink_is_the_identity(cfg: Config) -> None:
    flink = cfg.to_flink()
    assert all(isinstance(v, str) for v in flink.values())
    assert Config.from_flink(flink) == cfg


def test_to_flink_refuses_what_flink_cannot_hold() -> None:
    with pytest.raises(ValueError, match="num_retained"):
        Config(num_retained=2**31).to_flink()
    with pytest.raises(ValueError, match="max_file_size"):
        Config(max_file_size=2**63).to_flink()
    with pytest.raises(ValueError, match="max_space_amplification"):
        Config(max_space_amplification=math.nan).to_flink()


# --- the README ----------------------------------------------------------------------------


def _readme_config_section() -> str:
    text = README.read_text()
    start = text.index("| field | Flink option | default |")
    return text[start : text.index("\n## ", start)]


def test_readme_table_names_the_keys_of_the_table() -> None:
    rows = {}
    for line in _readme_config_section().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            rows[cells[0].strip("`")] = set(re.findall(r"`([a-z][a-z0-9.-]+)`", cells[1]))
    assert set(rows) == {a.name for a in attrs.fields(Config)}
    for option in FLINK_OPTIONS:
        assert rows[option.field_name] == set(option.keys), option.field_name
    assert rows["open_files_readable"] == set()
    assert "state.checkpoints.file-merging" not in _readme_config_section()


def test_readme_from_flink_example_runs() -> None:
    m = re.search(r"```python\n(.*?)```", _readme_config_section(), re.S)
    assert m is not None, "the README lost its Config.from_flink example"
    assert "Config.from_flink(" in m.group(1)
    scope: dict[str, object] = {"__name__": "readme"}
    exec(compile(m.group(1), "README.md", "exec"), scope)
    cfg = scope["config"]
    assert isinstance(cfg, Config)
    assert cfg.merging_mode is MergingMode.WITHIN_CHECKPOINT


# --- R78: job sizes ------------------------------------------------------------------------


def test_r78_the_bounds_are_flinks() -> None:
    """Flink's ``KeyGroupRangeAssignment.UPPER_BOUND_MAX_PARALLELISM`` is
    ``Transformation.UPPER_BOUND_MAX_PARALLELISM = 1 << 15``, inclusive; the bound on TMs
    is the same number, and both bounds themselves are accepted."""
    assert UPPER_BOUND_MAX_PARALLELISM == MAX_TMS == 32768
    assert Config(max_parallelism=32768).max_parallelism == 32768
    assert VertexSpec("v", 32768).parallelism == 32768
    assert JobSpec((VertexSpec("v", 1),), num_tms=32768).num_tms == 32768
    assert Config.from_flink({MAX_PARALLELISM: "32768"}).max_parallelism == 32768


@pytest.mark.parametrize(
    ("make", "field", "value"),
    [
        (lambda: Config(max_parallelism=2**63), "max_parallelism", 2**63),
        (lambda: Config(max_parallelism=32769), "max_parallelism", 32769),
        (lambda: Config(max_parallelism=0), "max_parallelism", 0),
        (lambda: VertexSpec("src", 2**63), "vertex 'src': parallelism", 2**63),
        (lambda: VertexSpec("src", 32769), "vertex 'src': parallelism", 32769),
        (lambda: VertexSpec("src", 0), "vertex 'src': parallelism", 0),
        (lambda: JobSpec((VertexSpec("v", 1),), num_tms=2**70), "num_tms", 2**70),
        (lambda: JobSpec((VertexSpec("v", 1),), num_tms=32769), "num_tms", 32769),
        (lambda: JobSpec((VertexSpec("v", 1),), num_tms=0), "num_tms", 0),
    ],
)
def test_r78_sizes_past_the_bounds_are_refused_when_made(
    make: object, field: str, value: int
) -> None:
    """A job of 2**70 TMs and a parallelism of 2**63, which would hang the in-process
    engine (issue 14, threat 53), are refused when the value is made, naming the field,
    the value and the bound."""
    assert callable(make)
    with pytest.raises(ValueError) as e:
        make()
    msg = str(e.value)
    assert msg.startswith(f"{field} must be in 1 .. 32768"), msg
    assert f"got {value} (R78)" in msg


def test_r78_a_parallelism_above_the_max_parallelism_is_refused_by_model_and_product(
    tmp_path: Path,
) -> None:
    """Each vertex's parallelism is at most the max parallelism: both parties refuse the
    job when they are made with it, naming the vertex and both values, before anything
    is written, rather than failing deep inside the first complete with an error that
    names neither ("bad subtask 0/8 for max parallelism 4")."""
    cfg = Config.for_mode(MergingMode.WITHIN_CHECKPOINT, max_parallelism=4)
    job = JobSpec((VertexSpec("src", 4), VertexSpec("win", 8)), num_tms=2)
    why = r"vertex 'win': parallelism 8 is more than the max parallelism 4: .* \(R78\)"
    base = tmp_path / "base"
    with pytest.raises(ValueError, match=why):
        initial_state(cfg, job)
    with pytest.raises(ValueError, match=why):
        CheckpointStore(str(base), cfg, job)
    with pytest.raises(ValueError, match=why):
        CheckpointStore.recover(str(base), cfg, job)
    with pytest.raises(ValueError, match=why):
        InProcessEngine(cfg, job, fsspec.filesystem("memory"), f"/r78-{id(cfg)}")
    with pytest.raises(ValueError, match=why):
        recover(cfg, job, fsspec.filesystem("file"), str(base))
    assert not base.exists()
    fits = JobSpec((VertexSpec("src", 4), VertexSpec("win", 4)), num_tms=2)
    assert initial_state(cfg, fits).running
    CheckpointStore(str(base), cfg, fits).close()
