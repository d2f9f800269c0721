"""A pure-Python reader of Apache Flink's checkpoint ``_metadata`` files (issue 33).

Read from Flink's own serializers (``Checkpoints.loadCheckpointMetadata``,
``MetadataV2V3SerializerBase``, ``MetadataV2``-``V7Serializer``, ``ChannelStateHandleSerializerV1``
and ``V2``; release 2.3.0 bytecode, ``MetadataV7Serializer`` from Flink master), so that an audit
sees every file a checkpoint references without a JVM. ``/work/shared/FORMATS.md`` holds the
layout; the rules below are the ones this module keeps.

* Big-endian; strings are ``DataOutput.writeUTF`` (u2 length + Java's modified UTF-8, decoded by
  Java's ``readUTF`` rules). Nothing is length-framed, so one unknown type byte leaves the rest
  unreadable: every refusal raises :class:`FlinkMetadataError` naming the field, the type byte
  where there is one, and the byte offset.
* Versions: 2 to 7. Version 1 (Flink 1.1/1.2) is recognised and refused, as Flink 2.3's
  ``MetadataV1Serializer`` refuses it. Version 7 (Flink master) adds one byte after each
  subtask's state, ``1`` followed by a long reference checkpoint id, or ``0``.
* Every count and length is checked against the bytes left before anything is read or skipped
  (a mutated 4-byte count never allocates, never loops past the end); nested handles (a
  key-groups handle as a stream handle, a changelog handle holding keyed handles) stop at
  :data:`MAX_NESTING` levels, so a hostile file cannot exhaust the stack.
* Stricter than Flink where Flink would accept what its own writer never writes: a negative
  count of channel-state handles (Flink reads it as zero), a presence flag other than 0 or 1
  (Flink reads any non-zero int as "present"), a type-17 empty flag or a V7 marker byte other
  than 0 or 1, bytes after the end (Flink stops reading), a negative key-group count of an
  incremental handle (Flink makes an empty range). A file Flink wrote is never refused for
  these; a file refused for them was not written by Flink.
* From version 4 on, the file ends with a ``java.io.ObjectOutputStream`` holding one
  ``CheckpointProperties``. It is parsed (``_JavaStream``: the serialization grammar, without
  instantiating anything) to find where it ends and whether the snapshot is a savepoint: the
  class of its ``checkpointType`` field (``SavepointType`` or ``CheckpointType``; before Flink
  1.15 an enum ``CheckpointType`` whose ``SAVEPOINT*`` constants are savepoints). Its
  primitive fields (``forced``, ``discardSubsumed``, ..., ``unclaimed``) are reported as
  :attr:`FlinkMetadata.properties`. Versions 2 and 3 have no trailer: ``savepoint`` is ``None``.

Output: one :class:`FlinkHandle` per stream handle Flink's loader returns (the contract's
HANDLE record, ``/work/i33/CONTRACT.md``): the operator (``OperatorID.toHexString()``: the two
longs as written, lower part first, each big-endian, so the 16 bytes in file order in hex),
the subtask, the slot, the role, Flink's class simple name, the path as written, offset, length,
scope and logical id. A ``RelativeFileStateHandle``'s path stays relative as written;
:func:`as_truth_dicts` resolves it as Flink's loader does (``new Path(exclusiveDirPath,
relativePath)``). The coordinator state belongs to no subtask: it is reported with subtask
``-1``. Master states are bytes inside ``_metadata``, not handles: each is one record of type
``MasterState`` (no operator, subtask ``-1``, slot ``master``, no path, its length, the hook's
name as logical id) so that a reader can count them, as the fixtures' truth does. In-memory
changelog changes (type 9) are bytes inside ``_metadata`` too, and yield no record.

Roles: ``stream`` (the delegate of a key-groups, operator or channel-state handle, and the
coordinator state), ``meta``, ``shared:<local name>`` and ``private:<local name>`` (an
incremental handle's files), ``dir:taskowned`` and ``dir:shared`` (a type-17 handle's
``DirectoryStreamStateHandle`` s, offset and length 0), ``changelog`` (a changelog file handle's
streams, types 10/13). Paths are the strings as written; Flink wrote each with
``Path.toString()``, so ``new Path(s).toString()`` gives the same string back.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import NoReturn

from spec.errors import CkptError

FLINK_MAGIC = 0x4960672D
MASTER_STATE_MAGIC = 0xC96B1696
SUPPORTED_VERSIONS = range(2, 8)
"""2..7; 1 is refused as Flink refuses it."""
MAX_NESTING = 16
"""Levels of nested handles read (the 17th is refused); Flink writes at most 3 (a changelog
handle holding an incremental handle holding stream handles)."""

_I8 = struct.Struct(">b")
_U8 = struct.Struct(">B")
_U16 = struct.Struct(">H")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_U32 = struct.Struct(">I")
_I64 = struct.Struct(">q")
_INT_MAX = 2**31 - 1

# Stream handle type bytes (MetadataV2V3SerializerBase).
NULL_HANDLE = 0
BYTE_STREAM = 1
FILE_STREAM = 2
KEY_GROUPS = 3
OPERATOR_STREAM = 4
INCREMENTAL = 5
RELATIVE_FILE = 6
SAVEPOINT_KEY_GROUPS = 7
CHANGELOG = 8
CHANGELOG_BYTES = 9
CHANGELOG_FILE = 10
INCREMENTAL_V2 = 11
KEY_GROUPS_V2 = 12
CHANGELOG_FILE_V2 = 13
CHANGELOG_V2 = 14
SEGMENT_FILE = 15
EMPTY_SEGMENT_FILE = 16
FILE_MERGING_OPERATOR_STREAM = 17

_MODES = ("SPLIT_DISTRIBUTE", "UNION", "BROADCAST")
"""OperatorStateHandle.Mode, by ordinal."""
_SCOPES = ("exclusive", "shared")
"""CheckpointedStateScope, by ordinal (EXCLUSIVE, SHARED)."""

SLOTS = ("coordinator", "managed_operator", "raw_operator", "managed_keyed", "raw_keyed",
         "input_channel", "result_subpartition", "master")


class FlinkMetadataError(CkptError, ValueError):
    """A ``_metadata`` this reader refuses: which file, at which byte, and what was wrong."""

    def __init__(self, source: str, offset: int, what: str) -> None:
        super().__init__(f"{source}: byte offset {offset}: {what}")
        self.source = source
        self.offset = offset
        self.what = what


@dataclass(frozen=True, slots=True)
class FlinkHandle:
    """One stream handle of a checkpoint: the contract's HANDLE record, path as written."""

    operator: str | None
    subtask: int
    slot: str
    role: str
    type: str
    path: str | None
    offset: int
    length: int
    scope: str | None
    logical_id: str | None


