"""Hypothesis settings profiles for the model tests.

Select one with the HYPOTHESIS_PROFILE environment variable (unset or empty: "default"):

- ``default`` / ``dev``: 100 examples, 40 steps per state-machine run; the tests that
  start Spark (marker ``spark``) or moto's S3 server (``s3_endpoint``) skipped, saying
  so: a developer's quick loop.
- ``ci``: derandomized, no example database, 200 examples, prints reproduction blobs;
  every Spark and S3 test.
- ``long``: 5000 examples, 100 steps per state-machine run, and the tests marked
  ``tests.profile.long_only``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

from tests import scratch
from tests.faultyfs import Place
from tests.lockstep import (  # noqa: F401 (fixtures: a lockstep storage, moto's S3 server)
    backend,
    s3_endpoint,
)
from tests.profile import PROFILE, QUICK_LOOP, left_to_ci
from tests.spark_cluster import loopback_cluster  # noqa: F401 (a fixture: two-host Spark)

# Every Spark driver the tests start (the ``spark`` fixture's, and those of the audits and
# streaming jobs the tests run as subprocesses: spark-submit adds SPARK_SUBMIT_OPTS to the
# driver's JVM) runs the JVM's first compiler alone (C1): a test's Spark jobs are short,
# and C1 is up to speed sooner than the tiered pair. The Spark audits of test_audit.py and
# test_audit_hostile.py took 134 s instead of 146; the stream-failure, permission and
# working-state Spark files 89 s instead of 102. A user's own SPARK_SUBMIT_OPTS is kept.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1")

_SUPPRESSED: list[HealthCheck] = [HealthCheck.too_slow]

settings.register_profile(
    "default",
    max_examples=100,
    deadline=None,
    stateful_step_count=40,
    suppress_health_check=_SUPPRESSED,
)
settings.register_profile(
    "dev",
    max_examples=100,
    deadline=None,
    stateful_step_count=40,
    suppress_health_check=_SUPPRESSED,
)
settings.register_profile(
    "ci",
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=200,
    stateful_step_count=40,
    print_blob=True,
    suppress_health_check=_SUPPRESSED,
)
settings.register_profile(
    "long",
    max_examples=5000,
    deadline=None,
    stateful_step_count=100,
    suppress_health_check=_SUPPRESSED,
)

settings.load_profile(PROFILE)

TOOLING = frozenset(
    {
        "test_docs",
        "test_mutants",
        "test_mutation_selection",
        "test_mutmut_pending",
        "test_readme",
        "test_tla_syntax",
        "test_tlc",
        "test_trace_tla",
        "test_traceability",
        "test_verify",
        "test_wheel",
    }
)
"""Modules that test the project's tools (the mutant zoo, the mutation run's bookkeeping,
traceability, TLA+ and TLC, the wheel, the docs), not the product: marked ``tooling``, so
``make test`` leaves them to ``make test-tools`` (both run in CI)."""


SPARK_FIXTURES = frozenset({"spark", "loopback_cluster"})
"""A test that asks for one of these starts Spark: it is marked ``spark`` without saying so."""

_SPARK_IN_CI = pytest.mark.skip(reason=left_to_ci("starts Spark"))


@pytest.hookimpl(tryfirst=True)  # before pytest's tmpdir plugin reads --basetemp
def pytest_configure(config: pytest.Config) -> None:
    scratch.take(config)
    config.addinivalue_line("markers", "tooling: a test of the project's tools (make test-tools)")
    config.addinivalue_line(
        "markers",
        "spark: starts Spark (a JVM: the session, a cluster, spark-submit or a ckpt stream"
        " subprocess); left to the ci and long profiles",
    )


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    terminalreporter.write_line(scratch.where(config))


def pytest_unconfigure(config: pytest.Config) -> None:
    scratch.give_back(config)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.stem in TOOLING:
            item.add_marker(pytest.mark.tooling)
        if SPARK_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.spark)
        if QUICK_LOOP and item.get_closest_marker("spark"):
            item.add_marker(_SPARK_IN_CI)


@pytest.fixture(scope="session")
def spark() -> Any:
    """One SparkSession (one JVM) per pytest worker, for every Spark test it runs."""
    from pipeline.session import spark_session

    return spark_session("local[2]")


@pytest.fixture
def places() -> Iterator[list[Place]]:
    """The places a test made, cleaned up (memory roots removed) after it."""
    made: list[Place] = []
    yield made
    for p in made:
        p.cleanup()
