"""SlateDB's binding called directly where its generated Python costs more than the
database: puts and deletes into a ``WriteBatch``, and a scan's rows.

Why: the uniffi binding's ``WriteBatch.put`` costs about 25 µs a call (``slatedb``
0.17.0), nearly all of it in its generated Python, which copies each argument into a
Rust buffer one byte at a time through a context manager per write; a scan's
``next_batch`` lifts each row into a ``KeyValue`` field by field, about 6 µs a row.
Those were most of the working backend's cost per record (about 632,000 puts a batch in
``bench.stream_large``) and of a NO_CLAIM restore's row copy. Here each argument becomes
a Rust buffer in one call (``rustbuffer_from_bytes``) and the put is the binding's own C
function, with the arguments and ownership its generated code gives it (a clone of the
batch's handle and two buffers, all consumed by the callee): about 6 µs. A scan's batch
is the binding's own call and future with a lift that copies the returned buffer once
and cuts the rows out of it.

It reaches into the generated module (``_UniffiLib`` and its helpers, each read once
into ``_Binding``) and two handles (``WriteBatch._handle``,
``DbIterator._uniffi_clone_handle``); ``pyproject.toml`` pins the binding to 0.17. Where a
name is gone, one of the binding's own checksums differs or ``KeyValue`` has other
fields, the public methods run instead (the same effect, slower).
``tests/test_stream_slate_direct.py`` checks that both paths write and read the same rows
and raise the same errors.
"""

from __future__ import annotations

import ctypes
import inspect
import struct
from collections.abc import Iterable
from typing import Any

from attrs import frozen

from spec.errors import OperationFailed


class BindingError(OperationFailed):
    """SlateDB's binding returned a batch of rows that is not whole (cut short, a
    negative count, bytes past its last row): nothing is read from it."""


_LEN = struct.Struct(">i")
"""The binding's lowering of ``bytes``: a big-endian i32 length, then the bytes."""
_STAMPS = 16
"""A ``KeyValue``'s ``seq`` (u64) and ``create_ts`` (i64), skipped."""

_CHECKSUMS = {
    "uniffi_slatedb_uniffi_checksum_method_writebatch_put": 48246,
    "uniffi_slatedb_uniffi_checksum_method_writebatch_delete": 58549,
    "uniffi_slatedb_uniffi_checksum_method_dbiterator_next_batch": 61234,
}
"""The binding's checksums of the methods' signatures (its own init checks them too): a
change of arguments or of a return type's name changes them."""

_KEY_VALUE = ("key", "value", "seq", "create_ts", "expire_ts")
"""The fields of a scan's ``KeyValue`` in the order the binding lowers them (``bytes``,
``bytes``, u64, i64, optional i64): what ``_rows`` cuts a returned buffer by. A
checksum does not cover a record's fields."""


@frozen
class _Binding:
    """What the direct calls use of the generated module, each name read once here:
    a name that is gone makes ``_generated`` return ``None`` (the public methods run)."""

    from_bytes: Any
    clone_batch: Any
    put: Any
    delete: Any
    next_batch: Any
    poll: Any
    complete: Any
    free: Any
    status: Any
    """``RustCallStatus``: the out-parameter every call takes."""
    foreign: Any
    """``ForeignBytes``: what ``rustbuffer_from_bytes`` copies from."""
    check_status: Any
    error: Any
    """The converter that lifts slatedb's ``Error`` from a failed call's status."""
    call_async: Any


def _generated() -> _Binding | None:
    try:
        from slatedb.uniffi._slatedb_uniffi import slatedb as g  # type: ignore[import-untyped]
    except ImportError:
        return None
    try:
        lib = g._UniffiLib
        if any(getattr(lib, name)() != expected for name, expected in _CHECKSUMS.items()):
            return None
        if tuple(inspect.signature(g.KeyValue).parameters) != _KEY_VALUE:
            return None
        return _Binding(
            from_bytes=lib.ffi_slatedb_uniffi_rustbuffer_from_bytes,
            clone_batch=lib.uniffi_slatedb_uniffi_fn_clone_writebatch,
            put=lib.uniffi_slatedb_uniffi_fn_method_writebatch_put,
            delete=lib.uniffi_slatedb_uniffi_fn_method_writebatch_delete,
            next_batch=lib.uniffi_slatedb_uniffi_fn_method_dbiterator_next_batch,
            poll=lib.ffi_slatedb_uniffi_rust_future_poll_rust_buffer,
            complete=lib.ffi_slatedb_uniffi_rust_future_complete_rust_buffer,
            free=lib.ffi_slatedb_uniffi_rust_future_free_rust_buffer,
            status=g._UniffiRustCallStatus,
            foreign=g._UniffiForeignBytes,
            check_status=g._uniffi_check_call_status,
            error=g._UniffiFfiConverterTypeError,
            call_async=g._uniffi_rust_call_async,
        )
    except AttributeError:
        return None


