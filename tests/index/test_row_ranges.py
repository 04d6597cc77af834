"""Well-formed raw keys and ranges of index rows (PROTOCOL §3.7, §3.10): the column-wise
check (`index.row_checks.well_formed`) and the row's words (`index.rows.check_row`) agree
on every case of the table."""

from __future__ import annotations

import dataclasses
import hashlib
import uuid

import pytest

from index.row_checks import decode, well_formed
from index.rows import (
    IndexFileError,
    IndexRow,
    accepted_row,
    blob_row,
    check_row,
    encode,
    quarantine_row,
    table_of,
)
from protocol import keys
from protocol.records import AcceptedManifest, IdentityConflict

from .test_index_files import T0, conflict

BUNDLE_SHA = hashlib.sha256(b"a bundle").hexdigest()
BUNDLE = keys.raw_bundle_key(BUNDLE_SHA)


def bundled(seq: int = 1, offset: int = 0) -> AcceptedManifest:
    frame = f"frame {seq}".encode()
    return AcceptedManifest.of_frame(
        frame + bytes(100),
        accepted_at_unix_ns=T0,
        collector_id="c1",
        identity=keys.BatchIdentity("agent-a", uuid.UUID(int=7), seq, seq),
        frame_sha256=hashlib.sha256(frame).hexdigest(),
        bundle=(BUNDLE, offset),
    )


def _accepted(**changes: object) -> IndexRow:
    return dataclasses.replace(accepted_row(bundled()), **changes)  # type: ignore[arg-type]


def _blob_accepted(**changes: object) -> IndexRow:
    row = _accepted(raw_offset=None, raw_length=None)
    fields: dict[str, object] = {"raw_blob_key": keys.raw_blob_key(row.frame_sha256), **changes}
    return dataclasses.replace(row, **fields)  # type: ignore[arg-type]


def _quarantine(**changes: object) -> IndexRow:
    return dataclasses.replace(quarantine_row(conflict(1)), **changes)  # type: ignore[arg-type]


CASES: list[tuple[str, IndexRow, bool]] = [
    ("frame blob, no range", _blob_accepted(), True),
    ("bundle with its range", _accepted(), True),
    ("bundle at a later offset", _accepted(raw_offset=10_000), True),
    (
        "frame blob with a range",
        _blob_accepted(raw_offset=0, raw_length=_accepted().frame_bytes),
        False,
    ),
    ("bundle without a range", _accepted(raw_offset=None, raw_length=None), False),
    ("bundle with an offset only", _accepted(raw_length=None), False),
    ("bundle with a length only", _accepted(raw_offset=None), False),
    ("negative offset", _accepted(raw_offset=-1), False),
    ("length other than frame_bytes", _accepted(raw_length=_accepted().frame_bytes + 1), False),
    ("length shorter than a frame", _accepted(raw_length=55, frame_bytes=55), False),
    ("length past any max_frame_bytes", _accepted(raw_length=2**32, frame_bytes=2**32), False),
    (
        "bundle key of a bad folder",
        _accepted(raw_blob_key=BUNDLE.replace("/sha256/", "/sha256/00/", 1)),
        False,
    ),
    (
        "bundle key whose folders are not its hash",
        _accepted(raw_blob_key=keys.RAW_BUNDLES_PREFIX + "ff/ff/" + BUNDLE_SHA + ".lmbundle"),
        BUNDLE_SHA.startswith("ffff"),
    ),
    (
        "bundle key with a frame blob's suffix",
        _accepted(raw_blob_key=BUNDLE.replace(".lmbundle", ".lmbatch")),
        False,
    ),
    ("another frame's blob", _blob_accepted(raw_blob_key=keys.raw_blob_key("ab" * 32)), False),
    ("quarantine of frame blobs", _quarantine(), True),
    (
        "quarantine naming a bundle with a range",
        _quarantine(raw_blob_key=BUNDLE, raw_offset=0, raw_length=100, frame_bytes=100),
        False,
    ),
    (
        "quarantine with a range on its frame blob",
        _quarantine(raw_offset=0, raw_length=100, frame_bytes=100),
        False,
    ),
    ("retracted copy of a bundled row", _accepted(kind="retracted"), True),
    ("blob row of a frame blob", blob_row(BUNDLE_SHA, T0), True),
    ("blob row of a bundle", blob_row(BUNDLE_SHA, T0, bundle=True), True),
    (
        "blob row of another bundle",
        dataclasses.replace(blob_row("ab" * 32, T0), key=BUNDLE),
        False,
    ),
    (
        "retracted copy of a quarantine naming a bundle",
        _quarantine(
            kind="retracted", raw_blob_key=BUNDLE, raw_offset=0, raw_length=100, frame_bytes=100
        ),
        False,
    ),
]


@pytest.mark.parametrize(("name", "row", "expected"), CASES, ids=[c[0] for c in CASES])
def test_raw_key_and_range_well_formedness(name: str, row: IndexRow, expected: bool) -> None:
    assert well_formed(table_of([row])).to_pylist() == [expected], name
    if expected:
        check_row(row, source="t")
    else:
        with pytest.raises(IndexFileError):
            check_row(row, source="t")


def test_bundled_and_frame_blob_rows_decode_together() -> None:
    rows = [_blob_accepted(), _accepted(), _quarantine()]
    assert decode(encode(rows), source="t") == rows
    assert isinstance(conflict(1), IdentityConflict)