@dataclass(frozen=True, slots=True)
class FlinkOperator:
    """An operator's state: its id, V5+ name and uid (``None`` when written empty), its
    parallelism, and which subtasks had state or had finished."""

    operator: str
    name: str | None
    uid: str | None
    parallelism: int
    max_parallelism: int
    fully_finished: bool
    subtasks: tuple[int, ...]
    finished_subtasks: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class FlinkMasterState:
    """A master hook's state: bytes inside ``_metadata`` (no file)."""

    name: str
    version: int
    length: int


@dataclass(frozen=True, slots=True)
class FlinkMetadata:
    """What one ``_metadata`` says."""

    version: int
    checkpoint_id: int
    savepoint: bool | None
    operators: list[FlinkOperator]
    handles: list[FlinkHandle]
    master_states: list[FlinkMasterState] = field(default_factory=list)
    properties: Mapping[str, object] | None = None
    """The trailer's ``CheckpointProperties`` fields (V4+), ``checkpointType`` as its
    class's simple name (or enum constant), ``None`` before V4."""


# ---------------------------------------------------------------------------------------------
#  Byte reading: every read checks the bytes left first
# ---------------------------------------------------------------------------------------------


class _Bytes:
    __slots__ = ("data", "end", "pos", "source")

    def __init__(self, data: bytes, source: str) -> None:
        self.data = data
        self.end = len(data)
        self.pos = 0
        self.source = source

    def fail(self, what: str, at: int | None = None) -> NoReturn:
        raise FlinkMetadataError(self.source, self.pos if at is None else at, what)

    def need(self, n: int, what: str) -> None:
        if n > self.end - self.pos:
            self.fail(f"truncated: {what} needs {n} bytes, {self.end - self.pos} left")

    def u8(self, what: str) -> int:
        self.need(1, what)
        v = self.data[self.pos]
        self.pos += 1
        return v

    def i8(self, what: str) -> int:
        self.need(1, what)
        v: int = _I8.unpack_from(self.data, self.pos)[0]
        self.pos += 1
        return v

    def u16(self, what: str) -> int:
        self.need(2, what)
        v: int = _U16.unpack_from(self.data, self.pos)[0]
        self.pos += 2
        return v

    def i16(self, what: str) -> int:
        self.need(2, what)
        v: int = _I16.unpack_from(self.data, self.pos)[0]
        self.pos += 2
        return v

    def i32(self, what: str) -> int:
        self.need(4, what)
        v: int = _I32.unpack_from(self.data, self.pos)[0]
        self.pos += 4
        return v

    def u32(self, what: str) -> int:
        self.need(4, what)
        v: int = _U32.unpack_from(self.data, self.pos)[0]
        self.pos += 4
        return v

    def i64(self, what: str) -> int:
        self.need(8, what)
        v: int = _I64.unpack_from(self.data, self.pos)[0]
        self.pos += 8
        return v

    def skip(self, n: int, what: str) -> None:
        self.need(n, what)
        self.pos += n

    def count(self, what: str, each: int) -> int:
        """A non-negative int count of items of at least ``each`` bytes that fit in what is left."""
        at = self.pos
        n = self.i32(what)
        if n < 0:
            self.fail(f"negative {what}: {n}", at)
        if n * each > self.end - self.pos:
            self.fail(f"oversize {what}: {n} items need at least {n * each} bytes, "
                      f"{self.end - self.pos} left", at)
        return n

    def length(self, what: str) -> int:
        """A non-negative int byte length that fits in what is left."""
        return self.count(what, 1)

    def flag(self, what: str) -> bool:
        at = self.pos
        v = self.i32(what)
        if v not in (0, 1):
            self.fail(f"{what} is {v}, not 0 or 1", at)
        return v == 1

    def utf(self, what: str) -> str:
        """``DataInput.readUTF``: u2 length, then modified UTF-8 as Java decodes it."""
        n = self.u16(f"{what} (length)")
        self.need(n, what)
        start = self.pos
        raw = self.data[start:start + n]
        self.pos += n
        if raw.isascii():
            return raw.decode("ascii")
        return _modified_utf8(raw, self, start, what)


