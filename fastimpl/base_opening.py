"""Opening a job's base for writing (issue 14; R16): what the base may already hold, the
lease that fences an earlier writer, and the configuration its storage allows.

Every door that opens a base goes through here: the in-process ``CheckpointStore``
(``fastimpl.api``), an engine that embeds the parties (``open_base``, exported by
``fastimpl.parties``) and the recoveries (``fastimpl.recovery``, which take the lease
with a ``lease_token``), so that a base is refused, leased and judged the same way
whichever of them opens it."""

from __future__ import annotations

import os
import socket
import time
import uuid
from typing import Any, Literal

import attrs

from fastimpl.storage import WRITER_LEASE, Storage, open_files_readable
from spec.config import Config
from spec.errors import CkptError, UsageError


class BaseInUseError(CkptError, ValueError):
    """The base holds another job's files (or another store's lease): a new store there
    would overwrite or delete them. Nothing was written."""


def lease_token(tool: str = "") -> bytes:
    """A token no other writer holds, with what a person needs to find its owner (the
    host, the process, since when, and ``tool``, the program that holds it, if named)."""
    by = f" ({tool})" if tool else ""
    return (
        f"{uuid.uuid4().hex} host={socket.gethostname()} pid={os.getpid()}"
        f" since={time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}{by}\n"
    ).encode()


def refuse_held(
    where: str, jobs: list[int], savepoints: list[int], leased: bool, hint: str = ""
) -> None:
    """A new job's base must hold no job, savepoint or other store's lease: a new job
    there would overwrite or delete them (``BaseInUseError``, naming what it holds)."""
    if not (jobs or savepoints or leased):
        return
    held = [f"job-{n}" for n in jobs] + [f"savepoint-{n}" for n in savepoints]
    what = ", ".join(held[:10]) + (" ..." if len(held) > 10 else "")
    lease = f"another store's lease ({WRITER_LEASE})" if leased else ""
    raise BaseInUseError(
        f"{where} holds {what or lease}{' and ' + lease if what and lease else ''}:"
        f" a new job there would overwrite or delete it{hint}"
    )


def readable_config(fs: Any, config: Config) -> Config:
    """R16: the configuration to run with on ``fs``: ``open_files_readable`` turned off
    where the bytes of an open file are not readable (object stores), which ``Config``
    refuses for ACROSS merging (``UsageError``), since it would lose data. The answer
    comes from the storage that finally holds the bytes, through any wrappers (an
    unknown wrapper is refused: ``UnknownWrapperError``; a cache over a local disk:
    ``CachedLocalDiskError``, issue 14). Asks no storage call."""
    if not open_files_readable(fs) and config.open_files_readable:
        return attrs.evolve(config, open_files_readable=False)
    return config


def refuse_unreadable_open_files(fs: Any, config: Config) -> None:
    """R16's refusal alone, before any I/O (``readable_config``), for a caller that
    takes the base first and builds its parties after (the in-process store, whose
    ``InProcessEngine`` runs ``readable_config`` itself)."""
    readable_config(fs, config)


OnExisting = Literal["refuse", "fresh-id"]
"""What a new store does on a base that holds a job already (issue 14): ``"refuse"``
(the default) raises ``BaseInUseError``; ``"fresh-id"`` starts a new job beside the old
ones, under a job id and checkpoint ids none of them used, and takes the base over.
Continuing a job that was there is ``CheckpointStore.recover``."""


def take_base(
    storage: Storage, where: str, token: bytes, on_existing: OnExisting = "refuse", hint: str = ""
) -> tuple[list[int], list[int]]:
    """Takes the base's lease with ``token`` after deciding on what it holds
    (``on_existing``): a held base is refused (``BaseInUseError``, naming what it holds,
    then ``hint``; nothing written), or with ``"fresh-id"`` taken over, which fences any
    store writing there. The ids of the jobs and savepoints it holds: a new job's ids
    start above them."""
    if on_existing not in ("refuse", "fresh-id"):
        raise UsageError(f"on_existing must be 'refuse' or 'fresh-id', not {on_existing!r}")
    jobs, savepoints, leased = storage.existing()
    if on_existing == "fresh-id":
        storage.take_lease(token, exclusive=False)
        return jobs, savepoints
    refuse_held(where, jobs, savepoints, leased, hint)
    if not storage.take_lease(token, exclusive=True):
        raise BaseInUseError(f"{where}: another store took the base just now ({WRITER_LEASE})")
    return jobs, savepoints


def open_base(fs: Any, root: str, config: Config, token: bytes) -> tuple[Storage, Config]:
    """A new job's storage over ``root`` for an engine that embeds the parties
    (``fastimpl.parties``), and the configuration to run it with there. Refuses
    (``BaseInUseError``, nothing written) a base that holds a job, a savepoint or another
    store's lease, then takes the lease with ``token`` (issue 14: a writer that takes the
    base later fences this one). R16: where the bytes of an open file are not readable
    (object stores), the configuration returned says so (``open_files_readable`` off)."""
    config = readable_config(fs, config)
    storage = Storage(fs, root)
    take_base(storage, root, token)
    return storage, config
