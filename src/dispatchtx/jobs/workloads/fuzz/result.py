"""The worker's answer, `BatchResult` (compact JSON bytes): edges covered,
new inputs (`Finding`), crashes (`Crash`), the proposal's verdict."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from dispatchtx.jobs.workloads.fuzz.payload import (
    _MAX_CRASHES,
    _MAX_NEW_INPUTS,
    _OBJECT_ID,
    _checked,
)
from dispatchtx.jobs.workloads.targets import (
    MAX_INPUT,
    TARGETS,
    Target,
    target_of_edge,
    target_of_signature,
)

# --------------------------------------------------------------------------
# the result


class MalformedResult(ValueError):
    """Result bytes that are not a well-formed `BatchResult`."""


@dataclass(frozen=True, slots=True)
class Finding:
    """An input that reached coverage new to the batch: a corpus entry."""

    input: bytes
    edges: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class Crash:
    input: bytes
    signature: str


@dataclass(frozen=True, slots=True)
class BatchResult:
    target: str
    seed: str
    executions: int
    edges: tuple[int, ...]  # every edge the batch covered, the seed's own included
    new_edges: tuple[int, ...]  # those the payload's known coverage lacked
    new_inputs: tuple[Finding, ...]
    crashes: tuple[Crash, ...]  # the first input of each signature
    proposal: tuple[str, bool] | None  # (proposal id, accepted)

    @property
    def found_new(self) -> bool:
        return bool(self.new_edges)

    def encode(self) -> bytes:
        return json.dumps(
            {
                "v": 1,
                "target": self.target,
                "seed": self.seed,
                "execs": self.executions,
                "edges": list(self.edges),
                "new_edges": list(self.new_edges),
                "new": [[f.input.hex(), list(f.edges)] for f in self.new_inputs],
                "crashes": [[c.input.hex(), c.signature] for c in self.crashes],
                "proposal": None if self.proposal is None else list(self.proposal),
            },
            sort_keys=True,
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> BatchResult:
        """Parse and check a worker's answer; `MalformedResult` if it is not one."""
        try:
            fields = json.loads(data)
            if fields["v"] != 1:
                raise ValueError(f"unknown version {fields['v']!r}")
            target = TARGETS[_checked(fields["target"], str)]
            proposal = fields["proposal"]
            result = cls(
                target.name,
                _checked(fields["seed"], str),
                _checked(fields["execs"], int),
                _edges_of(target, fields["edges"]),
                _edges_of(target, fields["new_edges"]),
                tuple(
                    Finding(_input_of(item[0]), _edges_of(target, item[1]))
                    for item in fields["new"]
                ),
                tuple(
                    Crash(_input_of(item[0]), _checked(item[1], str)) for item in fields["crashes"]
                ),
                None
                if proposal is None
                else (_checked(proposal[0], str), _checked(proposal[1], bool)),
            )
        except (ValueError, KeyError, TypeError, IndexError, RecursionError) as error:
            raise MalformedResult(f"bad fuzz result: {error}") from error
        if _OBJECT_ID.fullmatch(result.seed) is None:
            raise MalformedResult(f"bad seed object id {result.seed!r}")
        if len(result.new_inputs) > _MAX_NEW_INPUTS or len(result.crashes) > _MAX_CRASHES:
            raise MalformedResult("too many findings")
        for crash in result.crashes:
            if target_of_signature(crash.signature) is not target:
                raise MalformedResult(f"bad crash signature {crash.signature!r}")
        return result


def _edges_of(target: Target, values: Any) -> tuple[int, ...]:
    edges = tuple(_checked(value, int) for value in values)
    for edge in edges:
        if target_of_edge(edge) is not target:
            raise ValueError(f"edge {edge} is not one of {target.name}'s")
    return edges


def _input_of(text: Any) -> bytes:
    data = bytes.fromhex(_checked(text, str))
    if len(data) > MAX_INPUT:
        raise ValueError("an input longer than any target takes")
    return data