def _modified_utf8(raw: bytes, src: _Bytes, start: int, what: str) -> str:
    """Java's ``DataInputStream.readUTF`` decoding: one-, two- and three-byte forms of UTF-16
    units (surrogate pairs are two three-byte forms), refusing what Java refuses."""
    units = bytearray()
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        hi = c >> 4
        if hi <= 7:
            unit = c
            i += 1
        elif hi in (12, 13):
            if i + 2 > n or raw[i + 1] & 0xC0 != 0x80:
                src.fail(f"invalid modified UTF-8 in {what}: bad two-byte form at byte {i}",
                         start + i)
            unit = ((c & 0x1F) << 6) | (raw[i + 1] & 0x3F)
            i += 2
        elif hi == 14:
            if i + 3 > n or raw[i + 1] & 0xC0 != 0x80 or raw[i + 2] & 0xC0 != 0x80:
                src.fail(f"invalid modified UTF-8 in {what}: bad three-byte form at byte {i}",
                         start + i)
            unit = ((c & 0x0F) << 12) | ((raw[i + 1] & 0x3F) << 6) | (raw[i + 2] & 0x3F)
            i += 3
        else:
            src.fail(f"invalid modified UTF-8 in {what}: byte 0x{c:02x} starts no character",
                     start + i)
        units += unit.to_bytes(2, "big")
    return units.decode("utf-16-be", "surrogatepass")


# ---------------------------------------------------------------------------------------------
#  The metadata grammar
# ---------------------------------------------------------------------------------------------


