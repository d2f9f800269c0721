"""The storage audit as a Spark job (issue 6).

The driver lists the top levels of the job base (``chk-*``, ``shared/*``,
``taskowned/*``); executors list the directories under them and read every ``_metadata``
(``pipeline.scan``), one row per file and one per reference. Everything after that is
DataFrame work: dangling references by a join of references with files, live bytes per
file as the union of the referenced ranges (a fold over each file's ranges in offset
order, after one shuffle of the references by checkpoint and file that the checkpoints
table shares), orphans by status, and the sums per owner directory and per checkpoint. The
definitions are those of ``pipeline.single``; a test holds the two to the same answers.

Each Spark action costs a job per shuffle (adaptive execution plans a stage at a time),
and on a small base that fixed cost is most of the audit's time. So the driver asks three
things: one pass over the listing, one over the rows read, and one union of every figure
of the summary and the checkpoints table (``_digest``). The tables stay lazy until
written or collected, and a frame of at most ``SMALL_ROWS`` rows is one partition.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
from attrs import frozen
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from fastimpl.parties import WRITER_STATE
from pipeline import arrow_rows, fence, scan
from pipeline.foreign import Foreign, ForeignRead
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
    Summary,
    Tables,
    ratio,
)

STREAMS = scan.STREAM_HANDLES

Progress = Callable[[str], None]


@frozen
class SparkAudit:
    summary: Summary
    frames: dict[str, DataFrame]

    def collect(self) -> Tables:
        """Every table as rows (for tests and small bases)."""
        return Tables(
            self.summary,
            {n: [r.asDict() for r in df.collect()] for n, df in self.frames.items()},
        )

    def write_parquet(self, out: str) -> list[str]:
        written = []
        for name, df in self.frames.items():
            path = f"{out.rstrip('/')}/{name}.parquet"
            df.write.mode("overwrite").parquet(path)
            written.append(path)
        return written


def _with_owner(rows: list[scan.FileRow]) -> list[tuple[str, int, float, bool, str]]:
    return [(*r, scan.owner_dir(r[0])) for r in rows]


def _paths_frame(spark: SparkSession, items: list[str], width: int) -> DataFrame:
    """One string column spread over ``width`` partitions (at most one per item), so
    the executors share the directories or files to read."""
    sc = spark.sparkContext
    rdd = sc.parallelize([(x,) for x in items], max(1, min(len(items), width)))
    return spark.createDataFrame(rdd, "item string")


def audit_spark(
    spark: SparkSession,
    loc: Location,
    *,
    grace: float,
    now: float | None = None,
    read_others: bool = True,
    progress: Progress | None = None,
) -> SparkAudit:
    now = time.time() if now is None else now
    working = fence.working_of(loc)  # read before the listing: a later file is newer
    say = progress or (lambda _msg: None)
    sc = spark.sparkContext
    job = loc.job_dir

    say("listing the top levels of the job base")
    problems: list[scan.Problem] = []
    units, top_files = scan.top_level(loc, problems)
    width = max(1, min(len(units), sc.defaultParallelism * 4))
    say(f"listing {len(units)} directories on the executors")
    sc.setJobDescription(f"list {len(units)} directories")
    listed = _paths_frame(spark, units, width).mapInArrow(
        arrow_rows.list_dirs(loc), arrow_rows.LISTED_DDL
    ).cache()
    n_listed, picked = _listing_digest(listed, f"^{_re(job)}/chk-[0-9]+/_metadata$")
    problems.extend((path, problem) for path, problem in picked if problem is not None)
    # A file at the top level is never a chk-N/_metadata: the listing holds them all.
    metas = [path for path, problem in picked if problem is None]
    listed_files: DataFrame = listed.where(F.col("problem").isNull())
    files = listed_files.drop("problem")
    if top_files:
        files = files.unionByName(
            spark.createDataFrame(_with_owner(top_files), arrow_rows.FILES_DDL)
        )
    n_files = n_listed + len(top_files)
    files = _gathered(files, n_files).cache()

    others = scan.other_metadata(loc, problems) if read_others else []
    say(f"{n_files} files; reading {len(metas)} _metadata files (+{len(others)} beside)")
    sc.setJobDescription(f"read {len(metas) + len(others)} _metadata files")
    read = _paths_frame(spark, [*metas, *others], width).mapInArrow(
        arrow_rows.read_metadata(loc), arrow_rows.READ_DDL
    ).cache()
    heads, ref_counts = _read_digest(read, job)
    ckpt_rows: list[scan.CheckpointRow] = [
        (h.checkpoint, h.job, h.checkpoint_id, h.savepoint, h.metadata, h.base, h.entries,
         list(h.shared_bases))
        for h in heads if h.row == "head"
    ]
    corrupt: list[scan.ErrorRow] = [
        (h.metadata, h.field, h.problem) for h in heads if h.row == "error"
    ]
    own_keys = {r[0] for r in ckpt_rows if r[5] == job}
    # The rows ``frames_of`` keeps as references (see there), counted from the same pass.
    n_refs = sum(n for checkpoint, in_job, n in ref_counts
                 if (checkpoint is not None and checkpoint in own_keys) or in_job is True)
    # Its rows: the heads, the references, and the files outside the base they name (no
    # more than the references).
    read = _gathered(read, len(heads) + sum(n for _c, _j, n in ref_counts))
    return frames_of(spark, loc, files, read, ckpt_rows, corrupt, problems, grace=grace,
                     now=now, working=working, say=say, n_refs=n_refs)


SMALL_ROWS = 10_000
"""Rows up to which a frame the audit works on is one partition. The listing and the
reading spread over the executors, each task a Python worker's; the joins and sums after
them cost a task per partition and stage, which on a small base is most of their time."""


def _gathered(frame: DataFrame, rows: int) -> DataFrame:
    """``frame`` in one partition if it holds at most ``SMALL_ROWS`` rows. One partition
    keeps the rows' order, as a collect gives it (``coalesce`` into more would not)."""
    return frame.coalesce(1) if rows <= SMALL_ROWS else frame


