"""``ckpt audit`` as a ``spark-submit`` application, for a cluster or any master:

    PYSPARK_PYTHON=.venv/bin/python .venv/bin/spark-submit --master spark://host:7077 \\
        pipeline/submit.py s3://bucket/ckpts/job-1 --out s3://bucket/audit/ --json summary.json

The arguments after the script are those of ``ckpt audit``; spark-submit's options
(``--master``, ``--driver-memory``, ``--conf``) configure Spark. Every executor needs this
project installed in the interpreter ``PYSPARK_PYTHON`` names (the executors import
``pipeline.scan`` to list directories and read ``_metadata``).
"""

from __future__ import annotations

import typer

from pipeline.cli import audit


def main() -> None:
    typer.run(audit)


if __name__ == "__main__":
    main()