class _Reader(_Bytes):
    __slots__ = ("handles", "op", "subtask", "version")

    def __init__(self, data: bytes, source: str) -> None:
        super().__init__(data, source)
        self.version = 0
        self.handles: list[FlinkHandle] = []
        self.op = ""
        self.subtask = -1

    def emit(self, slot: str, role: str, type_: str, path: str | None, offset: int,
             length: int, scope: str | None = None, logical_id: str | None = None) -> None:
        self.handles.append(FlinkHandle(self.op, self.subtask, slot, role, type_, path, offset,
                                        length, scope, logical_id))

    def nesting(self, depth: int, t: int, at: int) -> None:
        if depth >= MAX_NESTING:
            self.fail(f"handle type byte {t} nested deeper than {MAX_NESTING} levels", at)

    # -- top level ---------------------------------------------------------------------------

    def metadata(self) -> FlinkMetadata:
        magic = self.u32("magic number")
        if magic != FLINK_MAGIC:
            self.fail(f"bad magic number 0x{magic:08X} (a Flink _metadata starts with "
                      f"0x{FLINK_MAGIC:08X})", 0)
        at = self.pos
        version = self.i32("version")
        if version == 1:
            self.fail("version 1 (Flink 1.1/1.2): Flink itself no longer reads it", at)
        if version not in SUPPORTED_VERSIONS:
            self.fail(f"unsupported metadata version {version} (this reader knows 2..7)", at)
        self.version = version
        at = self.pos
        checkpoint_id = self.i64("checkpoint id")
        if checkpoint_id < 0:
            self.fail(f"negative checkpoint id {checkpoint_id}", at)
        masters = [self.master_state() for _ in range(self.count("master state count", 8))]
        # The smallest operator: V2 16+4*4 bytes, V3/V4 16+4+4+1+4, V5+ 2+2 more.
        smallest = 32 if version == 2 else 29 if version < 5 else 33
        operators = [self.operator() for _ in range(self.count("operator count", smallest))]
        savepoint: bool | None = None
        properties: dict[str, object] | None = None
        if version >= 4:
            savepoint, properties = _JavaStream(self).checkpoint_properties()
        if self.pos != self.end:
            self.fail(f"{self.end - self.pos} trailing bytes after the "
                      f"{'checkpoint properties' if version >= 4 else 'last operator'}")
        return FlinkMetadata(version, checkpoint_id, savepoint, operators, self.handles, masters,
                             properties)

    def master_state(self) -> FlinkMasterState:
        """One master hook's state; recorded as a ``MasterState`` handle of no operator."""
        at = self.pos
        magic = self.u32("master state magic number")
        if magic != MASTER_STATE_MAGIC:
            self.fail(f"bad master state magic number 0x{magic:08X} "
                      f"(expected 0x{MASTER_STATE_MAGIC:08X})", at)
        at = self.pos
        n = self.length("master state length")
        if n == 0:
            self.fail("master state length is 0", at)
        end, outer_end = self.pos + n, self.end
        self.end = end  # the master state's own fields must stay within its declared length
        version = self.i32("master state version")
        name = self.utf("master state name")
        length = self.length("master state bytes length")
        self.pos += length
        if self.pos != end:
            self.fail(f"{end - self.pos} trailing bytes in master state {name!r}")
        self.end = outer_end
        self.handles.append(FlinkHandle(None, -1, "master", "stream", "MasterState", None, 0,
                                        length, None, name))
        return FlinkMasterState(name, version, length)

    def operator(self) -> FlinkOperator:
        name = uid = None
        if self.version >= 5:
            name = self.utf("operator name") or None
            uid = self.utf("operator uid") or None
        self.need(16, "operator id")
        self.op = self.data[self.pos:self.pos + 16].hex()
        self.pos += 16
        parallelism = self.i32("parallelism")
        max_parallelism = self.i32("max parallelism")
        self.subtask = -1
        subtasks: list[int] = []
        finished: list[int] = []
        if self.version == 2:
            self.i32("chain length (unused)")
            for _ in range(self.count("subtask count", 4 + 8 + 4 + 4 + 4 + 2)):
                self.subtask = self.i32("subtask index")
                subtasks.append(self.subtask)
                self.subtask_state()
            return FlinkOperator(self.op, name, uid, parallelism, max_parallelism, False,
                                 tuple(subtasks), ())
        coord_at = self.pos
        coordinator = self.stream_handle("coordinator", "stream", 0)
        if coordinator not in (None, "ByteStreamStateHandle"):
            self.fail(f"coordinator state is a {coordinator} (type byte "
                      f"{self.data[coord_at]}): Flink expects inline bytes (type 1) or null",
                      coord_at)
        at = self.pos
        n = self.i32("subtask count")
        if n < 0:
            if coordinator is not None:
                self.fail("a fully finished operator (negative subtask count) has coordinator "
                          "state", at)
            return FlinkOperator(self.op, name, uid, parallelism, max_parallelism, True, (), ())
        self.pos = at
        for _ in range(self.count("subtask count", 4)):
            at = self.pos
            index = self.i32("subtask index")
            if index < 0:
                finished.append(-index - 1)
                continue
            self.subtask = index
            subtasks.append(index)
            self.subtask_state()
        self.subtask = -1
        return FlinkOperator(self.op, name, uid, parallelism, max_parallelism, False,
                             tuple(subtasks), tuple(finished))

    def subtask_state(self) -> None:
        if self.version == 2:
            self.i64("legacy subtask field (unused)")
            at = self.pos
            legacy = self.i32("legacy state count")
            if legacy > 0:
                self.fail("legacy state (Flink <= 1.1 'Checkpointed') is not supported", at)
        if self.flag("managed operator state flag"):
            self.operator_handle("managed_operator")
        if self.flag("raw operator state flag"):
            self.operator_handle("raw_operator")
        self.keyed_handle("managed_keyed", "", 0)
        self.keyed_handle("raw_keyed", "", 0)
        if self.version >= 3:
            self.channel_handles("input_channel", 1, 3)
            self.channel_handles("result_subpartition", 2, 4)
        if self.version >= 7:
            at = self.pos
            marker = self.u8("reference checkpoint id marker")
            if marker == 1:
                self.i64("reference checkpoint id")
            elif marker != 0:
                self.fail(f"reference checkpoint id marker is {marker}, not 0 or 1", at)

    # -- operator state ----------------------------------------------------------------------

    def operator_handle(self, slot: str) -> None:
        at = self.pos
        t = self.i8(f"{slot} handle type byte")
        if t == NULL_HANDLE:
            return
        if t not in (OPERATOR_STREAM, FILE_MERGING_OPERATOR_STREAM):
            self.fail(f"unknown operator state handle type byte {t} in {slot}", at)
        for _ in range(self.count("operator state name count", 2 + 1 + 4)):
            self.utf("operator state name")
            mode_at = self.pos
            mode = self.i8("distribution mode")
            if not 0 <= mode < len(_MODES):
                self.fail(f"unknown distribution mode {mode} (Flink knows 0..2)", mode_at)
            self.skip(8 * self.count("partition offset count", 8), "partition offsets")
        if t == OPERATOR_STREAM:
            self.stream_handle(slot, "stream", 0)
            return
        taskowned = self.utf("task-owned directory")
        shared = self.utf("shared directory")
        empty_at = self.pos
        if self.u8("empty flag") not in (0, 1):
            self.fail("file-merging operator handle's empty flag is not 0 or 1", empty_at)
        delegate_at = self.pos
        delegate = self.stream_handle(slot, "stream", 0)
        if delegate not in ("SegmentFileStateHandle", "EmptySegmentFileStateHandle"):
            self.fail(f"file-merging operator handle (type 17) holds a {delegate or 'null'} "
                      f"(type byte {self.data[delegate_at]}): Flink requires a segment "
                      f"(15 or 16)", delegate_at)
        self.emit(slot, "dir:taskowned", "DirectoryStreamStateHandle", taskowned, 0, 0)
        self.emit(slot, "dir:shared", "DirectoryStreamStateHandle", shared, 0, 0)

    # -- keyed state -------------------------------------------------------------------------

    def key_group_range(self) -> None:
        at = self.pos
        start = self.i32("start key group")
        n = self.i32("key group count")
        if n < 0:
            self.fail(f"negative key group count {n}", at + 4)
        if n > 0 and (start < 0 or start + n - 1 > _INT_MAX):
            self.fail(f"invalid key group range: start {start}, count {n}", at)

    def keyed_handle(self, slot: str, role: str, depth: int) -> str | None:
        """One keyed handle; returns its kind for the changelog handle's checks."""
        at = self.pos
        t = self.i8(f"{slot} keyed handle type byte")
        self.nesting(depth, t, at)
        if t == NULL_HANDLE:
            return None
        if t in (KEY_GROUPS, KEY_GROUPS_V2, SAVEPOINT_KEY_GROUPS):
            self.key_groups_body(slot, role or "stream", depth)
            if t == KEY_GROUPS_V2:
                self.utf("state handle id")
            return "keygroups"
        if t in (INCREMENTAL, INCREMENTAL_V2):
            self.i64("incremental checkpoint id")
            self.utf("backend identifier")
            self.key_group_range()
            if t == INCREMENTAL_V2:
                self.i64("checkpointed size")
            self.stream_handle(slot, "meta", depth + 1)
            for kind in ("shared", "private"):
                for _ in range(self.count(f"{kind} state count", 2 + 1)):
                    local = self.utf(f"{kind} state local path")
                    self.stream_handle(slot, f"{kind}:{local}", depth + 1)
            if t == INCREMENTAL_V2:
                self.utf("state handle id")
            return "incremental"
        if t in (CHANGELOG, CHANGELOG_V2):
            self.key_group_range()
            self.i64("checkpointed size")
            for _ in range(self.count("materialized handle count", 1)):
                self.keyed_handle(slot, "", depth + 1)
            for _ in range(self.count("non-materialized handle count", 1)):
                delta_at = self.pos
                delta_kind = self.keyed_handle(slot, "", depth + 1)
                if delta_kind not in (None, "changelog-delta"):
                    self.fail(f"changelog handle's non-materialized part is not a changelog "
                              f"state handle (type byte {self.data[delta_at]})", delta_at)
            self.i64("materialization id")
            if t == CHANGELOG_V2:
                self.i64("checkpoint id")
            self.utf("state handle id")
            return "changelog"
        if t == CHANGELOG_BYTES:
            self.key_group_range()
            self.i64("sequence number from")
            self.i64("sequence number to")
            for _ in range(self.count("state change count", 8)):
                self.i32("state change key group")
                self.skip(self.length("state change length"), "state change bytes")
            self.utf("state handle id")
            return "changelog-delta"
        if t in (CHANGELOG_FILE, CHANGELOG_FILE_V2):
            self.key_group_range()
            for _ in range(self.count("changelog stream count", 8 + 1)):
                self.i64("changelog stream offset")
                self.stream_handle(slot, "changelog", depth + 1)
            self.i64("state size")
            self.i64("checkpointed size")
            self.utf("state handle id")
            if t == CHANGELOG_FILE_V2:
                self.utf("storage identifier")
            return "changelog-delta"
        self.fail(f"unknown keyed state handle type byte {t} in {slot}", at)

    def key_groups_body(self, slot: str, role: str, depth: int) -> None:
        at = self.pos
        self.key_group_range()
        n = _I32.unpack_from(self.data, at + 4)[0]
        self.skip(8 * n, "key group offsets")
        self.stream_handle(slot, role, depth + 1)

    # -- channel state (unaligned checkpoints) -----------------------------------------------

    def channel_handles(self, slot: str, regular: int, merged: int) -> None:
        smallest = 1 if self.version >= 6 else 4 + 8 + 4 + 8 + 1
        for _ in range(self.count(f"{slot} handle count", smallest)):
            at = self.pos
            t = self.u8(f"{slot} handle type byte") if self.version >= 6 else regular
            if t == regular:
                self.i32("channel handle subtask index")
                self.i32("channel info (gate or partition index)")
                self.i32("channel info (channel or subpartition index)")
                self.skip(8 * self.count("channel offset count", 8), "channel offsets")
                self.i64("channel state size")
                self.stream_handle(slot, "stream", 0)
            elif t == merged:
                self.i32("merged channel handle subtask index")
                self.i64("merged channel state size")
                self.stream_handle(slot, "stream", 0)
                self.skip(self.length("serialized channel offsets length"),
                          "serialized channel offsets")
            else:
                self.fail(f"unknown {slot} handle type byte {t} (Flink expects {regular} or "
                          f"{merged} here)", at)

    # -- stream handles ----------------------------------------------------------------------

    def stream_handle(self, slot: str, role: str, depth: int) -> str | None:
        """One stream handle, recorded; returns Flink's class simple name (``None``: null)."""
        at = self.pos
        t = self.u8(f"{slot} stream handle type byte")
        self.nesting(depth, t, at)
        if t == NULL_HANDLE:
            return None
        if t == FILE_STREAM:
            size = self.i64("file state size")
            path = self.utf("file path")
            self.emit(slot, role, "FileStateHandle", path, 0, size)
            return "FileStateHandle"
        if t == BYTE_STREAM:
            name = self.utf("inline handle name")
            n = self.length("inline data length")
            self.pos += n
            self.emit(slot, role, "ByteStreamStateHandle", name, 0, n)
            return "ByteStreamStateHandle"
        if t == RELATIVE_FILE:
            rel = self.utf("relative path")
            size = self.i64("relative file state size")
            self.emit(slot, role, "RelativeFileStateHandle", rel, 0, size)
            return "RelativeFileStateHandle"
        if t == KEY_GROUPS:
            self.key_groups_body(slot, role, depth)
            return "KeyGroupsStateHandle"
        if t == SEGMENT_FILE:
            start = self.i64("segment start")
            size = self.i64("segment size")
            scope_at = self.pos
            scope = self.i32("segment scope")
            if not 0 <= scope < len(_SCOPES):
                self.fail(f"unknown segment scope {scope} (Flink knows 0 exclusive, 1 shared)",
                          scope_at)
            path = self.utf("segment file path")
            logical = self.utf("segment logical file id")
            self.emit(slot, role, "SegmentFileStateHandle", path, start, size, _SCOPES[scope],
                      logical)
            return "SegmentFileStateHandle"
        if t == EMPTY_SEGMENT_FILE:
            # EmptySegmentFileStateHandle.INSTANCE names no file: its Path "empty", scope
            # EXCLUSIVE and logical id "DUMMY" are placeholders, so none is reported.
            self.emit(slot, role, "EmptySegmentFileStateHandle", None, 0, 0)
            return "EmptySegmentFileStateHandle"
        self.fail(f"unknown stream handle type byte {t} in {slot}", at)