def _listing_digest(
    listed: DataFrame, meta_pattern: str
) -> tuple[int, list[tuple[str, str | None]]]:
    """One Spark action over the listing: how many files it holds, and in listing order
    what could not be listed (``(path, problem)``) and the files matching ``meta_pattern``
    (``(path, None)``)."""
    is_problem = F.col("problem").isNotNull()
    picked = F.when(
        is_problem | F.col("path").rlike(meta_pattern), F.struct("at", "path", "problem")
    )
    # The id grows with the partition and the row within it: the order a collect gives.
    row = listed.withColumn("at", F.monotonically_increasing_id()).agg(
        F.count(F.when(~is_problem, F.lit(1))).alias("files"),
        F.collect_list(picked).alias("picked"),
    ).collect()[0]
    return int(row["files"]), [(r["path"], r["problem"])
                               for r in sorted(row["picked"], key=lambda r: int(r["at"]))]


def _in_job(job: str) -> Column:
    return F.col("path").startswith(job + "/") | (F.col("path") == job)


def _read_digest(
    read: DataFrame, job: str
) -> tuple[list[Any], list[tuple[str | None, bool | None, int]]]:
    """One Spark action over the rows read: the checkpoints and errors in reading order,
    and the references counted by checkpoint and by whether their path is in the job base
    (null when it has none)."""
    counts = (
        read.where(F.col("row") == "ref")
        .groupBy("checkpoint", _in_job(job).alias("in_job"))
        .agg(F.count(F.lit(1)).alias("n"))
        .withColumn("row", F.lit("refs"))
    )
    rows = (
        read.where(F.col("row").isin("head", "error"))
        .unionByName(counts, allowMissingColumns=True)
        .collect()
    )
    return ([r for r in rows if r["row"] != "refs"],
            [(r["checkpoint"], r["in_job"], int(r["n"])) for r in rows if r["row"] == "refs"])


