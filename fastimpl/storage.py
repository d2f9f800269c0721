"""Storage: a thin layer over an fsspec file system and a root path.

Every storage call the store makes is a method here, so that a fault injector (armed by
``FailNextCall``) or a later fault-injecting wrapper can fail it. Paths are relative to
the root and ``/``-separated, as in ``spec.layout``.

Durability (R12): a file written through ``append`` is flushed, and on a local file
system ``os.fsync``-ed, before the call returns, so a handle built after it names bytes
that survive a crash. On other stores a file is durable once closed.
"""

from __future__ import annotations

import os
from typing import IO, Any

from fastimpl.metadata import Metadata, decode
from spec.commands import StorageOp

_CHUNK = b"\0" * 65536


class StorageFault(Exception):
    """A storage call failed (an armed fault, R17, R45, R51)."""

    def __init__(self, op: StorageOp, path: str) -> None:
        super().__init__(f"{op.value} {path}")
        self.op = op
        self.path = path


class Storage:
    """Performs the effects of the store on a real file system."""

    __slots__ = ("_local", "_open", "armed", "fs", "root")

    def __init__(self, fs: Any, root: str) -> None:
        self.fs = fs
        self.root = fs._strip_protocol(root).rstrip("/") if root else ""
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        self._local = protocol in ("file", "local")
        self._open: dict[str, IO[bytes]] = {}
        self.armed: list[StorageOp] = []
        """Faults armed by ``FailNextCall``: the next call of each kind fails."""

    def full(self, path: str) -> str:
        if not path:
            return self.root
        return f"{self.root}/{path}" if self.root else path

    # ------------------------------------------------------------------ faults

    def arm(self, op: StorageOp) -> None:
        self.armed.append(op)

    def fire(self, op: StorageOp, path: str) -> None:
        if op in self.armed:
            self.armed.remove(op)
            raise StorageFault(op, path)

    # ------------------------------------------------------------------ calls

    def mkdir(self, path: str) -> None:
        self.fs.makedirs(self.full(path), exist_ok=True)

    def create(self, path: str) -> None:
        self.fire(StorageOp.CREATE, path)
        full = self.full(path)
        self.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
        f: IO[bytes] = open(full, "wb") if self._local else self.fs.open(full, "wb")  # noqa: SIM115
        self._open[path] = f

    def append(self, path: str, length: int) -> None:
        """Append ``length`` bytes to an open file and make them durable."""
        self.fire(StorageOp.APPEND, path)
        f = self._open[path]
        left = length
        while left > 0:
            n = min(left, len(_CHUNK))
            f.write(_CHUNK[:n])
            left -= n
        f.flush()
        if self._local:
            os.fsync(f.fileno())

    def close(self, path: str) -> None:
        f = self._open.pop(path, None)
        if f is not None:
            f.close()

    def delete_file(self, path: str) -> None:
        self.fire(StorageOp.DELETE, path)
        self.close(path)
        try:
            self.fs.rm_file(self.full(path))
        except FileNotFoundError:
            pass  # already gone: the caller records what it believed

    def delete_dir(self, path: str) -> None:
        """Delete a managed directory and everything in it."""
        self.fire(StorageOp.DELETE, path)
        for p in [p for p in self._open if p.startswith(path + "/")]:
            self.close(p)
        full = self.full(path)
        if self.fs.exists(full):
            self.fs.rm(full, recursive=True)

    def write_metadata(self, path: str, data: bytes) -> None:
        """Write a checkpoint's metadata atomically: a temporary file, then a rename."""
        self.fire(StorageOp.METADATA, path)
        full = self.full(path)
        self.fs.makedirs(full.rsplit("/", 1)[0], exist_ok=True)
        tmp = full + ".inprogress"
        if self._local:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, full)
        else:
            with self.fs.open(full, "wb") as f:
                f.write(data)

    def read_metadata(self, path: str, *, expected_job: str | None = None) -> Metadata:
        """Read and validate a ``_metadata`` file (``MetadataError`` if it is bad).

        Only reads: a corrupt, truncated or foreign file is reported, never deleted.
        """
        data = bytes(self.fs.cat_file(self.full(path)))
        return decode(data, expected_job=expected_job, source=path)

    # ------------------------------------------------------------------ listing

    def list_files(self) -> dict[str, int]:
        """Every file under the root, with its size, by path relative to the root."""
        if not self.fs.exists(self.root or "/"):
            return {}
        found = self.fs.find(self.root or "/", detail=True)
        prefix = self.root + "/"
        out: dict[str, int] = {}
        for p, info in found.items():
            if info.get("type") != "file":
                continue
            p = p if isinstance(p, str) else str(p)
            rel = p[len(prefix) :] if p.startswith(prefix) else p.lstrip("/")
            out[rel] = int(info["size"])
        return out

    def exists_dir(self, path: str) -> bool:
        return bool(self.fs.isdir(self.full(path)))