# ---------------------------------------------------------------------------------------------
#  The V4+ trailer: one java.io-serialized CheckpointProperties
# ---------------------------------------------------------------------------------------------

_TC_NULL, _TC_REFERENCE, _TC_CLASSDESC, _TC_OBJECT = 0x70, 0x71, 0x72, 0x73
_TC_STRING, _TC_ARRAY, _TC_CLASS, _TC_BLOCKDATA = 0x74, 0x75, 0x76, 0x77
_TC_ENDBLOCKDATA, _TC_BLOCKDATALONG, _TC_LONGSTRING, _TC_ENUM = 0x78, 0x7A, 0x7C, 0x7E
_SC_WRITE_METHOD, _SC_SERIALIZABLE, _SC_EXTERNALIZABLE, _SC_BLOCK_DATA = 0x01, 0x02, 0x04, 0x08
_BASE_HANDLE = 0x7E0000
_PRIMITIVE_SIZES = {"B": 1, "C": 2, "D": 8, "F": 4, "I": 4, "J": 8, "S": 2, "Z": 1}
_PROPERTIES_CLASS = "org.apache.flink.runtime.checkpoint.CheckpointProperties"


@dataclass(slots=True)
class _ClassDesc:
    name: str
    flags: int
    fields: list[tuple[str, str]]
    parent: _ClassDesc | None