def audit_foreign_spark(
    spark: SparkSession,
    loc: Location,
    got: ForeignRead,
    *,
    grace: float,
    now: float,
    progress: Progress | None = None,
) -> SparkAudit:
    """The audit of a Flink or Spark checkpoint directory on Spark: the rows its reader
    gave (``pipeline.foreign``) become the two frames the listing and the ``_metadata``
    reading give for ours, and every table after them is computed by the same code."""
    say = progress or (lambda _msg: None)
    sc = spark.sparkContext
    width = max(1, sc.defaultParallelism * 4)
    say(f"{len(got.files)} files, {len(got.references)} references read by the "
        f"{got.foreign.format} reader")
    owner = got.foreign.owner
    files = spark.createDataFrame(
        sc.parallelize([(*f, owner(f[0])) for f in got.files],
                       1 if len(got.files) <= SMALL_ROWS else width),
        arrow_rows.FILES_DDL,
    ).cache()
    read_rows = [["ref", *r, None, None, None, None, None, None, None] for r in got.references]
    read_rows += [arrow_rows.row_of(row="outside", path=p, size=size)
                  for p, size, _m, _l in got.outside]
    read = spark.createDataFrame(
        sc.parallelize(read_rows, 1 if len(read_rows) <= SMALL_ROWS else width),
        arrow_rows.READ_DDL,
    ).cache()
    return frames_of(spark, loc, files, read, list(got.checkpoints), list(got.corrupt),
                     list(got.problems), grace=grace, now=now, working=None, say=say,
                     foreign=got.foreign)


