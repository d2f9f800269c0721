"""The string forms SPEC.md §0 ("Strings an observation shows") promises, checked on
what the model and fastimpl show after every command of a job that checkpoints, reuses,
takes a savepoint, loses a TM, fails over, restores with CLAIM and ends.

fastimpl runs through ``model_tests.targets.FastimplTarget`` (the model's counter names),
on ``memory://``, in every merging mode.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator

import fsspec  # type: ignore[import-untyped]
import pytest

from conformance.harness import DEFAULT_JOB, KS, OP, Harness, merging
from model_tests.targets import FastimplTarget
from spec import commands as c
from spec.config import MergingMode, RestoreMode
from spec.effects import Effect
from spec.observation import Observation

_roots = itertools.count()

TM = re.compile(r"tm-[1-9][0-9]*")
PARTY = re.compile(rf"coordinator|user|tm:{TM.pattern}")
JOB = r"job-[0-9]+"
DIR = (
    rf"{JOB}/shared/[A-Za-z0-9._-]+-[0-9]+-[1-9][0-9]*"
    rf"|{JOB}/taskowned/{TM.pattern}"
    rf"|{JOB}/taskowned/working/[A-Za-z0-9._-]+-[0-9]+-[1-9][0-9]*/db"
    rf"|{JOB}/chk-[1-9][0-9]*"
    r"|savepoints/savepoint-[1-9][0-9]*"
)
# a TM attempt marks the names it draws with its id (SPEC §0, ``fastimpl.ids.marked``)
FILE = re.compile(rf"(?:{DIR})/(?:f[0-9]{{6,}}(?:\.{TM.pattern})?|_metadata)")
LOGICAL_ID = re.compile(r"s[0-9]{6,}")


def violations(obs: Observation) -> list[str]:
    """Every string of ``obs`` that breaks a stated form."""
    out: list[str] = []

    def need(ok: bool, what: str) -> None:
        if not ok:
            out.append(what)

    for path in obs.files:
        need(FILE.fullmatch(path) is not None, f"file path {path!r}")
    for path, owner in obs.owners.items():
        need(PARTY.fullmatch(owner) is not None, f"owner {owner!r} of {path}")
    for path, owner in obs.directories.items():
        need(re.fullmatch(DIR, path) is not None, f"directory {path!r}")
        need(PARTY.fullmatch(owner) is not None, f"owner {owner!r} of {path}")
    for path, parties in obs.claims.items():
        need(all(PARTY.fullmatch(p) for p in parties), f"claims {sorted(parties)} of {path}")
    need("coordinator" in obs.live_parties, "live_parties lacks the coordinator")
    need(
        all(PARTY.fullmatch(p) and p != "user" for p in obs.live_parties),
        f"live_parties {sorted(obs.live_parties)}",
    )
    for d in obs.deletions:
        need(PARTY.fullmatch(d.actor) is not None, f"deletion actor {d.actor!r}")
        need(d.owner is None or PARTY.fullmatch(d.owner) is not None, f"owner {d.owner!r}")
    for key, reg in obs.registry.items():
        if key.startswith("dir:"):
            need(key == f"dir:{reg.path}" and reg.owned, f"registry {key!r} -> {reg!r}")
            need(re.fullmatch(DIR, reg.path) is not None, f"registry directory {reg.path!r}")
        else:
            need(LOGICAL_ID.fullmatch(key) is not None, f"registry key {key!r}")
            need(FILE.fullmatch(reg.path) is not None, f"registry path {reg.path!r}")
    need(
        obs.metadata_files == {p for p in obs.files if p.endswith("/_metadata")},
        f"metadata_files {sorted(obs.metadata_files)}",
    )
    return out


def effect_violations(effects: list[Effect]) -> list[str]:
    return [f"effect actor {e!r}" for e in effects if not PARTY.fullmatch(e.actor)]


def _checkpoint(h: Harness, *, reuse: bool = False, savepoint: bool = False) -> Iterator[c.Command]:
    yield c.Trigger(savepoint=savepoint)
    cp = h.last_checkpoint
    for s in h.subtasks:
        if reuse:
            yield c.ReuseShared(cp, s, "sst-1")
        else:
            yield c.WriteState(cp, s, KS, "sst-1", 100)
        yield c.WriteState(cp, s, OP, "offsets", 26, entries=2)
        yield c.Acknowledge(cp, s)
    yield c.Complete(cp)


def _deliver(h: Harness) -> Iterator[c.Command]:
    while h.state.channel:
        yield c.DeliverNotification(0)


def _job(h: Harness) -> Iterator[c.Command]:
    """Commands computed from the model's state as it goes (the product must agree)."""
    yield from _checkpoint(h)
    yield from _deliver(h)
    yield from _checkpoint(h, reuse=True)
    yield from _deliver(h)
    yield from _checkpoint(h, savepoint=True)
    yield from _deliver(h)
    lost = h.live_tms()[0]
    yield c.CrashTm(lost)
    yield c.AttemptStopped(lost)
    yield c.Failover()
    yield from _checkpoint(h)
    yield from _deliver(h)
    yield c.Restore(h.state.retained[-1].id, (("src", 1),), RestoreMode.CLAIM)
    yield from _checkpoint(h)
    yield from _deliver(h)
    yield from _checkpoint(h)
    yield from _deliver(h)
    yield c.Cancel(retain=True)


@pytest.mark.parametrize("mode", list(MergingMode), ids=lambda m: m.name)
def test_observed_strings_have_the_stated_forms(mode: MergingMode) -> None:
    config = merging(mode)
    model = Harness(config, DEFAULT_JOB)
    fs = fsspec.filesystem("memory")
    root = f"/observation-strings-{next(_roots)}"
    fs.makedirs(root, exist_ok=True)
    product = FastimplTarget(config, DEFAULT_JOB, fs, root)
    seen: dict[str, set[str]] = {"tm": set(), "dir:": set(), "savepoints/": set()}
    try:
        for cmd in _job(model):
            model.run(cmd)
            product.apply(cmd)
            for who, obs in (("refimpl", model.observe()), ("fastimpl", product.observe())):
                wrong = violations(obs)
                assert not wrong, f"{who} after {cmd!r}: {wrong}"
                seen["tm"] |= {p for p in obs.owners.values() if p.startswith("tm:")}
                seen["dir:"] |= {k for k in obs.registry if k.startswith("dir:")}
                seen["savepoints/"] |= {p for p in obs.files if p.startswith("savepoints/")}
        assert effect_violations(model.effects) == []
    finally:
        product.close()
        fs.rm(root, recursive=True)
    # The job reached every form it checks: TM owners, a savepoint's files, and (with
    # merging) managed directories in the registry.
    assert seen["tm"] and seen["savepoints/"]
    assert bool(seen["dir:"]) is (mode is not MergingMode.NONE)


def test_the_forms_reject_what_they_should() -> None:
    """The patterns are not vacuous."""
    assert FILE.fullmatch("job-0/shared/src-0-2/f000001")
    assert FILE.fullmatch("savepoints/savepoint-3/f000012")
    assert not FILE.fullmatch("/job-0/shared/src-0-2/f000001")  # leading /
    assert not FILE.fullmatch("job-0/shared/src-0-2/f1")  # fewer than six digits
    assert not FILE.fullmatch("job-0/somewhere/f000001")
    assert PARTY.fullmatch("tm:tm-3") and not PARTY.fullmatch("tm-3")
    assert not PARTY.fullmatch("tm:")
    assert LOGICAL_ID.fullmatch("s000001") and not LOGICAL_ID.fullmatch("dir:job-0")
