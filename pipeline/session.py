"""A SparkSession for the audit, with a clear message when Java is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

from spec.errors import CkptError

JAVA_HINT = (
    "PySpark needs Java 17 and none was found (no `java` on PATH and JAVA_HOME unset). "
    "Install it, e.g. `apt-get install openjdk-17-jre-headless` (Debian/Ubuntu) or "
    "`brew install openjdk@17` (macOS), then run again."
)


class SparkUnavailable(CkptError, RuntimeError):
    """Spark cannot start here (no Java, or pyspark not installed)."""


def java_version() -> str | None:
    """The first line of ``java -version``, or None when there is no Java."""
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    if not java or not os.path.exists(java):
        return None
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = (out.stderr or out.stdout).strip().splitlines()
    return lines[0] if lines else None


def submitted() -> bool:
    """Whether this process was started by ``spark-submit`` (or the ``pyspark`` shell),
    whose options (``--master``, ``--driver-memory``, ``--conf``) then rule."""
    return "PYSPARK_GATEWAY_PORT" in os.environ


def spark_session(master: str | None = None, *, app: str = "ckpt-audit",
                  conf: dict[str, str] | None = None) -> Any:
    """Get or create the session: on ``master``, or else on spark-submit's master when
    submitted, or else on ``local[*]``. On a local master named here, executors run this
    interpreter (the venv's), the UI is off, the driver binds to 127.0.0.1 (a machine
    without DNS still starts) and shuffles use a few partitions. Under spark-submit its
    JVM is up before this runs: its options rule (``--conf spark.driver.host=127.0.0.1``
    where there is no DNS), and only the shuffle partitions are set, on a local master.
    On a cluster, Spark's own defaults and the submitter's options stand."""
    if java_version() is None and not submitted():
        raise SparkUnavailable(JAVA_HINT)
    try:
        from pyspark.sql import SparkSession
    except ImportError as err:
        raise SparkUnavailable(
            "pyspark is not installed: `make` installs it (pip install -e '.[spark]')"
        ) from err
    if master is None and not submitted():
        master = "local[*]"
    local = master is not None and master.startswith("local")
    if local:
        # Executors on this machine: this interpreter (the venv's). On a cluster the
        # submitter says which (PYSPARK_PYTHON): this path need not exist on its nodes.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.appName(app)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.python.worker.reuse", "true")
    )
    if master is not None:
        builder = builder.master(master)
    if local:
        builder = (
            builder.config("spark.ui.enabled", "false")
            .config("spark.driver.bindAddress", "127.0.0.1")
            .config("spark.driver.host", "127.0.0.1")
            .config("spark.sql.shuffle.partitions", "4")
        )
    if not submitted():
        # The driver's JVM starts here (spark-submit has started it otherwise).
        builder = builder.config(
            "spark.driver.memory", os.environ.get("CKPT_SPARK_DRIVER_MEMORY", "2g")
        )
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    # spark-submit's master is known only now: on a local one, a few shuffle partitions
    # (Spark's 200 cost tens of seconds on a small base), unless the submitter chose.
    sc = spark.sparkContext
    if (master is None and (sc.master or "").startswith("local")
            and not sc.getConf().contains("spark.sql.shuffle.partitions")):
        spark.conf.set("spark.sql.shuffle.partitions", "4")
    return spark