@dataclass(slots=True)
class _JavaObject:
    cls: _ClassDesc
    fields: dict[str, object]


@dataclass(frozen=True, slots=True)
class _JavaEnum:
    cls: str
    constant: str


class _JavaStream:
    """The java.io serialization grammar (Java Object Serialization Specification, chapter 6),
    enough to walk any stream of plain serializable objects, strings, enums and arrays to its
    end without instantiating anything. Proxy classes, exceptions and resets are refused: a
    ``CheckpointProperties`` holds none."""

    def __init__(self, src: _Reader) -> None:
        self.src = src
        self.handles: list[object] = []

    def checkpoint_properties(self) -> tuple[bool | None, dict[str, object]]:
        s = self.src
        at = s.pos
        magic = s.u16("checkpoint properties stream magic")
        version = s.u16("checkpoint properties stream version")
        if (magic, version) != (0xACED, 5):
            s.fail(f"checkpoint properties are not a Java serialization stream (starts "
                   f"{magic:04X} {version:04X}, expected ACED 0005)", at)
        at = s.pos
        root = self.content(0)
        if not isinstance(root, _JavaObject) or root.cls.name != _PROPERTIES_CLASS:
            s.fail(f"checkpoint properties stream holds {_describe(root)}, not a "
                   f"{_PROPERTIES_CLASS}", at)
        props: dict[str, object] = {}
        savepoint: bool | None = None
        for name, value in root.fields.items():
            if name == "checkpointType":
                savepoint, props[name] = _snapshot_kind(value)
            elif isinstance(value, (bool, int, float, str)) or value is None:
                props[name] = value
        return savepoint, props

    def content(self, depth: int) -> object:
        s = self.src
        at = s.pos
        if depth >= MAX_NESTING:
            s.fail(f"checkpoint properties nested deeper than {MAX_NESTING} levels", at)
        tc = s.u8("serialization type code")
        if tc == _TC_NULL:
            return None
        if tc == _TC_REFERENCE:
            return self.reference(at)
        if tc == _TC_STRING:
            return self.new(s.utf("serialized string"))
        if tc == _TC_LONGSTRING:
            n_at = s.pos
            n = s.i64("serialized long string length")
            if n < 0 or n > s.end - s.pos:
                s.fail(f"oversize serialized long string length {n}", n_at)
            start = s.pos
            s.pos += n
            return self.new(_modified_utf8(s.data[start:start + n], s, start, "long string"))
        if tc == _TC_CLASSDESC:
            return self.class_desc_body(depth)
        if tc == _TC_CLASS:
            desc = self.class_desc(depth + 1)
            return self.new(desc)
        if tc == _TC_ENUM:
            desc = self.class_desc(depth + 1)
            index = len(self.handles)
            self.handles.append(None)
            constant = self.content(depth + 1)
            if not isinstance(constant, str):
                s.fail("serialized enum constant name is not a string", at)
            if desc is None:
                s.fail("serialized enum without a class", at)
            value = _JavaEnum(desc.name, constant)
            self.handles[index] = value
            return value
        if tc == _TC_OBJECT:
            desc = self.class_desc(depth + 1)
            if desc is None:
                s.fail("serialized object without a class", at)
            obj = _JavaObject(desc, {})
            self.new(obj)
            self.class_data(obj, depth + 1)
            return obj
        if tc == _TC_ARRAY:
            desc = self.class_desc(depth + 1)
            if desc is None or not desc.name.startswith("[") or len(desc.name) < 2:
                s.fail("serialized array without an array class", at)
            arr: list[object] = []
            self.new(arr)
            component = desc.name[1]
            width = _PRIMITIVE_SIZES.get(component)
            n = s.count("serialized array length", width or 1)
            if width is not None:
                s.skip(n * width, "serialized array elements")
            else:
                arr.extend(self.content(depth + 1) for _ in range(n))
            return arr
        if tc in (_TC_BLOCKDATA, _TC_BLOCKDATALONG):
            s.fail("block data where an object was expected", at)
        s.fail(f"unsupported serialization type code 0x{tc:02X} in the checkpoint properties",
               at)

    def new(self, value: object) -> object:
        self.handles.append(value)
        return value

    def reference(self, at: int) -> object:
        s = self.src
        handle = s.i32("serialized back reference")
        index = handle - _BASE_HANDLE
        if not 0 <= index < len(self.handles):
            s.fail(f"serialized back reference 0x{handle:08X} names no earlier object", at)
        return self.handles[index]

    def class_desc(self, depth: int) -> _ClassDesc | None:
        s = self.src
        at = s.pos
        value = self.content(depth)
        if value is not None and not isinstance(value, _ClassDesc):
            s.fail(f"expected a class descriptor, found {_describe(value)}", at)
        return value

    def class_desc_body(self, depth: int) -> _ClassDesc:
        s = self.src
        name = s.utf("serialized class name")
        s.i64("serialVersionUID")
        desc = _ClassDesc(name, 0, [], None)
        self.new(desc)
        desc.flags = s.u8("class descriptor flags")
        count_at = s.pos
        n_fields = s.i16("serialized field count")
        if n_fields < 0 or n_fields * 3 > s.end - s.pos:
            s.fail(f"bad serialized field count {n_fields}", count_at)
        for _ in range(n_fields):
            code_at = s.pos
            code = chr(s.u8("field type code"))
            fname = s.utf("field name")
            if code in "L[":
                type_at = s.pos
                if not isinstance(self.content(depth + 1), str):
                    s.fail(f"field {fname!r} has no type name", type_at)
            elif code not in _PRIMITIVE_SIZES:
                s.fail(f"unknown field type code {code!r} of field {fname!r}", code_at)
            desc.fields.append((code, fname))
        self.annotation(depth + 1)
        desc.parent = self.class_desc(depth + 1)
        return desc

    def annotation(self, depth: int) -> None:
        """Block data and objects up to TC_ENDBLOCKDATA."""
        s = self.src
        while True:
            if s.pos >= s.end:
                s.need(1, "end of serialized annotation")
            tc = s.data[s.pos]
            if tc == _TC_ENDBLOCKDATA:
                s.pos += 1
                return
            if tc == _TC_BLOCKDATA:
                s.pos += 1
                s.skip(s.u8("block data length"), "block data")
            elif tc == _TC_BLOCKDATALONG:
                s.pos += 1
                s.skip(s.length("long block data length"), "block data")
            else:
                self.content(depth)

    def class_data(self, obj: _JavaObject, depth: int) -> None:
        s = self.src
        chain: list[_ClassDesc] = []
        desc: _ClassDesc | None = obj.cls
        while desc is not None:
            if len(chain) > MAX_NESTING:
                s.fail(f"class hierarchy deeper than {MAX_NESTING} levels")
            chain.append(desc)
            desc = desc.parent
        for desc in reversed(chain):
            if desc.flags & _SC_SERIALIZABLE:
                for code, fname in desc.fields:
                    obj.fields[fname] = self.field_value(code, depth)
                if desc.flags & _SC_WRITE_METHOD:
                    self.annotation(depth)
            elif desc.flags & _SC_EXTERNALIZABLE:
                if not desc.flags & _SC_BLOCK_DATA:
                    s.fail(f"externalizable class {desc.name} without block data")
                self.annotation(depth)

    def field_value(self, code: str, depth: int) -> object:
        s = self.src
        if code == "Z":
            return s.u8("boolean field") != 0
        if code == "B":
            return s.i8("byte field")
        if code in "CS":
            return s.u16("char field") if code == "C" else s.i16("short field")
        if code in "IF":
            return s.i32("int field")
        if code in "JD":
            return s.i64("long field")
        return self.content(depth)


