"""A SparkSession for the audit, with a clear message when Java is missing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from typing import Any

JAVA_HINT = (
    "PySpark needs Java 17 and none was found (no `java` on PATH and JAVA_HOME unset). "
    "Install it, e.g. `apt-get install openjdk-17-jre-headless` (Debian/Ubuntu) or "
    "`brew install openjdk@17` (macOS), then run again."
)


class SparkUnavailable(RuntimeError):
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


def spark_session(master: str = "local[*]", *, app: str = "ckpt-audit",
                  conf: dict[str, str] | None = None) -> Any:
    """Get or create the session. Executors run this interpreter (the venv's), the UI is
    off, and the driver binds to 127.0.0.1 so that a machine without DNS still starts."""
    if java_version() is None:
        raise SparkUnavailable(JAVA_HINT)
    try:
        from pyspark.sql import SparkSession
    except ImportError as err:
        raise SparkUnavailable(
            "pyspark is not installed: `make` installs it (pip install -e '.[spark]')"
        ) from err
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    builder = (
        SparkSession.builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.python.worker.reuse", "true")
        .config("spark.driver.memory", os.environ.get("CKPT_SPARK_DRIVER_MEMORY", "2g"))
    )
    for k, v in (conf or {}).items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
