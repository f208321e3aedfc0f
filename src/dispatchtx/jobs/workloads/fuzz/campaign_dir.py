"""The campaign directory: immutable files published by link, and the
coverage deltas' encoding."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from enum import Enum
from typing import Final

from dispatchtx.fs import FS
from dispatchtx.jobs.workloads.targets import (
    TARGETS,
    target_of_edge,
)

# --------------------------------------------------------------------------
# the campaign directory


class Published(Enum):
    LINKED = "linked"  # this call put the file in place
    PRESENT = "present"  # it was there already, with the same content
    CONFLICT = "conflict"  # it was there with OTHER content: reported, never replaced


class CampaignDir:
    """Immutable files linked into place under `root` on an `FS`."""

    CORPUS: Final = "corpus"
    CRASHES: Final = "crashes"
    DELTAS: Final = os.path.join("coverage", "deltas")
    TMP: Final = "tmp"

    def __init__(self, fs: FS, root: str) -> None:
        self.fs = fs
        self.root = root
        self._made: set[str] = set()

    def path(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    def publish(self, directory: str, name: str, data: bytes) -> Published:
        """Write `data` as `<root>/<directory>/<name>` once: write a temp file,
        link it into place, fsync the directory (also when it was there
        already: its writer may have died before its fsync). Raises
        `OSError` if the disk fails; calling again is always safe."""
        where = self.path(directory)
        tmp = self.path(self.TMP)
        for needed in (tmp, where):
            if needed not in self._made:
                self.fs.mkdir(needed)  # durable on return (FS contract)
                self._made.add(needed)
        temp = self.fs.write_temp(tmp, data)
        try:
            try:
                self.fs.link(temp, os.path.join(where, name))
                outcome = Published.LINKED
            except FileExistsError:
                # Also a lost reply of our own link: then the content is ours.
                same = self.fs.read(os.path.join(where, name)) == data
                outcome = Published.PRESENT if same else Published.CONFLICT
            self.fs.fsync_dir(where)
        finally:
            with contextlib.suppress(OSError):  # a leftover temp is garbage, not data
                self.fs.unlink(temp)
        return outcome

    def listdir(self, *parts: str) -> list[str]:
        try:
            return sorted(self.fs.listdir(self.path(*parts)))
        except FileNotFoundError:
            return []


def encode_delta(target: str, edges: Iterable[int]) -> bytes:
    """A coverage delta file: the target's name, then one edge id a line."""
    return "\n".join([target, *(str(edge) for edge in sorted(edges))]).encode() + b"\n"


def decode_delta(data: bytes) -> tuple[str, frozenset[int]]:
    lines = data.decode().splitlines()
    if not lines or lines[0] not in TARGETS:
        raise ValueError("a delta starts with a target name")
    target = TARGETS[lines[0]]
    edges = frozenset(int(line) for line in lines[1:])
    if any(target_of_edge(edge) is not target for edge in edges):
        raise ValueError(f"an edge that is not one of {target.name}'s")
    return target.name, edges
