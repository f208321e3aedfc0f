"""The fuzz campaign's constants and the worker's payload, `FuzzPayload`
(JSON text): target, seed, strategy and depth, batch, known coverage, tokens."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Final

from dispatchtx.jobs.workloads.targets import (
    TARGETS,
)

STRATEGIES: Final = ("bitflip", "bytes", "havoc", "dictionary")
#: The bandit's arms: how many mutations are stacked on each input.
DEPTH_ARMS: Final = MappingProxyType({f"depth-{depth}": depth for depth in (1, 2, 4, 8)})

# A result stays small: at most this many new inputs and crash signatures.
_MAX_NEW_INPUTS: Final = 8
_MAX_CRASHES: Final = 4
_MAX_BATCH: Final = 4096
_MAX_DEPTH: Final = 64
# Where a proposed token is tried in the seed when it is verified.
_VERIFY_POSITIONS: Final = 9

_OBJECT_ID = re.compile(r"[0-9a-f]{64}")
# Item ids become file names: <target>-<16 hex of the seed id>-<batch number>.
_ITEM_ID = re.compile(r"([a-z][a-z0-9_]{0,31})-([0-9a-f]{16})-([0-9]{1,6})")
_ENTRY_NAME = re.compile(r"(.+)\.([1-9][0-9]{0,18})")


# --------------------------------------------------------------------------
# the payload


class MalformedPayload(ValueError):
    """A work payload that is not a well-formed `FuzzPayload`."""


@dataclass(frozen=True, slots=True)
class FuzzPayload:
    """What one mutation batch runs: everything the result depends on,
    apart from the seed's content (named by its object id)."""

    target: str
    seed: str  # object id of the seed's content
    strategy: str
    depth: int
    batch_size: int
    rng: int
    known: tuple[int, ...] = ()  # coverage the coordinator already has
    dictionary: tuple[bytes, ...] = ()  # verified tokens for the dictionary stages
    proposal: tuple[str, bytes] | None = None  # (proposal id, token) to verify

    def encode(self) -> str:
        return json.dumps(
            {
                "target": self.target,
                "seed": self.seed,
                "strategy": self.strategy,
                "depth": self.depth,
                "batch": self.batch_size,
                "rng": self.rng,
                "known": list(self.known),
                "dictionary": [token.hex() for token in self.dictionary],
                "proposal": None
                if self.proposal is None
                else [self.proposal[0], self.proposal[1].hex()],
            },
            sort_keys=True,
            separators=(",", ":"),
        )

    @classmethod
    def decode(cls, text: object) -> FuzzPayload:
        if not isinstance(text, str):
            raise MalformedPayload(f"a fuzz payload is JSON text, not {type(text).__name__}")
        try:
            fields = json.loads(text)
            proposal = fields["proposal"]
            payload = cls(
                _checked(fields["target"], str),
                _checked(fields["seed"], str),
                _checked(fields["strategy"], str),
                _checked(fields["depth"], int),
                _checked(fields["batch"], int),
                _checked(fields["rng"], int),
                tuple(_checked(edge, int) for edge in fields["known"]),
                tuple(bytes.fromhex(_checked(token, str)) for token in fields["dictionary"]),
                None
                if proposal is None
                else (_checked(proposal[0], str), bytes.fromhex(_checked(proposal[1], str))),
            )
        except (ValueError, KeyError, TypeError, IndexError, RecursionError) as error:
            raise MalformedPayload(f"bad fuzz payload: {error}") from error
        if payload.target not in TARGETS:
            raise MalformedPayload(f"unknown target {payload.target!r}")
        if _OBJECT_ID.fullmatch(payload.seed) is None:
            raise MalformedPayload(f"bad seed object id {payload.seed!r}")
        if payload.strategy not in STRATEGIES:
            raise MalformedPayload(f"unknown strategy {payload.strategy!r}")
        if not (1 <= payload.depth <= _MAX_DEPTH and 1 <= payload.batch_size <= _MAX_BATCH):
            raise MalformedPayload(f"depth {payload.depth} or batch {payload.batch_size} too big")
        return payload


def _checked(value: Any, kind: type[Any]) -> Any:
    # bool is an int subclass: never accept it where an int is meant
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise TypeError(f"expected {kind.__name__}, got {value!r}")
    return value