def frames_of(
    spark: SparkSession,
    loc: Location,
    files: DataFrame,
    read: DataFrame,
    ckpt_rows: list[scan.CheckpointRow],
    corrupt: list[scan.ErrorRow],
    problems: list[scan.Problem],
    *,
    grace: float,
    now: float,
    working: frozenset[str] | None,
    say: Progress,
    foreign: Foreign | None = None,
    n_refs: int | None = None,
) -> SparkAudit:
    """Every table from the files listed (``arrow_rows.FILES_DDL``) and the rows read from
    the checkpoints (``arrow_rows.READ_DDL``): the definitions of ``pipeline.single``.
    ``n_refs`` is the number of references kept below when the caller counted them already.

    The figures the driver needs (the summary, the checkpoints table, the paths of missing
    files to name) come from one Spark action, ``_digest``; the other tables stay lazy
    until written or collected."""
    sc = spark.sparkContext
    job = loc.job_dir
    refs_all = read.where(F.col("row") == "ref").select(*TABLES["references"])

    own_keys = sorted(r[0] for r in ckpt_rows if r[5] == job)
    # Not cached: a filter over the cached ``read`` costs about what a second cache does
    # (measured at 1e5 references), and holds no second copy.
    refs = refs_all.where(F.col("checkpoint").isin(own_keys) | _in_job(job))
    if n_refs is None:
        n_refs = refs.count()
    say(f"{n_refs} references; joining")
    sc.setJobDescription("audit: join references with files")

    streams = refs.where(F.col("handle").isin(*STREAMS) & F.col("path").isNotNull())
    # One size per path even if two executors stat a file that changes in between.
    outside = (
        read.where(F.col("row") == "outside").groupBy("path").agg(F.max("size").alias("size"))
    )
    # A link is listed but holds no checkpoint bytes: a reference to it dangles.
    sizes = files.where(~F.col("symlink")).select("path", "size").unionByName(outside)

    end = F.col("offset") + F.col("length")
    joined = streams.join(sizes, "path", "left")
    dangling = joined.where(F.col("size").isNull() | (end > F.col("size"))).select(
        "checkpoint", "subtask", "name", "handle", "path", "offset", "length", "logical_id",
        F.col("size").alias("file_size"),
        F.when(F.col("size").isNull(), F.lit(MISSING)).otherwise(F.lit(BEYOND)).alias("reason"),
    )
    placeholders = refs.where(F.col("handle") == "placeholder").select(
        "checkpoint", "subtask", "name", "handle", "path", "offset", "length", "logical_id",
        F.lit(None).cast("long").alias("file_size"), F.lit(NO_PATH).alias("reason"),
    )
    dangling = dangling.unionByName(placeholders)
    # The reader of a format that judges each reference itself gives its dangling rows
    # with their reasons; ours are named from storage once the missing paths are known.
    to_name = foreign is None or foreign.dangling is None
    if foreign is not None and foreign.dangling is not None:
        dangling = spark.createDataFrame(
            [tuple(d[c] for c in TABLES["dangling"]) for d in foreign.dangling],
            DANGLING_DDL,
        )
    dangling = dangling.cache()

    # One row per (checkpoint, file) with its ranges: the checkpoints table and the files
    # table both start from it, so the references are shuffled once for the two.
    per_ckpt_file = (
        streams.groupBy("checkpoint", "path")
        .agg(F.count(F.lit(1)).alias("n"),
             F.collect_list(F.struct(F.col("offset").alias("s"), end.alias("e"))).alias("rs"))
        .cache()
    )
    per_file = per_ckpt_file.groupBy("path").agg(
        F.sum("n").alias("refs"),
        F.count(F.lit(1)).alias("checkpoints"),
        F.flatten(F.collect_list("rs")).alias("rs"),
    )
    meta_paths = [r[4] for r in ckpt_rows]
    corrupt_paths = [e[0] for e in corrupt]
    held = spark.createDataFrame(
        sorted((foreign.held if foreign is not None else {}).items()),
        "path string, held string",
    )
    special = [*meta_paths, *(foreign.metadata if foreign is not None else ()),
               f"{job}/{WRITER_STATE}"]
    in_working = (
        F.lit(False) if foreign is not None
        else F.col("path").startswith(f"{job}/{scan.WORKING}")
        & (F.lit(True) if working is None else F.col("path").isin(sorted(working)))
    )
    status = (
        F.when(F.col("path").isin(special), F.lit(METADATA))
        .when(F.col("path").isin(corrupt_paths), F.lit(CORRUPT))
        .when(F.col("refs").isNotNull(), F.lit(REFERENCED))
        .when(F.col("held").isNotNull(), F.col("held"))
        .when(in_working, F.lit(WORKING))
        .when(F.col("mtime") > F.lit(now - grace), F.lit(PENDING))
        .otherwise(F.lit(ORPHAN))
    )
    file_table = (
        files.join(per_file, "path", "left")
        .join(F.broadcast(held), "path", "left")
        .withColumn("live_bytes", _covered("rs", "size"))
        .withColumn("status", status)
        .withColumn("refs", F.coalesce("refs", F.lit(0)))
        .withColumn("checkpoints", F.coalesce("checkpoints", F.lit(0)))
        .withColumn("live_bytes", F.coalesce("live_bytes", F.lit(0)).cast("long"))
        .withColumn(
            "dead_bytes",
            F.when(F.col("status").isin(METADATA, CORRUPT), F.lit(0)).otherwise(
                F.col("size") - F.col("live_bytes")
            ),
        )
        .select(*TABLES["files"])
        .cache()
    )
    data = file_table.where(~F.col("status").isin(METADATA, CORRUPT))
    is_orphan = F.col("status") == ORPHAN
    owners = (
        data.groupBy("owner")
        .agg(
            F.count(F.lit(1)).alias("files"),
            F.sum("size").alias("bytes"),
            F.sum("live_bytes").alias("live_bytes"),
            F.sum("dead_bytes").alias("dead_bytes"),
            F.sum(is_orphan.cast("long")).alias("orphans"),
            F.sum(F.when(is_orphan, F.col("size")).otherwise(0)).alias("orphan_bytes"),
        )
        .withColumn(
            "amplification",
            F.when(F.col("live_bytes") > 0, F.col("bytes") / F.col("live_bytes")),
        )
        .select(*TABLES["owners"])
    )
    orphans = file_table.where(is_orphan).select(*TABLES["orphans"])

    say("summing up")
    sc.setJobDescription("audit: summary")
    digest = _digest(file_table, dangling, per_ckpt_file, streams, sizes)
    # Asked on the driver, once per path: dangling paths are few.
    named = {} if not to_name else {
        p: why for p in sorted({p for r, p, _n in digest.reasons if r == MISSING and p is not None})
        if (why := scan.why_missing(loc, p)) != MISSING
    }
    reasons: dict[str, int] = {}
    for reason, path, n in digest.reasons:
        why = named.get(path, reason) if path is not None else reason
        reasons[why] = reasons.get(why, 0) + n
    ckpts = _checkpoint_rows(ckpt_rows, digest, job)
    frames: dict[str, DataFrame] = {
        "files": file_table,
        "references": refs.select(*TABLES["references"]),
        "dangling": _name_missing(spark, dangling, named).select(*TABLES["dangling"]),
        "orphans": orphans,
        "owners": owners,
        "checkpoints": spark.createDataFrame(ckpts, CHECKPOINTS_DDL),
        "corrupt": spark.createDataFrame(
            corrupt, "metadata string, field string, problem string"
        ),
        "unreadable": spark.createDataFrame(
            sorted(set(problems)), "path string, problem string"
        ),
    }
    summary = _summary(loc, grace, now, digest.by_status, reasons, ckpts, ckpt_rows,
                       len(corrupt), n_refs)
    summary = attrs.evolve(
        summary, unreadable=len(set(problems)),
        format=foreign.format if foreign is not None else "ckpt",
        notes=foreign.notes if foreign is not None else (),
    )
    return SparkAudit(summary, frames)