_B = _generated()
_CHAR_P = ctypes.POINTER(ctypes.c_char)


def available() -> bool:
    """Whether the direct calls run (else the public methods do)."""
    return _B is not None


class _Calls:
    """One call status, reused across a batch's calls."""

    def __init__(self, b: _Binding) -> None:
        self.b = b
        self.status = b.status.default()
        self.ref = ctypes.byref(self.status)

    def buffer(self, value: bytes) -> Any:
        """A Rust buffer holding ``value`` lowered as the binding lowers ``bytes``; the
        buffer's owner is the call it is passed to."""
        raw = _LEN.pack(len(value)) + value
        foreign = self.b.foreign(len(raw), ctypes.cast(ctypes.c_char_p(raw), _CHAR_P))
        r = self.b.from_bytes(foreign, self.ref)
        self.check()
        return r

    def check(self) -> None:
        if self.status.code:
            # raises the binding's own error (slatedb's Error, or an InternalError)
            self.b.check_status(self.b.error, self.status)


def _bytes(value: Any) -> bytes:
    """``value`` as ``bytes``; a ``TypeError`` for what is not bytes-like, as the
    binding's own check raises (``bytes(5)`` would be five zero bytes)."""
    return value if type(value) is bytes else bytes(memoryview(value))


def put_many(batch: Any, rows: Iterable[tuple[bytes, bytes]]) -> int:
    """``batch.put(key, value)`` for each row, in order; how many."""
    if _B is None:
        n = 0
        for k, v in rows:
            batch.put(k, v)
            n += 1
        return n
    c = _Calls(_B)
    handle, clone, put = batch._handle, _B.clone_batch, _B.put
    n = 0
    for k, v in rows:
        kb, vb = _bytes(k), _bytes(v)
        key, value = c.buffer(kb), c.buffer(vb)
        h = clone(handle, c.ref)
        c.check()
        put(h, key, value, c.ref)
        c.check()
        n += 1
    return n


def delete_many(batch: Any, keys: Iterable[bytes]) -> int:
    """``batch.delete(key)`` for each key, in order; how many."""
    if _B is None:
        n = 0
        for k in keys:
            batch.delete(k)
            n += 1
        return n
    c = _Calls(_B)
    handle, clone, delete = batch._handle, _B.clone_batch, _B.delete
    n = 0
    for k in keys:
        key = c.buffer(_bytes(k))
        h = clone(handle, c.ref)
        c.check()
        delete(h, key, c.ref)
        c.check()
        n += 1
    return n


async def next_rows(iterator: Any, n: int) -> list[tuple[bytes, bytes]]:
    """Up to ``n`` rows ``(key, value)`` of a scan (``DbIterator.next_batch``): fewer only
    when the scan is exhausted."""
    if _B is None:
        return [(bytes(kv.key), bytes(kv.value)) for kv in await iterator.next_batch(n)]
    future = _B.next_batch(iterator._uniffi_clone_handle(), n)
    rows: list[tuple[bytes, bytes]] = await _B.call_async(
        future, _B.poll, _B.complete, _B.free, _rows, _B.error
    )
    return rows


def _rows(buffer: Any) -> list[tuple[bytes, bytes]]:
    """The rows of a lowered ``Vec<KeyValue>``, read from one copy of the buffer, which
    is freed (the lift owns it). A buffer that does not end where its last row does is
    refused, as the binding's own lift refuses one."""
    try:
        data = ctypes.string_at(buffer.data, buffer.len) if buffer.len else b""
    finally:
        buffer.free()
    unpack = _LEN.unpack_from
    rows: list[tuple[bytes, bytes]] = []
    try:
        (count,) = unpack(data, 0)
        at = 4
        for _ in range(count):
            (size,) = unpack(data, at)
            key = data[at + 4 : at + 4 + size]
            at += 4 + size
            (size,) = unpack(data, at)
            value = data[at + 4 : at + 4 + size]
            at += 4 + size + _STAMPS
            at += 9 if data[at] else 1  # expire_ts: a flag, then an i64 when set
            rows.append((key, value))
    except (struct.error, IndexError) as e:
        raise BindingError(f"SlateDB returned a truncated batch of rows ({len(data)} bytes)") from e
    if count < 0:
        raise BindingError("SlateDB returned a negative row count")
    if at > len(data):
        raise BindingError(f"SlateDB returned a truncated batch of rows ({len(data)} bytes)")
    if at != len(data):
        raise BindingError(f"SlateDB returned {len(data) - at} bytes past the last row")
    return rows
