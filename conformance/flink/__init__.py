"""The conformance suite against Apache Flink 2.3's own file-merging manager
(``org.apache.flink.runtime.checkpoint.filemerging.FileMergingSnapshotManager``), driven one
call at a time through the py4j gateway of the ``apache-flink`` package (extra ``flink``).

``profile`` (pure Python) says which cases the adapter can judge and what it judges;
``session`` (needs pyflink, imported lazily) is the adapter; ``report``
(``python -m conformance.flink.report``, ``make conformance-flink``) runs the corpus and
live mode and writes ``docs/flink-divergences.md``.
"""
