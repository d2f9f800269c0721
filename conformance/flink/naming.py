"""Flink's file names (random UUIDs in its managed directories) as the model's (R2:
``f000001``... in order of creation, in the layout of R1).

A Flink directory maps to ours by what it is for (a subtask's shared directory, a TM's
exclusive one). A Flink file that appeared in a step is paired with a file the model created
in the same directory in the same step, both taken in order of creation (Flink's: the order
handles first named them, then modification time). A model file that no Flink file matched
in its step is never paired later: it shows as a file only the model has. A Flink file with no model
file to pair with keeps a name of its own, ``flink-<first 8 characters>``, so that it shows
as a file only Flink has."""

from __future__ import annotations

import os
from collections.abc import Mapping, Set


class Namer:
    def __init__(self) -> None:
        self.dirs: dict[str, str] = {}
        self.names: dict[str, str] = {}
        self.back: dict[str, str] = {}
        self.mentioned: dict[str, int] = {}
        self.model_seen: set[str] = set()

    def directory(self, flink: str, ours: str) -> None:
        self.dirs[local_path(flink).rstrip("/")] = ours

    def saw(self, flink_file: str) -> None:
        """A handle named this file: its place in the order of creation."""
        self.mentioned.setdefault(local_path(flink_file), len(self.mentioned))

    def ours(self, flink_file: str) -> str:
        return self.names[flink_file]

    def flink_path(self, ours: str) -> str | None:
        return self.back.get(ours)

    def pair(self, on_disk: Mapping[str, int], model_files: Set[str]) -> None:
        """Name every Flink file on disk not named yet; ``model_files`` are the model's
        files after the same step."""
        born = set(model_files) - self.model_seen
        self.model_seen |= set(model_files)
        new: dict[str, list[str]] = {}
        for flink in on_disk:
            if flink not in self.names:
                new.setdefault(os.path.dirname(flink), []).append(flink)
        for flink_dir, flink_files in new.items():
            ours_dir = self.dirs.get(flink_dir, f"unknown/{os.path.basename(flink_dir)}")
            free = sorted(p for p in born if os.path.dirname(p) == ours_dir)
            flink_files.sort(key=self._created)
            for i, flink in enumerate(flink_files):
                if i < len(free):
                    name = free[i]
                else:
                    name = f"{ours_dir}/flink-{os.path.basename(flink)[:8]}"
                self.names[flink] = name
                self.back[name] = flink

    def _created(self, flink: str) -> tuple[int, int, str]:
        try:
            mtime = os.stat(flink).st_mtime_ns
        except FileNotFoundError:
            mtime = 0
        return (self.mentioned.get(flink, len(self.mentioned) + 1), mtime, flink)


def local_path(path: str) -> str:
    """A Flink path string (``file:/...`` or ``/...``) as a local path."""
    return path[len("file:") :] if path.startswith("file:") else path
