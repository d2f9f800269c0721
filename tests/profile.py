"""The Hypothesis profile this run selected, and the mark for what only the ``long``
profile runs.

``HYPOTHESIS_PROFILE`` (unset or empty: ``default``) picks the settings of
``tests/conftest.py`` and, for the tests that size themselves by hand (crash sweeps,
lockstep storages, Spark runs), how much they do: ``default`` is a developer's loop, ``ci``
is what ``.ci/run`` selects, ``long`` the soak.
"""

from __future__ import annotations

import os

import pytest

PROFILE: str = os.environ.get("HYPOTHESIS_PROFILE") or "default"

QUICK_LOOP: bool = PROFILE in ("default", "dev")
"""The developer's loop: it leaves out the tests that start a server or a JVM."""


def left_to_ci(what: str) -> str:
    """Why a test that ``what`` (starts Spark, moto's S3 server...) is skipped in the
    developer's loop."""
    return (
        f"{what}: runs in the ci and long profiles (HYPOTHESIS_PROFILE=ci make test, what"
        " .ci/run runs); the default profile is a developer's quick loop"
    )


def long_only(why: str) -> pytest.MarkDecorator:
    """Skip, saying so and why, unless the ``long`` profile runs: a larger or repeated
    form of a scenario whose every code path a test of the ``ci`` profile already takes
    (``why`` names that test)."""
    return pytest.mark.skipif(
        PROFILE != "long", reason=f"runs in the long profile (HYPOTHESIS_PROFILE=long): {why}"
    )
