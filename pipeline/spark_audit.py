"""The storage audit as a Spark job (issue 6).

The driver lists the top levels of the job base (``chk-*``, ``shared/*``,
``taskowned/*``); executors list the directories under them and read every ``_metadata``
(``pipeline.scan``), one row per file and one per reference. Everything after that is
DataFrame work: dangling references by a join of references with files, live bytes per
file as the union of the referenced ranges (a fold over each file's ranges in offset
order, after one shuffle of the references by checkpoint and file that the checkpoints
table shares), orphans by status, and the sums per owner directory and per checkpoint. The
definitions are those of ``pipeline.single``; a test holds the two to the same answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable

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
    Row,
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
    problems.extend(
        (r.path, r.problem) for r in listed.where(F.col("problem").isNotNull()).collect()
    )
    listed_files: DataFrame = listed.where(F.col("problem").isNull())
    files = listed_files.drop("problem")
    if top_files:
        files = files.unionByName(
            spark.createDataFrame(_with_owner(top_files), arrow_rows.FILES_DDL)
        )
    files = files.cache()
    n_files = files.count()

    meta_pattern = f"^{_re(job)}/chk-[0-9]+/_metadata$"
    metas = [r.path for r in files.where(F.col("path").rlike(meta_pattern)).collect()]
    others = scan.other_metadata(loc, problems) if read_others else []
    say(f"{n_files} files; reading {len(metas)} _metadata files (+{len(others)} beside)")
    sc.setJobDescription(f"read {len(metas) + len(others)} _metadata files")
    read = _paths_frame(spark, [*metas, *others], width).mapInArrow(
        arrow_rows.read_metadata(loc), arrow_rows.READ_DDL
    ).cache()
    heads = read.where(F.col("row").isin("head", "error")).collect()
    ckpt_rows: list[scan.CheckpointRow] = [
        (h.checkpoint, h.job, h.checkpoint_id, h.savepoint, h.metadata, h.base, h.entries,
         list(h.shared_bases))
        for h in heads if h.row == "head"
    ]
    corrupt: list[scan.ErrorRow] = [
        (h.metadata, h.field, h.problem) for h in heads if h.row == "error"
    ]
    return frames_of(spark, loc, files, read, ckpt_rows, corrupt, problems, grace=grace,
                     now=now, working=working, say=say)


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
        sc.parallelize([(*f, owner(f[0])) for f in got.files], width), arrow_rows.FILES_DDL
    ).cache()
    read_rows = [["ref", *r, None, None, None, None, None, None, None] for r in got.references]
    read_rows += [arrow_rows.row_of(row="outside", path=p, size=size)
                  for p, size, _m, _l in got.outside]
    read = spark.createDataFrame(
        sc.parallelize(read_rows, width), arrow_rows.READ_DDL
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
) -> SparkAudit:
    """Every table from the files listed (``arrow_rows.FILES_DDL``) and the rows read from
    the checkpoints (``arrow_rows.READ_DDL``): the definitions of ``pipeline.single``."""
    sc = spark.sparkContext
    job = loc.job_dir
    refs_all = read.where(F.col("row") == "ref").select(*TABLES["references"])

    own_keys = sorted(r[0] for r in ckpt_rows if r[5] == job)
    in_job = F.col("path").startswith(job + "/") | (F.col("path") == job)
    # Not cached: a filter over the cached ``read`` costs about what a second cache does
    # (measured at 1e5 references), and holds no second copy.
    refs = refs_all.where(F.col("checkpoint").isin(own_keys) | in_job)
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
    dangling = _name_missing(spark, loc, dangling.unionByName(placeholders))
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
    checkpoints = _checkpoints(
        spark, ckpt_rows, per_ckpt_file, streams, sizes, dangling, job
    ).cache()
    frames: dict[str, DataFrame] = {
        "files": file_table,
        "references": refs.select(*TABLES["references"]),
        "dangling": dangling.select(*TABLES["dangling"]),
        "orphans": orphans,
        "owners": owners,
        "checkpoints": checkpoints,
        "corrupt": spark.createDataFrame(
            corrupt, "metadata string, field string, problem string"
        ),
        "unreadable": spark.createDataFrame(
            sorted(set(problems)), "path string, problem string"
        ),
    }
    say("summing up")
    sc.setJobDescription("audit: summary")
    summary = _summary(loc, grace, now, file_table, dangling, checkpoints, ckpt_rows,
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


def _name_missing(spark: SparkSession, loc: Location, dangling: DataFrame) -> DataFrame:
    """The reason of each dangling reference to a missing file, as the single-process
    audit gives it (``scan.why_missing``: a link, a directory, a FIFO, a file that cannot
    be read). Asked on the driver, once per path: dangling paths are few."""
    paths = [r.path for r in dangling.where(F.col("reason") == MISSING)
             .select("path").distinct().collect()]
    named = [(p, why) for p in paths if (why := scan.why_missing(loc, p)) != MISSING]
    if not named:
        return dangling
    reasons = spark.createDataFrame(named, "path string, why string")
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


def _checkpoints(
    spark: SparkSession,
    ckpt_rows: list[scan.CheckpointRow],
    per_ckpt_file: DataFrame,
    streams: DataFrame,
    sizes: DataFrame,
    dangling: DataFrame,
    job: str,
) -> DataFrame:
    per_ckpt = (
        per_ckpt_file.join(sizes, "path", "left")
        .groupBy("checkpoint")
        .agg(
            F.sum("n").alias("references"),
            F.count(F.lit(1)).alias("files"),
            F.sum(_covered("rs")).cast("long").alias("state_bytes"),
            F.sum(F.coalesce("size", F.lit(0))).cast("long").alias("physical_bytes"),
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
        .groupBy(F.col("u.checkpoint").alias("checkpoint"))
        .agg(
            F.sum("length").alias("shared_bytes"),
            F.sum(F.when(F.col("u.checkpoint_id") > F.col("first"), F.col("length"))
                  .otherwise(0)).alias("reused_shared_bytes"),
        )
    )
    lost = dangling.groupBy("checkpoint").agg(F.count(F.lit(1)).alias("dangling"))
    base = spark.createDataFrame(
        [(r[0], r[1], r[2], r[3], r[5] == job) for r in ckpt_rows],
        "checkpoint string, job string, checkpoint_id long, savepoint boolean, in_base boolean",
    )
    zero = F.lit(0).cast("long")
    return (
        base.join(per_ckpt, "checkpoint", "left")
        .join(reuse, "checkpoint", "left")
        .join(lost, "checkpoint", "left")
        .select(
            "checkpoint", "job", "checkpoint_id", "savepoint", "in_base",
            F.coalesce("references", zero).alias("references"),
            F.coalesce("files", zero).alias("files"),
            F.coalesce("state_bytes", zero).alias("state_bytes"),
            F.coalesce("physical_bytes", zero).alias("physical_bytes"),
            F.when(F.col("state_bytes") > 0, F.col("physical_bytes") / F.col("state_bytes"))
            .alias("amplification"),
            F.coalesce("shared_bytes", zero).alias("shared_bytes"),
            F.coalesce("reused_shared_bytes", zero).alias("reused_shared_bytes"),
            F.coalesce("dangling", zero).alias("dangling"),
        )
        .orderBy("checkpoint")
    )


def _summary(
    loc: Location,
    grace: float,
    now: float,
    files: DataFrame,
    dangling: DataFrame,
    checkpoints: DataFrame,
    ckpt_rows: list[scan.CheckpointRow],
    n_corrupt: int,
    n_refs: int,
) -> Summary:
    by_status: dict[str, Row] = {
        r["status"]: r.asDict()
        for r in files.groupBy("status")
        .agg(
            F.count(F.lit(1)).alias("n"),
            F.sum("size").alias("bytes"),
            F.sum("live_bytes").alias("live"),
        )
        .collect()
    }

    def get(status: str, col: str = "n") -> int:
        return int(by_status.get(status, {}).get(col) or 0)

    reasons = {r["reason"]: r["n"] for r in dangling.groupBy("reason").agg(
        F.count(F.lit(1)).alias("n")).collect()}
    own = checkpoints.where("in_base").agg(
        F.count(F.lit(1)).alias("n"),
        F.sum("shared_bytes").alias("shared"),
        F.sum("reused_shared_bytes").alias("reused"),
    ).collect()[0]
    n_ckpts = len(ckpt_rows)
    data_statuses = (REFERENCED, ORPHAN, PENDING, WORKING)
    data_files = sum(get(s) for s in data_statuses)
    data_bytes = sum(get(s, "bytes") for s in data_statuses)
    live = get(REFERENCED, "live")
    ref_bytes = get(REFERENCED, "bytes")
    shared = int(own["shared"] or 0)
    reused = int(own["reused"] or 0)
    job = loc.job_dir
    return Summary(
        base=loc.uri(),
        engine="spark",
        grace_seconds=grace,
        now=now,
        files=sum(int(r["n"]) for r in by_status.values()),
        bytes=sum(int(r["bytes"] or 0) for r in by_status.values()),
        data_files=data_files,
        data_bytes=data_bytes,
        referenced_files=get(REFERENCED),
        live_bytes=live,
        dead_bytes=ref_bytes - live,
        orphans=get(ORPHAN),
        orphan_bytes=get(ORPHAN, "bytes"),
        pending=get(PENDING),
        pending_bytes=get(PENDING, "bytes"),
        working=get(WORKING),
        working_bytes=get(WORKING, "bytes"),
        metadata_files=get(METADATA),
        corrupt_metadata=n_corrupt,
        checkpoints=int(own["n"]),
        other_metadata=n_ckpts - int(own["n"]),
        references=n_refs,
        dangling=sum(int(v) for v in reasons.values()),
        dangling_missing=int(reasons.get(MISSING, 0)),
        dangling_beyond=int(reasons.get(BEYOND, 0)) + int(reasons.get(OTHER_SIZE, 0)),
        space_amplification=ratio(ref_bytes, live),
        total_amplification=ratio(data_bytes, live),
        shared_bytes=shared,
        reused_shared_bytes=reused,
        reused_share=ratio(reused, shared),
        restore_source_of=tuple(sorted(r[0] for r in ckpt_rows if r[5] != job and job in r[7])),
        in_flight=get(IN_FLIGHT),
        in_flight_bytes=get(IN_FLIGHT, "bytes"),
        stale=get(STALE),
        stale_bytes=get(STALE, "bytes"),
    )
