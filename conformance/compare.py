"""How an implementation's observation is compared with the model's: the lockstep
machine (``test_lockstep.py``) and trace replay (``replay.py``) use the same rules."""

from __future__ import annotations

import attrs

from spec.observation import Observation

METADATA_SUFFIX = "/_metadata"


def normalized(obs: Observation, *, open_files_listed: bool = True) -> Observation:
    """Metadata files are compared by existence, not by byte size. Without
    ``open_files_listed`` (an object store) a file still open is not on storage yet."""
    files = {
        p: (-1 if p.endswith(METADATA_SUFFIX) else n)
        for p, n in obs.files.items()
        if open_files_listed or p not in obs.open_files
    }
    return attrs.evolve(obs, files=files)


def differences(model: Observation, impl: Observation) -> list[str]:
    """One readable paragraph per field of ``Observation`` that differs."""
    out = []
    for f in attrs.fields(Observation):
        a, b = getattr(model, f.name), getattr(impl, f.name)
        if a != b:
            out.append(f"{f.name}:\n    model: {a!r}\n    fast:  {b!r}")
    return out