def _describe(value: object) -> str:
    if isinstance(value, _JavaObject):
        return f"a {value.cls.name}"
    if isinstance(value, _JavaEnum):
        return f"enum {value.cls}.{value.constant}"
    return "null" if value is None else f"a {type(value).__name__}"


def _snapshot_kind(value: object) -> tuple[bool | None, object]:
    """Savepoint or checkpoint, from CheckpointProperties.checkpointType: a SavepointType or
    CheckpointType object (Flink 1.15+), or the older enum CheckpointType."""
    if isinstance(value, _JavaObject):
        simple = value.cls.name.rsplit(".", 1)[-1]
        if simple == "SavepointType":
            return True, simple
        if simple == "CheckpointType":
            return False, simple
        return None, simple
    if isinstance(value, _JavaEnum):
        return value.constant.startswith("SAVEPOINT"), value.constant
    return None, None


# ---------------------------------------------------------------------------------------------
#  Entry points
# ---------------------------------------------------------------------------------------------


def read_flink_metadata(data: bytes, *, source: str) -> FlinkMetadata:
    """Every handle of one Flink ``_metadata``; :class:`FlinkMetadataError` on anything this
    reader cannot read exactly as Flink would (``source`` names the file in the message)."""
    return _Reader(bytes(data), source).metadata()


