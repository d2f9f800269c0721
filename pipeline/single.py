"""The audit in one Python process: the benchmark's baseline and the tests' oracle.

It lists the job base with the same functions the Spark executors run (``pipeline.scan``)
and computes every table with dicts. The definitions here and in ``pipeline.spark_audit``
are the same; a test holds the two to equal answers on every planted fault.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Iterable, Mapping

from fastimpl.parties import WRITER_STATE
from pipeline import fence, scan
from pipeline.foreign import Foreign
from pipeline.location import Location
from pipeline.result import (
    BEYOND,
    CORRUPT,
    IN_FLIGHT,
    METADATA,
    MISSING,
    NO_PATH,
    ORPHAN,
    OTHER_SIZE,
    PENDING,
    REFERENCED,
    STALE,
    TABLES,
    WORKING,
    Row,
    Summary,
    Tables,
    ratio,
)
from spec.layout import is_under


def covered(ranges: Iterable[tuple[int, int]], limit: int | None = None) -> int:
    """Bytes covered by the union of half-open ranges ``(start, end)``, clipped to
    ``[0, limit)`` when a limit is given."""
    total = 0
    reach = 0
    for start, end in sorted(ranges):
        if limit is not None:
            end = min(end, limit)
        start = max(start, reach)
        if end > start:
            total += end - start
            reach = end
    return total


def audit_single(
    loc: Location, *, grace: float, now: float | None = None, read_others: bool = True
) -> Tables:
    now = time.time() if now is None else now
    working = fence.working_of(loc)  # read before the listing: a later file is newer
    problems: list[scan.Problem] = []
    units, files = scan.top_level(loc, problems)
    for unit in units:
        rows, trouble = scan.list_dir(loc, unit)
        files.extend(rows)
        problems.extend(trouble)
    metas = scan.metadata_paths(files, loc.job_dir)
    others = scan.other_metadata(loc, problems) if read_others else []
    ckpt_rows: list[scan.CheckpointRow] = []
    refs: list[scan.RefRow] = []
    corrupt: list[scan.ErrorRow] = []
    outside: dict[str, scan.FileRow] = {}
    for path in [*metas, *others]:
        row, rrows, err, stats = scan.read_metadata(loc, path)
        if row is not None:
            ckpt_rows.append(row)
            refs.extend(rrows)
        if err is not None:
            corrupt.append(err)
        outside.update((f[0], f) for f in stats)
    return analyse(loc, files, ckpt_rows, refs, corrupt, list(outside.values()),
                   grace=grace, now=now, engine="single-process", problems=problems,
                   working=working)


def analyse(
    loc: Location,
    files: list[scan.FileRow],
    ckpt_rows: list[scan.CheckpointRow],
    refs: list[scan.RefRow],
    corrupt: list[scan.ErrorRow],
    outside: list[scan.FileRow],
    *,
    grace: float,
    now: float,
    engine: str,
    problems: list[scan.Problem] | None = None,
    working: frozenset[str] | None = None,
    foreign: Foreign | None = None,
) -> Tables:
    """``working``: the files the live databases use, as the writer published them
    (``None``: unknown, so every unreferenced working file is ``working``).
    ``foreign``: what the reader of a Flink or Spark checkpoint decided beyond the
    references (``pipeline.foreign``)."""
    job = loc.job_dir
    held: Mapping[str, str] = foreign.held if foreign is not None else {}
    owner_of = foreign.owner if foreign is not None else scan.owner_dir
    in_base = {r[0] for r in ckpt_rows if r[5] == job}
    own_keys = {r[0] for r in ckpt_rows}
    # References that count: every one of the audited job's checkpoints, and those of the
    # other metadata that point into the audited base.
    def counted(r: scan.RefRow) -> bool:
        return r[0] in in_base or (r[8] is not None and is_under(r[8], job))

    ref_rows = [r for r in refs if r[0] in own_keys and counted(r)]
    # What a restore can read: a link is listed (never followed, never deleted) but holds
    # no bytes of a checkpoint, so a reference to one dangles.
    size_of = {p: s for p, s, _m, link in files if not link}
    all_size = {**size_of, **{p: s for p, s, _m, _l in outside}}
    missing: dict[str, str] = {}

    ranges: dict[str, list[tuple[int, int]]] = defaultdict(list)
    ref_count: dict[str, int] = defaultdict(int)
    ref_ckpts: dict[str, set[str]] = defaultdict(set)
    dangling: list[Row] = []
    for r in ref_rows:
        key, _job, _cid, _sp, _subtask, _kind, _name, handle, path, off, length, _lid, _ = r
        if handle == "placeholder":
            dangling.append(_dangling(r, None, NO_PATH))
            continue
        if handle not in scan.STREAM_HANDLES or path is None:
            continue
        assert off is not None and length is not None
        ranges[path].append((off, off + length))
        ref_count[path] += 1
        ref_ckpts[path].add(key)
        size = all_size.get(path)
        if foreign is not None and foreign.dangling is not None:
            continue  # the format's reader judged each reference (exact sizes, lineage)
        if size is None:
            if path not in missing:
                missing[path] = scan.why_missing(loc, path)
            dangling.append(_dangling(r, None, missing[path]))
        elif off + length > size:
            dangling.append(_dangling(r, size, BEYOND))

    if foreign is not None and foreign.dangling is not None:
        dangling.extend(foreign.dangling)
    meta_paths = {r[4] for r in ckpt_rows} | (foreign.metadata if foreign else set())
    corrupt_paths = {e[0] for e in corrupt}
    file_rows: list[Row] = []
    state_file = f"{job}/{WRITER_STATE}"
    for path, size, mtime, link in files:
        live = covered(ranges[path], size) if path in ranges else 0
        if path in meta_paths or path == state_file:
            status = METADATA
        elif path in corrupt_paths:
            status = CORRUPT
        elif path in ranges:
            status = REFERENCED
        elif path in held:
            status = held[path]
        elif foreign is None and scan.in_live_database(path, job, working):
            status = WORKING
        elif mtime > now - grace:
            status = PENDING
        else:
            status = ORPHAN
        data = status not in (METADATA, CORRUPT)
        file_rows.append(
            {
                "path": path,
                "owner": owner_of(path),
                "size": size,
                "mtime": mtime,
                "symlink": link,
                "status": status,
                "refs": ref_count.get(path, 0),
                "checkpoints": len(ref_ckpts.get(path, ())),
                "live_bytes": live,
                "dead_bytes": size - live if data else 0,
            }
        )

    owners: dict[str, Row] = {}
    for f in file_rows:
        if f["status"] in (METADATA, CORRUPT):
            continue
        o = owners.setdefault(
            f["owner"],
            {"owner": f["owner"], "files": 0, "bytes": 0, "live_bytes": 0, "dead_bytes": 0,
             "orphans": 0, "orphan_bytes": 0, "amplification": None},
        )
        o["files"] += 1
        o["bytes"] += f["size"]
        o["live_bytes"] += f["live_bytes"]
        o["dead_bytes"] += f["dead_bytes"]
        if f["status"] == ORPHAN:
            o["orphans"] += 1
            o["orphan_bytes"] += f["size"]
    for o in owners.values():
        o["amplification"] = ratio(o["bytes"], o["live_bytes"])

    checkpoints = _checkpoints(ckpt_rows, ref_rows, all_size, dangling, job)
    orphans = [
        {"path": f["path"], "owner": f["owner"], "size": f["size"], "mtime": f["mtime"]}
        for f in file_rows
        if f["status"] == ORPHAN
    ]
    tables: dict[str, list[Row]] = {
        "files": file_rows,
        "references": [dict(zip(TABLES["references"], r, strict=True)) for r in ref_rows],
        "dangling": dangling,
        "orphans": orphans,
        "owners": list(owners.values()),
        "checkpoints": checkpoints,
        "corrupt": [dict(zip(TABLES["corrupt"], e, strict=True)) for e in corrupt],
        "unreadable": [dict(zip(TABLES["unreadable"], p, strict=True))
                       for p in sorted(set(problems or ()))],
    }
    summary = summarise(loc, engine, grace, now, tables, ckpt_rows, foreign)
    return Tables(summary, tables)


def _dangling(r: scan.RefRow, size: int | None, reason: str) -> Row:
    return {
        "checkpoint": r[0],
        "subtask": r[4],
        "name": r[6],
        "handle": r[7],
        "path": r[8],
        "offset": r[9],
        "length": r[10],
        "logical_id": r[11],
        "file_size": size,
        "reason": reason,
    }


def _checkpoints(
    ckpt_rows: list[scan.CheckpointRow],
    ref_rows: list[scan.RefRow],
    size: dict[str, int],
    dangling: list[Row],
    job: str,
) -> list[Row]:
    by_ckpt: dict[str, list[scan.RefRow]] = defaultdict(list)
    for r in ref_rows:
        if r[7] in scan.STREAM_HANDLES and r[8] is not None:
            by_ckpt[r[0]].append(r)
    # A shared segment is reused when an earlier checkpoint of the same job (not a
    # savepoint) references the same bytes.
    first_use: dict[tuple[str, str, int, int], int] = {}
    for r in ref_rows:
        if r[12] == "shared" and not r[3] and r[8] is not None and r[9] is not None:
            assert r[10] is not None
            k = (r[1], r[8], r[9], r[10])
            first_use[k] = min(first_use.get(k, r[2]), r[2])
    lost: dict[str, int] = defaultdict(int)
    for d in dangling:
        lost[d["checkpoint"]] += 1
    out: list[Row] = []
    for key, jb, cid, sp, _meta, base, _n, _shared in sorted(ckpt_rows):
        rows = by_ckpt.get(key, [])
        per_file: dict[str, list[tuple[int, int]]] = defaultdict(list)
        shared = reused = 0
        seen: set[tuple[str, int, int]] = set()
        for r in rows:
            path, off, length = r[8], r[9], r[10]
            assert path is not None and off is not None and length is not None
            per_file[path].append((off, off + length))
            if r[12] == "shared" and not sp and (path, off, length) not in seen:
                seen.add((path, off, length))
                shared += length
                if first_use[(jb, path, off, length)] < cid:
                    reused += length
        state = sum(covered(rs) for rs in per_file.values())
        physical = sum(size.get(p, 0) for p in per_file)
        out.append(
            {
                "checkpoint": key,
                "job": jb,
                "checkpoint_id": cid,
                "savepoint": sp,
                "in_base": base == job,
                "references": len(rows),
                "files": len(per_file),
                "state_bytes": state,
                "physical_bytes": physical,
                "amplification": ratio(physical, state),
                "shared_bytes": shared,
                "reused_shared_bytes": reused,
                "dangling": lost.get(key, 0),
            }
        )
    return out


def summarise(
    loc: Location,
    engine: str,
    grace: float,
    now: float,
    t: dict[str, list[Row]],
    ckpt_rows: list[scan.CheckpointRow],
    foreign: Foreign | None = None,
) -> Summary:
    files = t["files"]

    def total(status: str, col: str = "size") -> tuple[int, int]:
        sel = [f for f in files if f["status"] == status]
        return len(sel), sum(f[col] for f in sel)

    data = [f for f in files if f["status"] not in (METADATA, CORRUPT)]
    referenced = [f for f in files if f["status"] == REFERENCED]
    live = sum(f["live_bytes"] for f in referenced)
    ref_bytes = sum(f["size"] for f in referenced)
    orphans, orphan_bytes = total(ORPHAN)
    pending, pending_bytes = total(PENDING)
    working, working_bytes = total(WORKING)
    in_flight, in_flight_bytes = total(IN_FLIGHT)
    stale, stale_bytes = total(STALE)
    own = [c for c in t["checkpoints"] if c["in_base"]]
    shared = sum(c["shared_bytes"] for c in own)
    reused = sum(c["reused_shared_bytes"] for c in own)
    job = loc.job_dir
    sources = tuple(sorted(r[0] for r in ckpt_rows if r[5] != job and job in r[7]))
    return Summary(
        base=loc.uri(),
        engine=engine,
        grace_seconds=grace,
        now=now,
        files=len(files),
        bytes=sum(f["size"] for f in files),
        data_files=len(data),
        data_bytes=sum(f["size"] for f in data),
        referenced_files=len(referenced),
        live_bytes=live,
        dead_bytes=ref_bytes - live,
        orphans=orphans,
        orphan_bytes=orphan_bytes,
        pending=pending,
        pending_bytes=pending_bytes,
        working=working,
        working_bytes=working_bytes,
        metadata_files=total(METADATA)[0],
        corrupt_metadata=len(t["corrupt"]),
        checkpoints=len(own),
        other_metadata=len(t["checkpoints"]) - len(own),
        references=len(t["references"]),
        dangling=len(t["dangling"]),
        dangling_missing=sum(1 for d in t["dangling"] if d["reason"] == MISSING),
        dangling_beyond=sum(1 for d in t["dangling"] if d["reason"] in (BEYOND, OTHER_SIZE)),
        space_amplification=ratio(ref_bytes, live),
        total_amplification=ratio(sum(f["size"] for f in data), live),
        shared_bytes=shared,
        reused_shared_bytes=reused,
        reused_share=ratio(reused, shared),
        restore_source_of=sources,
        unreadable=len(t["unreadable"]),
        format=foreign.format if foreign is not None else "ckpt",
        in_flight=in_flight,
        in_flight_bytes=in_flight_bytes,
        stale=stale,
        stale_bytes=stale_bytes,
        notes=foreign.notes if foreign is not None else (),
    )
