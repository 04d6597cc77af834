"""Batch identities in keys: part of `protocol.keys` (import these names from there).

Split out of ``keys.py`` to keep modules small, as ``_points_check.py`` is for
``frame.py``: everything here is about how an identity appears in a key or name.

**The segment rule** (PROTOCOL §3): no key segment, and no file name derived from an
identity, exceeds `SEGMENT_MAX_BYTES`. Where ``agent=<agent-hex>`` would make its segment
longer (an agent_id of 128 bytes is 256 hex digits), the segment holds
``agent=h-<sha256 of the UTF-8 agent_id>`` instead. The form is chosen per segment: the
``agent=...`` directory of ``accepted/v1/``, ``quarantine/v1/`` and the by-blob entries
switches at 125 bytes, the one-segment names (``accepted-by-time`` entries, spool files)
sooner, by the length of what follows the agent in them (`identity_name`).

Consequences, all handled here:

- A key in the ``h-`` form does not say which agent it is about: parsers return a
  `KeyIdentity` (the agent's SHA-256, boot_id, seq range, and the agent_id only when the
  key spells it). Two keys of one batch in either form give equal `KeyIdentity` values;
  `identity_matches_key` checks a record's identity against its key (a well-formed
  record, PROTOCOL §3.7, has an identity equal to its key in either form).
- Stores written before the rule may hold the long form where the rule now says ``h-``
  (S3 has no segment limit): readers accept both forms; `legacy_accepted_manifest_key`
  and `legacy_quarantine_key` name the long form a writer must look for first. That
  read covers records already written, not a collector of before the rule still
  running: with agent_ids over 124 bytes, replace all collectors of one store at once.
- ``manifest_id`` (the rollup ledger's batch name and the setsum's input, PROTOCOL §4) is
  not a key segment and always spells the agent in hex: ledgers written before the rule
  stay valid, and it can be recomputed from any record body. `parse_manifest_id` turns it
  into the `KeyIdentity` a listed key is compared with.
"""

from __future__ import annotations

import hashlib
import re
import uuid
from dataclasses import dataclass, field

MAX_U64 = 2**64 - 1
SEGMENT_MAX_BYTES = 255
"""The longest key segment or identity-derived file name (PROTOCOL §3; NAME_MAX on POSIX)."""
AGENT_DIGEST_MARK = "h-"
"""``agent=h-<sha256>``: the agent segment of an agent_id too long to spell in hex."""

SHA_RE = re.compile(r"[0-9a-f]{64}")
AGENT_RE = r"agent=((?:[0-9a-f]{2})+|h-[0-9a-f]{64})"
IDENTITY_RE = rf"{AGENT_RE}/boot=([0-9a-f]{{32}})/(\d{{20}})-(\d{{20}})"
"""``agent=.../boot=.../<seq>-<seq>``: four groups for `key_identity_from_groups`."""
NAME_RE = rf"{AGENT_RE}\.boot=([0-9a-f]{{32}})\.(\d{{20}})-(\d{{20}})"


class KeyFormatError(ValueError):
    """A key (or a part of one) does not follow PROTOCOL §3."""


def check_sha256(sha: str) -> str:
    """Return ``sha`` if it is 64 lowercase hex digits, else raise `KeyFormatError`."""
    if not SHA_RE.fullmatch(sha):
        raise KeyFormatError(f"frame_sha256 must be 64 lowercase hex digits, got {sha!r}")
    return sha


def _check_boot_and_range(boot_id: uuid.UUID, seq_start: int, seq_end: int) -> None:
    if boot_id.int == 0:
        raise KeyFormatError("boot_id must not be all zero")
    if not 0 <= seq_start <= seq_end <= MAX_U64:
        raise KeyFormatError(
            f"need 0 <= seq_start <= seq_end <= 2^64-1, got {seq_start}..{seq_end}"
        )


@dataclass(frozen=True, slots=True)
class BatchIdentity:
    """``(agent_id, boot_id, seq_start, seq_end)``: what a batch is, across retries."""

    agent_id: str
    boot_id: uuid.UUID
    seq_start: int
    seq_end: int

    def __post_init__(self) -> None:
        agent_bytes = self.agent_id.encode("utf-8")
        if not 1 <= len(agent_bytes) <= 128:
            raise KeyFormatError(f"agent_id must be 1..128 UTF-8 bytes, got {len(agent_bytes)}")
        _check_boot_and_range(self.boot_id, self.seq_start, self.seq_end)

    @property
    def agent_hex(self) -> str:
        return self.agent_id.encode("utf-8").hex()

    @property
    def agent_sha256(self) -> str:
        return hashlib.sha256(self.agent_id.encode("utf-8")).hexdigest()

    @property
    def boot_hex(self) -> str:
        return self.boot_id.bytes.hex()

    @property
    def seq_range(self) -> str:
        return f"{self.seq_start:020d}-{self.seq_end:020d}"

    @property
    def path(self) -> str:
        """``agent=<agent-hex>/boot=<boot-hex>/<seq-start>-<seq-end>``, the shared key tail,
        with ``agent=h-<sha256>`` where the hex would exceed a segment (PROTOCOL §3)."""
        return self._path(agent_segment(self.agent_id, 0))

    @property
    def legacy_path(self) -> str | None:
        """The long form of `path` where `path` uses ``h-`` (stores written before the
        segment rule may hold it), else ``None``."""
        long_form = long_agent_segment(self.agent_id)
        return self._path(long_form) if agent_segment(self.agent_id, 0) != long_form else None

    def _path(self, agent: str) -> str:
        return f"{agent}/boot={self.boot_hex}/{self.seq_range}"

    @property
    def manifest_id(self) -> str:
        """``agent=<agent-hex>.boot=<boot-hex>.<seq-start>-<seq-end>`` (PROTOCOL §3), always
        with the agent in hex: the rollup ledger's name of the batch, never a key segment
        (`identity_name` is the one-segment name that keeps the segment rule)."""
        return f"{long_agent_segment(self.agent_id)}.boot={self.boot_hex}.{self.seq_range}"

    @property
    def key_identity(self) -> KeyIdentity:
        return KeyIdentity(
            self.agent_sha256, self.boot_id, self.seq_start, self.seq_end, self.agent_id
        )

    def __str__(self) -> str:
        return f"{self.agent_id}/{self.boot_id}/{self.seq_start}-{self.seq_end}"


