"""pipeline: PySpark jobs (issue 6)."""