DANGLING_DDL = (
    "checkpoint string, subtask string, name string, handle string, path string, "
    "offset long, length long, logical_id string, file_size long, reason string"
)
CHECKPOINTS_DDL = (
    "checkpoint string, job string, checkpoint_id long, savepoint boolean, in_base boolean, "
    "references long not null, files long not null, state_bytes long not null, "
    "physical_bytes long not null, amplification double, shared_bytes long not null, "
    "reused_shared_bytes long not null, dangling long not null"
)


def _name_missing(spark: SparkSession, dangling: DataFrame, named: dict[str, str]) -> DataFrame:
    """The dangling rows with the reason ``named`` gives their path, where it gives one
    (``scan.why_missing``: a link, a directory, a FIFO, a file that cannot be read)."""
    if not named:
        return dangling
    reasons = spark.createDataFrame(sorted(named.items()), "path string, why string")
    named_dangling: DataFrame = dangling.join(F.broadcast(reasons), "path", "left").withColumn(
        "reason", F.coalesce("why", "reason")
    )
    return named_dangling.drop("why")


def _re(text: str) -> str:
    return "".join("\\" + ch if not ch.isalnum() and ch not in "_-" else ch for ch in text)


def _covered(ranges: str, limit: str | None = None) -> Column:
    """Bytes covered by the union of an array of ``(s, e)`` ranges, each clipped to the
    column ``limit`` when given: a fold over the ranges in offset order, carrying the
    furthest end reached so far (``pipeline.single.covered``, as a Spark expression)."""
    e = f"least(x.e, {limit})" if limit else "x.e"
    return F.expr(
        f"aggregate(array_sort(coalesce({ranges}, array())), "
        "named_struct('reach', 0L, 'total', 0L), "
        f"(acc, x) -> named_struct('reach', greatest(acc.reach, {e}), "
        f"'total', acc.total + greatest(0L, {e} - greatest(x.s, acc.reach))), "
        "acc -> acc.total)"
    )