@dataclass(frozen=True, slots=True)
class KeyIdentity:
    """The batch identity a key (or an identity-derived name) names.

    The agent is spelled in hex (then ``agent_id`` is set) or as ``h-<sha256>`` (then
    ``agent_id`` is ``None``: only the record's body says who the agent is). Equality and
    hashing use ``agent_sha256``, ``boot_id`` and the range only, so the two forms of one
    batch compare equal; compare a record's identity with `identity_matches_key`.
    """

    agent_sha256: str
    boot_id: uuid.UUID
    seq_start: int
    seq_end: int
    agent_id: str | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        check_sha256(self.agent_sha256)
        _check_boot_and_range(self.boot_id, self.seq_start, self.seq_end)

    @property
    def identity(self) -> BatchIdentity | None:
        """The whole identity, when the key spelled the agent in hex."""
        if self.agent_id is None:
            return None
        return BatchIdentity(self.agent_id, self.boot_id, self.seq_start, self.seq_end)

    def __str__(self) -> str:
        agent = self.agent_id if self.agent_id is not None else f"h-{self.agent_sha256}"
        return f"{agent}/{self.boot_id}/{self.seq_start}-{self.seq_end}"


def identity_matches_key(identity: BatchIdentity, named: KeyIdentity) -> bool:
    """Whether ``identity`` (from a record body or a frame) is the one ``named`` by a key,
    in either agent form."""
    return identity.key_identity == named


def identity_name(identity: BatchIdentity, tail: str) -> str:
    """``<agent>.boot=<boot-hex>.<seq-start>-<seq-end><tail>``: the one-segment name of a
    batch (accepted-by-time entries, spool files), within `SEGMENT_MAX_BYTES` whatever the
    agent_id: ``agent=h-<sha256>`` where the hex would not fit. Raises `KeyFormatError`
    when ``tail`` leaves no room even for that."""
    rest = f".boot={identity.boot_hex}.{identity.seq_range}{tail}"
    name = agent_segment(identity.agent_id, len(rest.encode("utf-8"))) + rest
    if len(name.encode("utf-8")) > SEGMENT_MAX_BYTES:
        raise KeyFormatError(f"a name ending in {tail!r} exceeds {SEGMENT_MAX_BYTES} bytes")
    return name


def parse_identity_name(name: str, tail_pattern: str = "") -> tuple[KeyIdentity, tuple[str, ...]]:
    """Parse `identity_name` output: the identity and the groups of ``tail_pattern`` (a
    regular expression matched against the rest)."""
    match = re.fullmatch(NAME_RE + tail_pattern, name)
    if not match:
        raise KeyFormatError(f"not an identity name: {name!r}")
    return key_identity_from_groups(match.groups()[:4], name), match.groups()[4:]


def parse_manifest_id(manifest_id: str) -> KeyIdentity:
    """The identity a rollup ledger's ``manifest_id`` names (either agent form)."""
    return parse_identity_name(manifest_id)[0]


def long_agent_segment(agent_id: str) -> str:
    """``agent=<agent-hex>``."""
    return f"agent={agent_id.encode('utf-8').hex()}"


def agent_segment(agent_id: str, rest_bytes: int) -> str:
    """The agent's part of a segment that holds ``rest_bytes`` more bytes (PROTOCOL §3)."""
    long_form = long_agent_segment(agent_id)
    if len(long_form) + rest_bytes <= SEGMENT_MAX_BYTES:
        return long_form
    digest = hashlib.sha256(agent_id.encode("utf-8")).hexdigest()
    return f"agent={AGENT_DIGEST_MARK}{digest}"


def key_identity_from_groups(groups: tuple[str, ...], key: str) -> KeyIdentity:
    """The `KeyIdentity` of the four groups of `IDENTITY_RE` or `NAME_RE` in ``key``."""
    agent_text, boot_hex, start, end = groups
    try:
        boot_id = uuid.UUID(bytes=bytes.fromhex(boot_hex))
        if agent_text.startswith(AGENT_DIGEST_MARK):
            digest = agent_text[len(AGENT_DIGEST_MARK) :]
            return KeyIdentity(digest, boot_id, int(start), int(end))
        agent_id = bytes.fromhex(agent_text).decode("utf-8")
        return BatchIdentity(agent_id, boot_id, int(start), int(end)).key_identity
    except (UnicodeDecodeError, ValueError) as exc:
        raise KeyFormatError(f"bad identity in key {key!r}: {exc}") from None
