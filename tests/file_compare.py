"""The multi-process soak's file comparison with the model (issue 16, point 3).

After each soak step the real files (storage's listing) and who owns them (both parties'
records merged, ``tests.tm_cluster.observe``) are summarised, and at the end the trace is
stepped through the model (``refimpl``) and the model's files and owners are summarised
the same way after the same command; the two must be equal.

What is compared, per file: the directory it lies in (job base, ``chk-N``, a subtask's
shared directory, a TM's exclusive directory, a savepoint's: all named as the model
names them, TM ids included, since the engine numbers attempts as the model does), its
owner (a party, the user, or none), its size (``_metadata`` by existence, as the lockstep
machine compares it), and the name itself for ``_metadata`` files.

What is not compared, and why:
- the other file names: each party draws names from its own ``RandomIds`` (unique
  across processes without coordination, R2), the model from one counter; within a
  directory files are compared as a multiset of (owner, size), so a file missing,
  extra, or owned by someone else is still caught, but two files of one directory with
  the same owner and size that swapped names are not told apart;
- files of a savepoint the user deleted (outside the store, so outside the trace);
- on an object store, files still open: the store lists a file only once closed, the
  model lists it from its creation (as ``conformance.compare.normalized`` does); and
  there, every directory holding a file a lost attempt (a zombie) created: the zombie's
  upload completes only when the zombie closes the file, which a zombie may never do
  (the object never exists), while the model closes it when it hands the file over at
  the failover (R61, R64). The file's directory is left out on both sides.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable

from refimpl import initial_state, observe, step
from refimpl.state import ModelState, TmStatus
from spec import codec
from spec.config import Config, JobSpec
from spec.errors import CommandError
from spec.layout import METADATA
from spec.observation import Observation

Summary = Counter[tuple[str, str, str, int]]


def summary(obs: Observation, *, hide_open: bool, skip: Iterable[str] = ()) -> Summary:
    """(directory, name if ``_metadata`` else "*", owner, size) of every file, counted."""
    skipped = set(skip)
    out: Summary = Counter()
    for path, size in obs.files.items():
        if path in skipped or path.rsplit("/", 1)[0] in skipped:
            continue
        if hide_open and path in obs.open_files:
            continue
        directory, name = path.rsplit("/", 1) if "/" in path else ("", path)
        meta = name == METADATA
        owner = obs.owners.get(path) or "none"
        out[(directory, name if meta else "*", owner, -1 if meta else size)] += 1
    return out


def compare_with_model(
    trace_lines: list[str], snapshots: list[tuple[int, Summary]], skip: Iterable[str]
) -> tuple[int, str | None]:
    """Step the trace through the model; after the command that ends each snapshot's
    step, compare. The number of snapshots compared, and the first difference."""
    head = codec_header(trace_lines[0])
    config, job = head
    state = initial_state(config, job)
    hide_open = not config.open_files_readable
    at = dict(snapshots)
    skipped = set(skip)  # files and directories of savepoints the user deleted
    compared = 0
    for n, text in enumerate(trace_lines[1:], 1):
        line = json.loads(text)
        cmd = codec.decode_command(line["command"], "$.command")
        try:
            state = step(state, cmd).state
        except CommandError:
            pass  # a refusal changes nothing (the replay checks the reasons)
        if n in at:
            model = summary(observe(state), hide_open=hide_open, skip=skip)
            real = Counter({k: v for k, v in at[n].items() if k[0] not in skipped})
            if hide_open:
                hidden = _zombie_dirs(state)
                model = Counter({k: v for k, v in model.items() if k[0] not in hidden})
                real = Counter({k: v for k, v in real.items() if k[0] not in hidden})
            if model != real:
                only_model = sorted((model - real).elements())
                only_real = sorted((real - model).elements())
                return compared, (
                    f"after trace line {n} ({cmd!r}): files differ\n"
                    f"    only in the model: {only_model}\n"
                    f"    only on storage:   {only_real}"
                )
            compared += 1
    return compared, None


def _zombie_dirs(state: ModelState) -> set[str]:
    """Directories holding a file a lost attempt created (see the module docstring)."""
    return {
        path.rsplit("/", 1)[0]
        for path, f in state.files.items()
        if f.creator is not None
        and f.creator in state.tms
        and state.tms[f.creator].status is TmStatus.LOST
    }


def codec_header(first: str) -> tuple[Config, JobSpec]:
    head = json.loads(first)
    return codec.decode(Config, head["config"], "$.config"), codec.decode(
        JobSpec, head["job"], "$.job"
    )