@frozen
class Digest:
    """What the driver needs of the audit's frames, from one Spark action: per status the
    files, bytes and live bytes; the dangling references per reason and, for a missing
    file, per path (to be named); and per checkpoint its dangling references, its figures
    (references, files, state and physical bytes) and its shared and reused bytes."""

    by_status: dict[str, tuple[int, int | None, int | None]]
    reasons: list[tuple[str, str | None, int]]
    lost: dict[str, int]
    per_ckpt: dict[str, tuple[int | None, int, int | None, int | None]]
    reuse: dict[str, tuple[int | None, int | None]]


def _digest(
    file_table: DataFrame,
    dangling: DataFrame,
    per_ckpt_file: DataFrame,
    streams: DataFrame,
    sizes: DataFrame,
) -> Digest:
    """Every aggregate of the summary and the checkpoints table as one union, collected
    once: each small (a row per status, reason, checkpoint or missing path), and each its
    own Spark action otherwise."""
    by_status = file_table.groupBy(F.col("status").alias("key")).agg(
        F.count(F.lit(1)).alias("a"),
        F.sum("size").alias("b"),
        F.sum("live_bytes").alias("c"),
    )
    # A missing file's path is kept so that the driver can name it (``scan.why_missing``);
    # the name applies to every dangling row of that path, whatever its reason here.
    reasons = dangling.groupBy(F.col("reason").alias("key"), "path").agg(
        F.count(F.lit(1)).alias("a")
    )
    lost = dangling.groupBy(F.col("checkpoint").alias("key")).agg(F.count(F.lit(1)).alias("a"))
    per_ckpt = (
        per_ckpt_file.join(sizes, "path", "left")
        .groupBy(F.col("checkpoint").alias("key"))
        .agg(
            F.sum("n").alias("a"),
            F.count(F.lit(1)).alias("b"),
            F.sum(_covered("rs")).cast("long").alias("c"),
            F.sum(F.coalesce("size", F.lit(0))).cast("long").alias("d"),
        )
    )
    # A shared segment is reused by every checkpoint of its job after the first (savepoints
    # never count): one row per segment with the checkpoints using it, then back to them.
    segments = (
        streams.where((F.col("scope") == "shared") & ~F.col("savepoint"))
        .groupBy("job", "path", "offset", "length")
        .agg(
            F.min("checkpoint_id").alias("first"),
            F.collect_set(F.struct("checkpoint", "checkpoint_id")).alias("users"),
        )
    )
    reuse = (
        segments.select("length", "first", F.explode("users").alias("u"))
        .groupBy(F.col("u.checkpoint").alias("key"))
        .agg(
            F.sum("length").alias("a"),
            F.sum(F.when(F.col("u.checkpoint_id") > F.col("first"), F.col("length"))
                  .otherwise(0)).alias("b"),
        )
    )
    parts = {"status": by_status, "reason": reasons, "lost": lost, "ckpt": per_ckpt,
             "reuse": reuse}
    union: DataFrame | None = None
    for name, part in parts.items():
        tagged = part.withColumn("part", F.lit(name))
        union = tagged if union is None else union.unionByName(tagged, allowMissingColumns=True)
    assert union is not None
    got: dict[str, list[Any]] = {name: [] for name in parts}
    for r in union.collect():
        got[r["part"]].append(r)
    return Digest(
        by_status={r["key"]: (int(r["a"]), r["b"], r["c"]) for r in got["status"]},
        reasons=[(r["key"], r["path"], int(r["a"])) for r in got["reason"]],
        lost={r["key"]: int(r["a"]) for r in got["lost"]},
        per_ckpt={r["key"]: (r["a"], int(r["b"]), r["c"], r["d"]) for r in got["ckpt"]},
        reuse={r["key"]: (r["a"], r["b"]) for r in got["reuse"]},
    )


