"""The streaming word count of issue 17: a PySpark Structured Streaming job whose keyed
state is a RocksDB per subtask, checkpointed incrementally through the checkpoint store.

Modules: ``source`` (Spark's ``rate-micro-batch`` and the same rows as a formula),
``words`` (rows to words and key groups), ``windows`` (tumbling windows, the watermark),
``rocks`` (the RocksDB of window counts), ``snapshot`` (that RocksDB to a checkpoint and
back), ``checkpointing`` (the worker's and the driver's parties as protocols),
``worker_tm`` (a subtask's fastimpl TaskManager on the worker), ``coordination`` (the
fastimpl CheckpointCoordinator in the driver, and its Spark engine), ``subtask`` (one
partition of a micro-batch, on a worker; injected failures), ``driver`` (a checkpoint
per micro-batch, without Spark), ``job`` (the Spark job: ``foreachBatch``), ``sink``
(closed windows to Parquet, a directory per batch), ``check`` (the same counts by a
plain batch computation), ``audit`` (the storage audit of every job base after a run),
``summary`` (what ``ckpt stream`` prints), ``demo`` (``make demo``). ``--state-backend
working`` (SPEC §11): ``slate`` (the counts in a SlateDB on the checkpoint storage),
``working_task`` (a subtask's batch with it: snapshot in place, restore by clone),
``working_names`` (database directories, checkpoint pointers), ``slate_collect`` (the
coordinator's collection of the databases).
"""