def flink_path(uri: str) -> str:
    """``new org.apache.flink.core.fs.Path(uri).toString()`` for the URIs a checkpoint names:
    an empty authority dropped (``file:///x`` is ``file:/x``), repeated slashes collapsed, a
    trailing slash removed (but for the root)."""
    scheme, authority, path = _split(uri)
    while "//" in path:
        path = path.replace("//", "/")
    if len(path) > 1 and path.endswith("/"):
        path = path[:-1]
    return _join(scheme, authority, path)


def flink_path_join(parent: str, child: str) -> str:
    """``new Path(new Path(parent), child).toString()``: ``child`` resolved against ``parent``
    taken as a directory, as Flink's ``Path(Path, Path)`` does it: a leading slash of the child
    dropped, then java.net.URI.resolve (dot segments removed). Flink writes a relative path as
    a plain file name; the other forms follow Flink's Path, checked on Flink 2.3.0."""
    if _split(child)[0] is not None:
        return flink_path(child)
    scheme, authority, ppath = _split(flink_path(parent))
    child = child[1:] if child.startswith("/") else child
    merged = (ppath if ppath.endswith("/") else ppath + "/") + child
    out: list[str] = []
    for seg in merged.split("/")[1:] if merged.startswith("/") else merged.split("/"):
        if seg == ".":
            continue
        if seg == ".." and out and out[-1] != "..":
            out.pop()
            continue
        out.append(seg)
    path = ("/" if merged.startswith("/") else "") + "/".join(out)
    return flink_path(_join(scheme, authority, path))


def _split(uri: str) -> tuple[str | None, str | None, str]:
    scheme: str | None = None
    rest = uri
    colon = uri.find(":")
    slash = uri.find("/")
    if colon > 0 and (slash == -1 or colon < slash) and uri[0].isalpha():
        scheme, rest = uri[:colon], uri[colon + 1:]
    authority: str | None = None
    if rest.startswith("//"):
        end = rest.find("/", 2)
        end = len(rest) if end == -1 else end
        authority, rest = rest[2:end] or None, rest[end:]
    return scheme, authority, rest


def _join(scheme: str | None, authority: str | None, path: str) -> str:
    return ((f"{scheme}:" if scheme is not None else "")
            + (f"//{authority}" if authority is not None else "") + path)


def as_truth_dicts(meta: FlinkMetadata, metadata_dir_uri: str) -> list[dict[str, object]]:
    """The contract's HANDLE dicts, a ``RelativeFileStateHandle`` resolved against the
    directory holding the ``_metadata`` (``metadata_dir_uri``, the checkpoint's external
    pointer), as Flink's loader resolves it."""
    out: list[dict[str, object]] = []
    for h in meta.handles:
        path = h.path
        if h.type == "RelativeFileStateHandle" and path is not None:
            path = flink_path_join(metadata_dir_uri, path)
        out.append({"operator": h.operator, "subtask": h.subtask, "slot": h.slot,
                    "role": h.role, "type": h.type, "path": path, "offset": h.offset,
                    "length": h.length, "scope": h.scope, "logical_id": h.logical_id})
    return out