def _checkpoint_rows(
    ckpt_rows: list[scan.CheckpointRow], digest: Digest, job: str
) -> list[tuple[Any, ...]]:
    """The checkpoints table (``CHECKPOINTS_DDL``), a row per checkpoint read, by key:
    built on the driver, which holds a row per checkpoint already."""
    out = []
    for key, ck_job, ck_id, savepoint, _meta, base, _entries, _shared in ckpt_rows:
        refs, n_files, state, physical = digest.per_ckpt.get(key, (None, 0, None, None))
        shared, reused = digest.reuse.get(key, (None, None))
        out.append((
            key, ck_job, ck_id, savepoint, base == job,
            refs or 0, n_files, state or 0, physical or 0,
            # Spark's long / long: both made doubles, then divided.
            float(physical or 0) / float(state) if state is not None and state > 0 else None,
            shared or 0, reused or 0, digest.lost.get(key, 0),
        ))
    # Spark's order of strings (by UTF-8 bytes, that is by code point), nulls first.
    out.sort(key=lambda r: (r[0] is not None, r[0] or ""))
    return out


def _summary(
    loc: Location,
    grace: float,
    now: float,
    by_status: dict[str, tuple[int, int | None, int | None]],
    reasons: dict[str, int],
    checkpoints: list[tuple[Any, ...]],
    ckpt_rows: list[scan.CheckpointRow],
    n_corrupt: int,
    n_refs: int,
) -> Summary:
    def get(status: str, col: int = 0) -> int:
        return int(by_status.get(status, (0, 0, 0))[col] or 0)

    own = [c for c in checkpoints if c[4]]
    n_own = len(own)
    n_ckpts = len(ckpt_rows)
    data_statuses = (REFERENCED, ORPHAN, PENDING, WORKING)
    data_files = sum(get(s) for s in data_statuses)
    data_bytes = sum(get(s, 1) for s in data_statuses)
    live = get(REFERENCED, 2)
    ref_bytes = get(REFERENCED, 1)
    shared = sum(c[10] for c in own)
    reused = sum(c[11] for c in own)
    job = loc.job_dir
    return Summary(
        base=loc.uri(),
        engine="spark",
        grace_seconds=grace,
        now=now,
        files=sum(n for n, _b, _l in by_status.values()),
        bytes=sum(int(b or 0) for _n, b, _l in by_status.values()),
        data_files=data_files,
        data_bytes=data_bytes,
        referenced_files=get(REFERENCED),
        live_bytes=live,
        dead_bytes=ref_bytes - live,
        orphans=get(ORPHAN),
        orphan_bytes=get(ORPHAN, 1),
        pending=get(PENDING),
        pending_bytes=get(PENDING, 1),
        working=get(WORKING),
        working_bytes=get(WORKING, 1),
        metadata_files=get(METADATA),
        corrupt_metadata=n_corrupt,
        checkpoints=n_own,
        other_metadata=n_ckpts - n_own,
        references=n_refs,
        dangling=sum(reasons.values()),
        dangling_missing=reasons.get(MISSING, 0),
        dangling_beyond=reasons.get(BEYOND, 0) + reasons.get(OTHER_SIZE, 0),
        space_amplification=ratio(ref_bytes, live),
        total_amplification=ratio(data_bytes, live),
        shared_bytes=shared,
        reused_shared_bytes=reused,
        reused_share=ratio(reused, shared),
        restore_source_of=tuple(sorted(r[0] for r in ckpt_rows if r[5] != job and job in r[7])),
        in_flight=get(IN_FLIGHT),
        in_flight_bytes=get(IN_FLIGHT, 1),
        stale=get(STALE),
        stale_bytes=get(STALE, 1),
    )
