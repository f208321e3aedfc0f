"""The campaign's bundled fuzz targets: three small deterministic parsers with
planted bugs.

Each parser takes the input bytes and a `set[int]` of coverage, and adds an
edge id to it at every branch it takes (explicit `hit(n)` calls: no
`sys.settrace`, so an execution costs microseconds). Where a planted bug
sits behind a comparison, the parser also reports how far the input got
(how many bytes of a keyword matched, how deep the nesting went), so that
coverage guides the fuzzer towards it, as compare-splitting does for real
fuzzers.

A parser rejects an invalid input with `ParseError`: that is a normal
outcome, not a crash. Any other exception is a crash; a planted bug raises
`PlantedBug` naming its site. `execute` runs one input and returns its
coverage as global edge ids, `(target number << EDGE_SHIFT) | local id`, and
its crash signature, `<target>.<site>` (or `<target>.<exception type>` for a
bug nobody planted).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final

__all__ = [
    "EDGE_SHIFT",
    "MAX_INPUT",
    "SIGNATURE_PATTERN",
    "TARGETS",
    "Execution",
    "ParseError",
    "PlantedBug",
    "Target",
    "execute",
    "target_of_edge",
    "target_of_signature",
]

#: Inputs longer than this are rejected at once (keeps every execution short).
MAX_INPUT: Final = 512
#: Global edge id = (target number << EDGE_SHIFT) | the target's local edge id.
EDGE_SHIFT: Final = 16
#: What a crash signature looks like; it becomes a directory name, so it is
#: checked against this before it touches a path.
SIGNATURE_PATTERN: Final = re.compile(r"([a-z][a-z0-9_]{0,31})\.([A-Za-z][A-Za-z0-9_-]{0,63})")

# Parsers nest by recursion: refuse absurd nesting long before Python's limit.
_MAX_NESTING: Final = 32


class ParseError(ValueError):
    """The target rejects the input: a normal outcome, not a crash."""


class PlantedBug(Exception):
    """A bug planted in a target, named by its site."""

    def __init__(self, site: str) -> None:
        super().__init__(f"planted bug: {site}")
        self.site = site


Parser = Callable[[bytes, set[int]], object]


@dataclass(frozen=True, slots=True)
class Target:
    name: str
    number: int  # the high bits of the target's global edge ids
    parse: Parser
    seeds: tuple[bytes, ...]  # the initial corpus
    # Tokens the parser compares input against: the campaign proposes them
    # as dictionary entries, verified by a worker before they are used.
    dictionary: tuple[bytes, ...]
    bugs: tuple[str, ...]  # the crash signatures of the planted bugs


@dataclass(frozen=True, slots=True)
class Execution:
    edges: frozenset[int]  # global edge ids
    crash: str | None  # the crash signature, None if the input did not crash


def execute(target: Target, data: bytes) -> Execution:
    """Run `target` on `data` once: its coverage and its crash, if any."""
    local: set[int] = set()
    crash: str | None = None
    try:
        target.parse(data, local)
    except ParseError:
        pass
    except PlantedBug as bug:
        crash = f"{target.name}.{bug.site}"
    except Exception as error:  # a bug nobody planted is a crash all the same
        crash = f"{target.name}.{type(error).__name__}"
    base = target.number << EDGE_SHIFT
    return Execution(frozenset(base | edge for edge in local), crash)


def target_of_edge(edge: int) -> Target | None:
    """The target a global edge id belongs to, or None."""
    return _BY_NUMBER.get(edge >> EDGE_SHIFT)


def target_of_signature(signature: str) -> Target | None:
    """The target a well-formed crash signature names, or None."""
    match = SIGNATURE_PATTERN.fullmatch(signature)
    return None if match is None else TARGETS.get(match.group(1))


def _common_prefix(data: bytes, keyword: bytes) -> int:
    count = 0
    for got, wanted in zip(data, keyword, strict=False):
        if got != wanted:
            break
        count += 1
    return count


# --------------------------------------------------------------------------
# kv_config: an INI-like key = value parser

_NAME = re.compile(rb"[A-Za-z0-9_.-]+")


def parse_kv(data: bytes, cov: set[int]) -> dict[bytes, dict[bytes, bytes]]:
    hit = cov.add
    if len(data) > MAX_INPUT:
        hit(1)
        raise ParseError("input too long")
    sections: dict[bytes, dict[bytes, bytes]] = {b"": {}}
    current = sections[b""]
    for raw in data.split(b"\n"):
        line = raw.strip()
        if not line:
            hit(2)
            continue
        first = line[:1]
        if first in (b"#", b";"):
            hit(3)
            continue
        if first == b"[":
            hit(4)
            if not line.endswith(b"]"):
                hit(5)
                raise ParseError("unclosed section header")
            name = line[1:-1].strip()
            if name.startswith(b"["):
                hit(6)
                raise PlantedBug("nested-section")
            if not name:
                hit(7)
                raise ParseError("empty section name")
            if _NAME.fullmatch(name) is None:
                hit(8)
                raise ParseError("bad section name")
            hit(10 if name in sections else 9)
            current = sections.setdefault(name, {})
            continue
        key, separator, value = line.partition(b"=")
        if not separator:
            hit(11)
            raise ParseError("no '=' in line")
        key, value = key.strip(), value.strip()
        if not key:
            hit(12)
            raise ParseError("empty key")
        if _NAME.fullmatch(key) is None:
            hit(13)
            raise ParseError("bad key")
        hit(15 if key in current else 14)
        hit(40 + _common_prefix(key, b"include"))
        if key == b"include":
            hit(16)
            if value.startswith(b"."):
                hit(17)
                if value.startswith(b".."):
                    raise PlantedBug("include-traversal")
            if value.startswith(b"/"):
                hit(18)
                raise ParseError("absolute include")
        if value.startswith(b'"'):
            hit(20)
            if len(value) < 2 or not value.endswith(b'"'):
                hit(21)
                raise ParseError("unterminated string")
            if b"\\" in value:
                hit(22)
        elif value.isdigit():
            hit(24 if len(value) > 1 and value.startswith(b"0") else 23)
        elif value in (b"true", b"false", b"yes", b"no"):
            hit(25)
        elif not value:
            hit(26)
        else:
            hit(27)
        current[key] = value
    hit(30 + min(len(sections), 9))
    return sections


# --------------------------------------------------------------------------
# expr_calc: integer arithmetic with + - * / % and parentheses


class _ExprParser:
    __slots__ = ("data", "hit", "pos")

    def __init__(self, data: bytes, hit: Callable[[int], None]) -> None:
        self.data = data
        self.hit = hit
        self.pos = 0

    def peek(self) -> bytes:
        data, pos = self.data, self.pos
        while pos < len(data) and data[pos] in b" \t\n":
            pos += 1
        self.pos = pos
        return data[pos : pos + 1]

    def expression(self, depth: int) -> int:
        value = self.term(depth)
        while True:
            operator = self.peek()
            if operator == b"+":
                self.hit(30)
                self.pos += 1
                value += self.term(depth)
            elif operator == b"-":
                self.hit(31)
                self.pos += 1
                value -= self.term(depth)
            else:
                return value

    def term(self, depth: int) -> int:
        value = self.factor(depth)
        while True:
            operator = self.peek()
            if operator == b"*":
                self.hit(20)
                self.pos += 1
                value *= self.factor(depth)
                if abs(value) > 1 << 256:
                    self.hit(24)
                    raise ParseError("overflow")
            elif operator in (b"/", b"%"):
                self.hit(21 if operator == b"/" else 23)
                self.pos += 1
                divisor = self.factor(depth)
                if divisor == 0:
                    self.hit(22)
                    raise PlantedBug("division-by-zero")
                value = value // divisor if operator == b"/" else value % divisor
            else:
                return value

    def factor(self, depth: int) -> int:
        sign = 1
        while self.peek() == b"-":  # a loop, not recursion: "-----1" nests nothing
            self.hit(13)
            self.pos += 1
            sign = -sign
        token = self.peek()
        if token == b"(":
            self.hit(10)
            self.hit(60 + min(depth, 9))  # each level is new coverage: a trail to the bug
            if depth >= 5:
                raise PlantedBug("deep-nesting")
            self.pos += 1
            value = self.expression(depth + 1)
            if self.peek() != b")":
                self.hit(12)
                raise ParseError("missing ')'")
            self.pos += 1
            return sign * value
        if token.isdigit():
            start = self.pos
            while self.pos < len(self.data) and self.data[self.pos : self.pos + 1].isdigit():
                self.pos += 1
            digits = self.data[start : self.pos]
            if len(digits) > 18:
                self.hit(16)
                raise ParseError("number too long")
            self.hit(15 if len(digits) > 1 and digits.startswith(b"0") else 14)
            return sign * int(digits)
        self.hit(11 if token else 17)
        raise ParseError("expected a number or '('")


def parse_expr(data: bytes, cov: set[int]) -> int:
    hit = cov.add
    if len(data) > MAX_INPUT:
        hit(1)
        raise ParseError("input too long")
    parser = _ExprParser(data, hit)
    value = parser.expression(0)
    if parser.peek():
        hit(2)
        raise ParseError("trailing input")
    hit(3 if value >= 0 else 4)
    return value


# --------------------------------------------------------------------------
# json_lite: a small JSON parser

_ESCAPES: Final = b'"\\/bfnrt'
_HEX: Final = frozenset(b"0123456789abcdefABCDEF")
_NUMBER = re.compile(rb"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?")


class _JsonParser:
    __slots__ = ("data", "hit", "pos")

    def __init__(self, data: bytes, hit: Callable[[int], None]) -> None:
        self.data = data
        self.hit = hit
        self.pos = 0

    def peek(self) -> bytes:
        data, pos = self.data, self.pos
        while pos < len(data) and data[pos] in b" \t\r\n":
            pos += 1
        self.pos = pos
        return data[pos : pos + 1]

    def expect(self, token: bytes) -> None:
        if self.peek() != token:
            self.hit(5)
            raise ParseError(f"expected {token!r}")
        self.pos += 1

    def parse_value(self, depth: int) -> object:
        if depth > _MAX_NESTING:
            self.hit(6)
            raise ParseError("nested too deep")
        token = self.peek()
        if token == b"{":
            self.hit(10)
            return self.parse_object(depth + 1)
        if token == b"[":
            self.hit(11)
            self.hit(70 + min(depth, 9))  # each level is new coverage: a trail to the bug
            if depth >= 5:
                raise PlantedBug("deep-array")
            return self.parse_array(depth + 1)
        if token == b'"':
            return self.parse_string()
        for literal, edge in ((b"true", 12), (b"false", 13), (b"null", 14)):
            if self.data.startswith(literal, self.pos):
                self.hit(edge)
                self.pos += len(literal)
                return literal
        match = _NUMBER.match(self.data, self.pos)
        if match is not None:
            self.hit(15 + (match.group(2) is not None) + 2 * (match.group(3) is not None))
            self.pos = match.end()
            return match.group(0)
        self.hit(19)
        raise ParseError("expected a value")

    def parse_object(self, depth: int) -> dict[bytes, object]:
        self.pos += 1
        result: dict[bytes, object] = {}
        if self.peek() == b"}":
            self.hit(40)
            self.pos += 1
            return result
        while True:
            if self.peek() != b'"':
                self.hit(41)
                raise ParseError("expected a key")
            key = self.parse_string()
            self.expect(b":")
            if key in result:
                self.hit(42)
            result[key] = self.parse_value(depth)
            token = self.peek()
            self.pos += 1
            if token == b"}":
                self.hit(43)
                return result
            if token != b",":
                self.hit(44)
                raise ParseError("expected ',' or '}'")

    def parse_array(self, depth: int) -> list[object]:
        self.pos += 1
        result: list[object] = []
        if self.peek() == b"]":
            self.hit(45)
            self.pos += 1
            return result
        while True:
            result.append(self.parse_value(depth))
            token = self.peek()
            self.pos += 1
            if token == b"]":
                self.hit(46)
                return result
            if token != b",":
                self.hit(47)
                raise ParseError("expected ',' or ']'")

    def parse_string(self) -> bytes:
        data = self.data
        self.pos += 1
        out = bytearray()
        while True:
            if self.pos >= len(data):
                self.hit(30)
                raise ParseError("unterminated string")
            char = data[self.pos]
            self.pos += 1
            if char == 0x22:  # '"'
                self.hit(31 if out else 32)
                return bytes(out)
            if char < 0x20:
                self.hit(33)
                raise ParseError("control character in string")
            if char != 0x5C:  # not a backslash
                out.append(char)
                continue
            escape = data[self.pos : self.pos + 1]
            self.pos += 1
            if escape == b"u":
                digits = 0
                while (
                    digits < 4 and self.pos + digits < len(data) and data[self.pos + digits] in _HEX
                ):
                    digits += 1
                self.hit(80 + digits)
                if digits >= 2:
                    raise PlantedBug("unicode-escape")
                self.hit(34)
                raise ParseError("bad \\u escape")
            if not escape or escape not in _ESCAPES:
                self.hit(35)
                raise ParseError("bad escape")
            self.hit(50 + _ESCAPES.index(escape))
            out.extend(escape)


def parse_json(data: bytes, cov: set[int]) -> object:
    hit = cov.add
    if len(data) > MAX_INPUT:
        hit(1)
        raise ParseError("input too long")
    parser = _JsonParser(data, hit)
    value = parser.parse_value(0)
    if parser.peek():
        hit(2)
        raise ParseError("trailing input")
    hit(3)
    return value


# --------------------------------------------------------------------------
# the registry

_ALL: Final = (
    Target(
        "kv_config",
        1,
        parse_kv,
        (
            b"[core]\nname = demo\ninclude = conf.d/extra\nretries = 3\n",
            b'# settings\nverbose = true\npath = "/tmp/x"\n',
        ),
        (b"[", b"include", b"..", b'"', b"true", b"#", b"="),
        ("kv_config.nested-section", "kv_config.include-traversal"),
    ),
    Target(
        "expr_calc",
        2,
        parse_expr,
        (b"(1+2)*3/4", b"10-(2*(3+4))%7"),
        (b"(", b")", b"/0", b"*", b"-"),
        ("expr_calc.division-by-zero", "expr_calc.deep-nesting"),
    ),
    Target(
        "json_lite",
        3,
        parse_json,
        (
            b'{"name": "demo", "tags": ["a\\nb", 1, -2.5], "ok": true}',
            b'[null, {"k": []}, "x"]',
        ),
        (b"\\u", b"[", b"{", b"true", b"null", b'"', b":"),
        ("json_lite.deep-array", "json_lite.unicode-escape"),
    ),
)

#: The bundled targets by name.
TARGETS: Final = MappingProxyType({target.name: target for target in _ALL})
_BY_NUMBER: Final = {target.number: target for target in _ALL}
