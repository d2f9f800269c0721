"""A TM's segments and physical files: a segment discarded once (R33), a closed file
deleted once nothing refers to it and space amplification bounded (R15, R80, R81), WITHIN
files closed once nobody can write to them (R14), an upload that failed never written
again (R17), what was written and never acknowledged dropped, and the TM's directories
deleted only when every checkpoint that reported them aborted (R41); and what a host
reads of them: the files the TM owns (R90) and records (R64), its deletes carried out
(R45), its open files given up to another process (R16).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fastimpl.storage import StorageFault
from fastimpl.tm_attempt import TmAttempt
from spec.config import Scope
from spec.errors import UsageError
from spec.handles import FileHandle, SegmentHandle
from spec.ids import SubtaskId
from spec.layout import is_under
from spec.messages import KeptFile


def drawn_order(name: str) -> tuple[int, str]:
    """Ids and file names one id source drew (``fastimpl.ids``), in the order it drew them:
    a source's names never get shorter and, at one length, sort as drawn (``CounterIds``
    pads its counter; ``RandomIds`` writes it unpadded after a fixed-length prefix, so
    "...z" was drawn before "...10", which a plain sort puts first)."""
    return len(name), name


def path_order(path: str) -> tuple[str, int, str]:
    """Paths by directory as a plain sort orders them, then as their names were drawn."""
    head, _, name = path.rpartition("/")
    return head + "/", *drawn_order(name)


class TmFiles:
    """The segments and files of the attempt ``a``.

    Where one step deletes several files it goes in the order they were made (the model
    orders by its one counter of ids and names): it matters which delete a storage fault
    hits. The segments this attempt took over, made before it started, come before
    its own, which go as their ids were drawn (``drawn_order``); its files by directory,
    then as their names were drawn (``path_order``)."""

    def __init__(self, a: TmAttempt) -> None:
        self.a = a
        a.catalog.dir_rules[a.actor] = self._releasable

    def _discard(self, lid: str) -> None:
        """R33: a segment leaves the table once and decrements its file's count once."""
        seg = self.a.m.remove(lid)
        if seg is None:
            return
        pf = self.a.m.pfiles[seg.path]
        pf.ref_count -= 1
        pf.live_bytes -= seg.length
        self._check_file(seg.path)

    def discard_all(self, lids: Iterable[str]) -> None:
        """Discard the segments ``lids`` (a subsume, an abort, the job's end), in the
        order they were made."""
        a = self.a
        segs = a.m.segs
        files = a.catalog.files

        def made(lid: str) -> tuple[bool, int, str]:
            seg = segs.get(lid)
            f = None if seg is None else files.get(seg.path)
            return f is not None and f.creator == a.tm, *drawn_order(lid)

        for lid in sorted(lids, key=made):
            self._discard(lid)

    def _check_file(self, path: str) -> None:
        """R15, R80, R81: delete a closed unreferenced file; bound space amplification."""
        a = self.a
        pf = a.m.pfiles.get(path)
        if pf is None:
            return
        bound = a.cfg.amplification_bound
        if bound is not None and pf.size > bound * pf.live_bytes:
            pf.reusable = False
            if pf.open:
                self._close_pfile(path)  # R81
                return
        if not pf.open and pf.ref_count == 0:
            del a.m.pfiles[path]
            f = a.catalog.files.get(path)
            if f is not None and f.owner == a.actor:
                a.catalog.delete_file(path, a.actor)

    def _close_pfile(self, path: str) -> None:
        m = self.a.m
        pf = m.pfiles[path]
        if pf.pool_key is not None and m.pools.get(pf.pool_key) == path:
            del m.pools[pf.pool_key]
        if pf.open:
            catalog = self.a.catalog
            try:
                catalog.close(path)
            except StorageFault:
                # R17: an upload that failed is never written again. Whoever closed it
                # for a checkpoint being acknowledged declines; on other paths (a
                # notification closing a garbage file) there is nothing to decline.
                pf.reusable = False
                f = catalog.files.get(path)
                if f is not None:
                    f.open = False
                catalog.failed_uploads.add(path)
            pf.open = False
        self._check_file(path)

    def close_open_files(self) -> None:
        m = self.a.m
        for path in sorted(m.pfiles, key=path_order):
            pf = m.pfiles.get(path)
            if pf is not None and pf.open:
                self._close_pfile(path)

    def close_within_files(
        self, which: Callable[[int], bool], subtask_done: SubtaskId | None = None
    ) -> None:
        """R14: a WITHIN file closes once nobody can still write to it for its checkpoint."""
        m = self.a.m
        for path in sorted(m.pfiles, key=path_order):
            pf = m.pfiles.get(path)
            if pf is None or not pf.open or pf.checkpoint is None or not which(pf.checkpoint):
                continue
            if subtask_done is not None:
                assert pf.pool_key is not None
                if pf.scope is Scope.SHARED and pf.pool_key[2] != str(subtask_done):
                    continue
                if (
                    pf.scope is Scope.EXCLUSIVE
                    and self.a.cfg.open_files_readable
                    and not self._done_with(pf.checkpoint)
                ):
                    continue  # R12: on an object store the acknowledgement uploads it now
            self._close_pfile(path)

    def _done_with(self, checkpoint: int) -> bool:
        acked = self.a.acked
        return all((s, checkpoint) in acked for s in self.a.hosted)

    def drop_outputs_where(self, which: Callable[[int], bool]) -> None:
        a = self.a
        keys = {k for k in a.outputs if which(k[1])}
        keys |= {k for k in a.working.pin_keys() if which(k[1])}  # working state (§11)
        for key in sorted(keys, key=str):
            self.drop_outputs(key[0], key[1])

    def drop_outputs(self, subtask: SubtaskId, checkpoint: int) -> None:
        """Discard what a subtask wrote for a checkpoint and never acknowledged."""
        a = self.a
        a.working.drop_pins(subtask, checkpoint)  # working state (§11): R102
        for e in a.outputs.pop((subtask, checkpoint), ()):
            h = e.handle
            bkey = (subtask, e.name)
            if isinstance(h, FileHandle):
                f = a.catalog.files.get(h.path)
                if f is not None and f.owner == a.actor:
                    a.catalog.delete_file(h.path, a.actor)
                ref = a.backend.get(bkey)
                if ref is not None and ref.entry == e:
                    del a.backend[bkey]
            elif isinstance(h, SegmentHandle):
                seg = a.m.segs.get(h.logical_id)
                if seg is not None and seg.created_for == checkpoint:
                    if seg.last_used <= checkpoint:
                        self._discard(h.logical_id)
                ref = a.backend.get(bkey)
                if ref is not None and ref.entry == e and not ref.confirmed:
                    del a.backend[bkey]

    def _release_dirs(self) -> None:
        """R41: delete a directory only when every checkpoint that reported it aborted."""
        catalog = self.a.catalog
        for path in sorted(catalog.dirs):
            if self._releasable(path):
                catalog.delete_dir(path, self.a.actor)

    def _releasable(self, path: str) -> bool:
        """R41 for one directory: this TM may delete it now."""
        a = self.a
        d = a.catalog.dirs.get(path)
        if d is None or d.creator != a.tm or d.handed_over or not d.used_by:
            return False
        if a.catalog.dir_owner.get(path) != a.actor:
            return False
        if not d.used_by <= a.known_aborted:
            return False
        if any(is_under(p, path) for p in a.m.pfiles):
            return False
        # and nothing else is in it on storage (``Catalog.delete_dir``, R66)
        return not any(is_under(f, path) for f in a.catalog.files)

    # ------------------------------------------------------------------ for a host (parties)

    def flush(self) -> None:
        """Wait until every delete this TM decided has been carried out. Its storage
        deletes in a background thread, which dies with the process: a host calls this
        before it answers a message whose effects it reports, and before its process
        exits, or a delete decided and lost leaves an orphan (R45 keeps only the deletes
        that failed)."""
        self.a.catalog.storage.drain()

    def kept_files(self) -> tuple[KeptFile, ...]:
        """The files this TM owns, by path, with their sizes and creators: what it would
        hand to the coordinator if its job ended now (R90, ``TmEnded.files``)."""
        a = self.a
        return tuple(
            KeptFile(p, f.size, f.creator)
            for p, f in sorted(a.catalog.files.items())
            if f.owner == a.actor
        )

    def held_files(self) -> tuple[str, ...]:
        """Every file this TM records (in its file records or its file-merging tables),
        by path: its answer to ``Holdings`` for every directory (R64)."""
        return tuple(sorted(set(self.a.catalog.files) | set(self.a.m.pfiles)))

    def detach(self) -> tuple[str, ...]:
        """Give up this process's handles of the TM's open pooled files without closing
        them on storage (every append is durable already), for a host that continues
        this attempt in another process from its records (``export_state``, then
        ``rebuild`` there reopens them); the TM is not used in this process afterwards.
        Local disks only: elsewhere an open file's bytes are its writer process's until
        it closes (R16), so ``ValueError``, nothing given up. Returns the files given
        up, by path."""
        catalog = self.a.catalog
        storage = catalog.storage
        still_open = tuple(sorted(p for p, f in catalog.files.items() if f.open))
        if still_open and storage.protocol not in ("file", "local"):
            raise UsageError(f"{still_open[0]} is still open on {storage.protocol}: not detached")
        for path in still_open:
            storage.abandon(path)
        return still_open
