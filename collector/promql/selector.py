"""PromQL series selectors of the names endpoints' ``match[]`` (PROTOCOL §5 "Names").

Only the selector grammar, not PromQL: ``metric``, ``metric{l="v", ...}`` or
``{l=~"v", ...}``, with the four operators ``=``, ``!=``, ``=~``, ``!~`` and PromQL's
string literals (double or single quotes with Go escapes, or backquotes, raw). A metric
name outside the braces is an ``=`` matcher on ``__name__``. As in Prometheus, a selector
needs one matcher that does not match the empty string (else every series would match),
and a ``__name__`` given twice is refused (the empty-string rule needs the compiled
matchers: `collector.promql.matchers`).

Parsing is a single left-to-right scan with fixed, linear tokens; the regexes a caller
writes are never compiled here (`collector.promql.matchers` compiles them with RE2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .matchers import MAX_MATCHERS

MAX_SELECTOR_BYTES = 64 * 1024
OPERATORS = ("=~", "!~", "!=", "=")  # longest first
KINDS = {"=": "EQ", "!=": "NEQ", "=~": "RE", "!~": "NRE"}

_METRIC = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_SPACE = re.compile(r"\s*")
_SIMPLE_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    '"': '"',
    "'": "'",
}


class SelectorError(ValueError):
    """A selector that cannot be parsed, or that would match every series."""


@dataclass(frozen=True, slots=True)
class Matcher:
    kind: str  # "EQ" | "NEQ" | "RE" | "NRE"
    name: str
    value: str


class _Scanner:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def skip_space(self) -> None:
        match = _SPACE.match(self.text, self.at)
        self.at = match.end() if match else self.at

    def peek(self) -> str:
        return self.text[self.at : self.at + 1]

    def take(self, pattern: re.Pattern[str], what: str) -> str:
        match = pattern.match(self.text, self.at)
        if match is None:
            raise self.error(f"expected {what}")
        self.at = match.end()
        return match.group(0)

    def operator(self) -> str:
        for op in OPERATORS:
            if self.text.startswith(op, self.at):
                self.at += len(op)
                return op
        raise self.error("expected one of =, !=, =~, !~")

    def string(self) -> str:
        quote = self.peek()
        if quote not in ('"', "'", "`"):
            raise self.error("expected a quoted string")
        self.at += 1
        if quote == "`":
            end = self.text.find("`", self.at)
            if end < 0:
                raise self.error("unterminated raw string")
            value, self.at = self.text[self.at : end], end + 1
            return value
        out: list[str] = []
        while True:
            if self.at >= len(self.text):
                raise self.error("unterminated string")
            char = self.text[self.at]
            if char == quote:
                self.at += 1
                return "".join(out)
            if char == "\n":
                raise self.error("newline in string")
            if char != "\\":
                out.append(char)
                self.at += 1
                continue
            out.append(self._escape(quote))

    def _escape(self, quote: str) -> str:
        code = self.text[self.at + 1 : self.at + 2]
        if code in _SIMPLE_ESCAPES and (code not in "\"'" or code == quote):
            self.at += 2
            return _SIMPLE_ESCAPES[code]
        digits = {"x": 2, "u": 4, "U": 8}.get(code)
        if digits is not None:
            hex_text = self.text[self.at + 2 : self.at + 2 + digits]
            if len(hex_text) != digits or not all(c in "0123456789abcdefABCDEF" for c in hex_text):
                raise self.error(f"bad \\{code} escape")
            self.at += 2 + digits
            point = int(hex_text, 16)
            if point > 0x10FFFF or 0xD800 <= point <= 0xDFFF:
                raise self.error("escape is not a valid code point")
            return chr(point)
        octal = self.text[self.at + 1 : self.at + 4]
        if len(octal) == 3 and all(c in "01234567" for c in octal) and int(octal, 8) < 256:
            self.at += 4
            return chr(int(octal, 8))
        raise self.error("unknown escape sequence")

    def error(self, problem: str) -> SelectorError:
        return SelectorError(f"{problem} at position {self.at}")


def parse_selector(text: str) -> tuple[Matcher, ...]:
    """The matchers of one series selector. `SelectorError` names the problem."""
    if len(text.encode()) > MAX_SELECTOR_BYTES:
        raise SelectorError(f"selector longer than {MAX_SELECTOR_BYTES} bytes")
    scan = _Scanner(text)
    scan.skip_space()
    matchers: list[Matcher] = []
    if scan.peek() != "{":
        matchers.append(Matcher("EQ", "__name__", scan.take(_METRIC, "a metric name or {")))
        scan.skip_space()
    if scan.peek() == "{":
        scan.at += 1
        scan.skip_space()
        while scan.peek() != "}":
            name = scan.take(_LABEL, "a label name")
            scan.skip_space()
            kind = KINDS[scan.operator()]
            scan.skip_space()
            matchers.append(Matcher(kind, name, scan.string()))
            if len(matchers) > MAX_MATCHERS:
                raise SelectorError(f"more than {MAX_MATCHERS} matchers")
            scan.skip_space()
            if scan.peek() == ",":
                scan.at += 1
                scan.skip_space()
            elif scan.peek() != "}":
                raise scan.error("expected , or }")
        scan.at += 1
        scan.skip_space()
    if scan.at != len(text):
        raise scan.error("unexpected text after the selector")
    if not matchers:
        raise SelectorError("a selector needs at least one matcher")
    names = [m for m in matchers if m.name == "__name__" and m.kind == "EQ"]
    if len(names) > 1 and len({m.value for m in names}) > 1:
        raise SelectorError("metric name given twice")
    return tuple(matchers)
