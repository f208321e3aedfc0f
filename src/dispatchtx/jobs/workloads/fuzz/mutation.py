"""Mutation: `mutate` (the strategies' byte edits) and `token_helps`, the
check of a proposed dictionary token."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Final

from dispatchtx.jobs.workloads.fuzz.payload import _VERIFY_POSITIONS
from dispatchtx.jobs.workloads.targets import (
    MAX_INPUT,
    Target,
    execute,
)

# --------------------------------------------------------------------------
# mutation

_INTERESTING: Final = b'\x00\xff019-\n "\\()[]{}=.'
_PRINTABLE: Final = bytes(range(32, 127)) + b"\n"
_OPS: Final = {
    "bitflip": ("flip",),
    "bytes": ("set", "interesting", "insert", "delete"),
    "havoc": (
        "flip",
        "set",
        "interesting",
        "insert",
        "delete",
        "clone",
        "token-insert",
        "token-overwrite",
    ),
    "dictionary": ("token-insert", "token-overwrite"),
}


def mutate(
    seed: bytes, rng: random.Random, strategy: str, depth: int, dictionary: Sequence[bytes]
) -> bytes:
    """`depth` stacked mutations of `seed` drawn from `strategy`'s operators."""
    data = bytearray(seed)
    ops = _OPS[strategy]
    for _ in range(depth):
        op = ops[rng.randrange(len(ops))]
        if op.startswith("token") and not dictionary:
            op = "insert"  # no verified token yet: a printable byte instead
        size = len(data)
        if op == "flip":
            if size:
                data[rng.randrange(size)] ^= 1 << rng.randrange(8)
        elif op == "set":
            if size:
                data[rng.randrange(size)] = rng.randrange(256)
        elif op == "interesting":
            if size:
                data[rng.randrange(size)] = _INTERESTING[rng.randrange(len(_INTERESTING))]
        elif op == "insert":
            data.insert(rng.randrange(size + 1), _PRINTABLE[rng.randrange(len(_PRINTABLE))])
        elif op == "delete":
            if size > 1:
                start = rng.randrange(size)
                del data[start : start + 1 + rng.randrange(4)]
        elif op == "clone":
            if size:
                start = rng.randrange(size)
                chunk = data[start : start + 1 + rng.randrange(8)]
                at = rng.randrange(size + 1)
                data[at:at] = chunk
        else:
            token = dictionary[rng.randrange(len(dictionary))]
            at = rng.randrange(size + 1)
            end = at if op == "token-insert" else at + len(token)
            data[at:end] = token
    return bytes(data[:MAX_INPUT])


def token_helps(target: Target, seed: bytes, token: bytes) -> bool:
    """Verify a proposed dictionary token: put it into the seed at spread-out
    positions and see whether it reaches an edge, or a crash, that a neutral
    filler of the same length does not (so that it matters as a token, not
    as noise)."""
    if not token:
        return False
    filler = b"a" * len(token)
    seed_edges = execute(target, seed).edges
    size = len(seed)
    positions = sorted(
        {size * step // (_VERIFY_POSITIONS - 1) for step in range(_VERIFY_POSITIONS)}
    )
    for at in positions:
        for end in (at, at + len(token)):  # inserted, then overwriting
            with_token = execute(target, seed[:at] + token + seed[end:])
            with_filler = execute(target, seed[:at] + filler + seed[end:])
            if with_token.edges - with_filler.edges - seed_edges:
                return True
            if with_token.crash is not None and with_token.crash != with_filler.crash:
                return True
    return False
