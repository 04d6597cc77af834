"""The ledger's per-hour set checksum (PROTOCOL §4).

An hour's setsum is the sum modulo 2^256 of ``sha256(manifest_id + "\\n" + frame_sha256)``
(UTF-8 input, digest read as a big-endian unsigned integer) over that hour's batches,
written as 64 hex digits. Being a sum, it is independent of order, can be built
incrementally, and two sets are equal only if (with overwhelming probability) their
setsums are: a missing batch or a batch counted twice both change it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

MODULUS = 2**256


def batch_term(manifest_id: str, frame_sha256: str) -> int:
    """One batch's contribution to its hour's setsum."""
    digest = hashlib.sha256(f"{manifest_id}\n{frame_sha256}".encode()).digest()
    return int.from_bytes(digest, "big")


@dataclass(frozen=True, slots=True)
class Setsum:
    """An order-independent checksum of a set of (manifest_id, frame_sha256) pairs."""

    value: int = 0

    @classmethod
    def of(cls, batches: Iterable[tuple[str, str]]) -> Setsum:
        total = 0
        for manifest_id, frame_sha256 in batches:
            total += batch_term(manifest_id, frame_sha256)
        return cls(total % MODULUS)

    @classmethod
    def from_hex(cls, text: str) -> Setsum:
        if len(text) != 64 or text != text.lower():
            raise ValueError(f"setsum must be 64 lowercase hex digits, got {text!r}")
        return cls(int(text, 16))

    def add(self, manifest_id: str, frame_sha256: str) -> Setsum:
        return Setsum((self.value + batch_term(manifest_id, frame_sha256)) % MODULUS)

    def remove(self, manifest_id: str, frame_sha256: str) -> Setsum:
        return Setsum((self.value - batch_term(manifest_id, frame_sha256)) % MODULUS)

    def __add__(self, other: Setsum) -> Setsum:
        return Setsum((self.value + other.value) % MODULUS)

    def __sub__(self, other: Setsum) -> Setsum:
        return Setsum((self.value - other.value) % MODULUS)

    @property
    def hex(self) -> str:
        return f"{self.value:064x}"
