"""The streaming word count of issue 17: a PySpark Structured Streaming job whose keyed
state is a RocksDB per subtask, checkpointed incrementally through the checkpoint store.

Modules: ``words`` (the source's rows to words and key groups), ``windows`` (tumbling
windows and the watermark), ``rocks`` (the RocksDB holding window counts), ``snapshot``
(a checkpoint of that RocksDB to the store and its restore), ``checkpointing`` (the one
module that meets the store: the worker and driver parties), ``subtask`` (what one
partition of a micro-batch does on a worker), ``sink`` (closed windows to Parquet, one
directory per batch), ``job`` (the driver: foreachBatch, triggers and completes
checkpoints), ``check`` (the same counts by a plain batch computation).
"""
