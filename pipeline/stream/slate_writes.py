"""Many puts and deletes into one SlateDB ``WriteBatch``, each a direct call of the
binding's C function.

Why: the uniffi binding's ``WriteBatch.put`` costs about 25 µs a call (measured on
``slatedb`` 0.17.0, ``docs/slatedb.md``), nearly all of it in its generated Python,
which copies each argument into a Rust buffer one byte at a time and builds a
context manager per write. That call was most of the working backend's cost per
record (about 632,000 puts a batch in ``bench.stream_large``) and of a NO_CLAIM
restore's row copy. Here each argument becomes a Rust buffer in one call
(``rustbuffer_from_bytes``) and the put is the binding's own C function with the
arguments and ownership the generated code gives it: a clone of the batch's handle
and two buffers, all consumed by the callee. About 5 µs a put.

It reaches into the generated module (``_UniffiLib`` and its helpers), which
``pyproject.toml`` pins to 0.17; ``available()`` checks every name and the binding's
own checksum of each function, and where either differs the public method runs
instead (the same effect, slower). ``tests/test_stream_slate_writes.py`` checks that
both paths write the same rows and raise the same errors.
"""

from __future__ import annotations

import ctypes
import struct
from collections.abc import Iterable
from typing import Any

_LEN = struct.Struct(">i")
"""The binding's lowering of ``bytes``: a big-endian i32 length, then the bytes."""

_CHECKSUMS = {
    "uniffi_slatedb_uniffi_checksum_method_writebatch_put": 48246,
    "uniffi_slatedb_uniffi_checksum_method_writebatch_delete": 58549,
}
"""The binding's checksums of the two methods' signatures (its own init checks them
too): a change of arguments changes them."""


def _generated() -> Any:
    try:
        from slatedb.uniffi._slatedb_uniffi import slatedb as g  # type: ignore[import-untyped]
    except ImportError:
        return None
    needed = (
        "_UniffiLib",
        "_UniffiRustCallStatus",
        "_UniffiForeignBytes",
        "_uniffi_check_call_status",
        "_UniffiFfiConverterTypeError",
    )
    if not all(hasattr(g, n) for n in needed):
        return None
    lib = g._UniffiLib
    for name, expected in _CHECKSUMS.items():
        fn = getattr(lib, name, None)
        if fn is None or fn() != expected:
            return None
    for name in (
        "ffi_slatedb_uniffi_rustbuffer_from_bytes",
        "uniffi_slatedb_uniffi_fn_clone_writebatch",
        "uniffi_slatedb_uniffi_fn_method_writebatch_put",
        "uniffi_slatedb_uniffi_fn_method_writebatch_delete",
    ):
        if getattr(lib, name, None) is None:
            return None
    return g


_G = _generated()
_CHAR_P = ctypes.POINTER(ctypes.c_char)


def available() -> bool:
    """Whether the direct calls run (else ``put_many`` and ``delete_many`` call the
    public methods)."""
    return _G is not None


class _Calls:
    """The binding's functions and one call status, reused across a batch's calls."""

    def __init__(self, g: Any) -> None:
        lib = g._UniffiLib
        self.g = g
        self.from_bytes = lib.ffi_slatedb_uniffi_rustbuffer_from_bytes
        self.clone = lib.uniffi_slatedb_uniffi_fn_clone_writebatch
        self.put = lib.uniffi_slatedb_uniffi_fn_method_writebatch_put
        self.delete = lib.uniffi_slatedb_uniffi_fn_method_writebatch_delete
        self.status = g._UniffiRustCallStatus.default()
        self.ref = ctypes.byref(self.status)

    def buffer(self, value: bytes) -> Any:
        """A Rust buffer holding ``value`` lowered as the binding lowers ``bytes``; the
        buffer's owner is the call it is passed to."""
        b = _LEN.pack(len(value)) + value
        foreign = self.g._UniffiForeignBytes(len(b), ctypes.cast(ctypes.c_char_p(b), _CHAR_P))
        r = self.from_bytes(foreign, self.ref)
        self.check()
        return r

    def check(self) -> None:
        if self.status.code:
            # raises the binding's own error (slatedb's Error, or an InternalError)
            self.g._uniffi_check_call_status(self.g._UniffiFfiConverterTypeError, self.status)


def _bytes(value: Any) -> bytes:
    """``value`` as ``bytes``; a ``TypeError`` for what is not bytes-like, as the
    binding's own check raises (``bytes(5)`` would be five zero bytes)."""
    return value if type(value) is bytes else bytes(memoryview(value))


def put_many(batch: Any, rows: Iterable[tuple[bytes, bytes]]) -> int:
    """``batch.put(key, value)`` for each row, in order; how many."""
    if _G is None:
        n = 0
        for k, v in rows:
            batch.put(k, v)
            n += 1
        return n
    c = _Calls(_G)
    handle = batch._handle
    n = 0
    for k, v in rows:
        kb, vb = _bytes(k), _bytes(v)
        key, value = c.buffer(kb), c.buffer(vb)
        h = c.clone(handle, c.ref)
        c.check()
        c.put(h, key, value, c.ref)
        c.check()
        n += 1
    return n


def delete_many(batch: Any, keys: Iterable[bytes]) -> int:
    """``batch.delete(key)`` for each key, in order; how many."""
    if _G is None:
        n = 0
        for k in keys:
            batch.delete(k)
            n += 1
        return n
    c = _Calls(_G)
    handle = batch._handle
    n = 0
    for k in keys:
        key = c.buffer(_bytes(k))
        h = c.clone(handle, c.ref)
        c.check()
        c.delete(h, key, c.ref)
        c.check()
        n += 1
    return n
