"""Snapshot JSON (exactly the PROTOCOL §4 shape) and the invariants of `apply`."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest

from protocol import keys
from protocol.setsum import Setsum
from rollup.table.manifest import (
    Changes,
    DataFile,
    LedgerHour,
    RollupInvariantError,
    RollupManifestError,
    Snapshot,
    format_created_at,
    parse_created_at,
)
from rollup.table.manifest_codec import snapshot_from_json
from rollup.table.schemas import (
    POINTS_SCHEMA,
    ROLLUP_1M_SCHEMA,
    SERIES_DAY_SCHEMA,
    SERIES_SCHEMA,
    columns_json,
)
from rollup.table.transition import apply
from tests.rollup.dataset_builder import BASE_HOUR

CREATED = "2026-11-21T10:00:00Z"
LEDGER_1 = "rollup/v1/ledger/date=2026-11-21/hour=10/l1.parquet"
SUM_1 = Setsum.of([("m1", "a" * 64)]).hex


def data_file(name: str, *, version: int = 1, table: str = "points", hour: int = 0) -> DataFile:
    partition = BASE_HOUR.shifted(hour)
    return DataFile(
        path=keys.rollup_data_key(table, partition, name),
        table=table,
        partition=partition,
        row_count=1000,
        size_bytes=5000,
        min={"ts": "2026-11-21T10:00:00.000000Z", "value": 1.5},
        max={"ts": "2026-11-21T10:59:59.000000Z", "value": 9.0},
        added_version=version,
    )


def first(**overrides: Any) -> Snapshot:
    changes = Changes(
        added_files=(data_file("x"),),
        added_ledger_files=(LEDGER_1,),
        ledger_delta={"2026-11-21T10": LedgerHour(1, 10, SUM_1)},
    )
    arguments: dict[str, Any] = {
        "version": 1,
        "commit_id": "c-1",
        "owner_epoch": 3,
        "created_at": CREATED,
        "manifest_key_of_base": None,
    }
    arguments.update(overrides)
    return apply(None, changes, **arguments)


def second(base: Snapshot, changes: Changes, **overrides: Any) -> Snapshot:
    arguments: dict[str, Any] = {
        "version": base.version + 1,
        "commit_id": "c-2",
        "owner_epoch": base.owner_epoch,
        "created_at": CREATED,
        "manifest_key_of_base": base.manifest_key,
    }
    arguments.update(overrides)
    return apply(base, changes, **arguments)


def test_json_is_exactly_the_protocol_shape() -> None:
    document = json.loads(first().to_json())
    assert document == {
        "schema": "lightmetrics.rollup_manifest.v1",
        "version": 1,
        "previous_manifest_key": None,
        "created_at": CREATED,
        "owner_epoch": 3,
        "commit_id": "c-1",
        "tables": {
            "points": {
                "columns": columns_json(POINTS_SCHEMA),
                "data_files": [
                    {
                        "path": "rollup/v1/tables/points/date=2026-11-21/hour=10/x.parquet",
                        "partition": {"date": "2026-11-21", "hour": 10},
                        "row_count": 1000,
                        "size_bytes": 5000,
                        "min": {"ts": "2026-11-21T10:00:00.000000Z", "value": 1.5},
                        "max": {"ts": "2026-11-21T10:59:59.000000Z", "value": 9.0},
                        "added_version": 1,
                    }
                ],
            },
            "rollup_1m": {"columns": columns_json(ROLLUP_1M_SCHEMA), "data_files": []},
            "series": {"columns": columns_json(SERIES_SCHEMA), "data_files": []},
            "series_day": {"columns": columns_json(SERIES_DAY_SCHEMA), "data_files": []},
        },
        "tombstones": [],
        "removed_files": [],
        "ledger": {
            "files": [LEDGER_1],
            "hours": {"2026-11-21T10": {"batches": 1, "records": 10, "setsum": SUM_1}},
        },
    }
    assert list(document) == [
        "schema",
        "version",
        "previous_manifest_key",
        "created_at",
        "owner_epoch",
        "commit_id",
        "tables",
        "tombstones",
        "removed_files",
        "ledger",
    ]
    assert columns_json(POINTS_SCHEMA)[0] == {"name": "ts", "type": "timestamp[us, tz=UTC]"}
    assert {"name": "labels", "type": "map<string, string>"} in columns_json(POINTS_SCHEMA)
    assert [c["name"] for c in columns_json(SERIES_SCHEMA)] == [
        "hour_start", "series", "metric", "labels", "presented_name", "presented_labels",
        "count", "first_ts", "last_ts",
    ]  # fmt: skip
    assert columns_json(SERIES_DAY_SCHEMA)[0] == {
        "name": "day_start",
        "type": "timestamp[us, tz=UTC]",
    }
    assert columns_json(SERIES_DAY_SCHEMA)[1:] == columns_json(SERIES_SCHEMA)[1:]


def test_round_trip() -> None:
    one = first()
    two = second(
        one,
        Changes(
            added_files=(data_file("y", version=2, table="rollup_1m", hour=1),),
            removed_files=(one.data_files("points")[0].path,),
        ),
    )
    for snapshot in (one, two):
        assert snapshot_from_json(snapshot.to_json()) == snapshot
        assert snapshot_from_json(snapshot.to_json().decode()).to_json() == snapshot.to_json()
    assert two.manifest_key == "rollup/v1/manifests/v00000000000000000002-c-2.json"


@pytest.mark.parametrize(
    ("mutate", "problem"),
    [
        (lambda d: d.update(schema="other"), "schema must be"),
        (lambda d: d.update(version=0), "inconsistent"),
        (lambda d: d.update(previous_manifest_key="rollup/v1/manifests/x.json"), "inconsistent"),
        (lambda d: d.pop("ledger"), "missing 'ledger'"),
        (lambda d: d.update(created_at="yesterday"), "created_at"),
        (lambda d: d.update(owner_epoch=True), "owner_epoch"),
        (lambda d: d["ledger"]["hours"]["2026-11-21T10"].update(setsum="xyz"), "setsum"),
        (
            lambda d: d["tables"]["points"]["data_files"][0]["partition"].update(hour=11),
            "not in partition",
        ),
        (lambda d: d["tables"]["points"]["data_files"][0].update(row_count=-1), "negative"),
        (lambda d: d["tables"]["points"].pop("columns"), "missing 'columns'"),
    ],
)
def test_from_json_names_the_problem(mutate: Any, problem: str) -> None:
    document = json.loads(first().to_json())
    mutate(document)
    with pytest.raises(RollupManifestError, match=problem):
        snapshot_from_json(json.dumps(document))


def test_from_json_refuses_garbage() -> None:
    for garbage in (b"", b"[]", b"{", b'{"schema": "lightmetrics.rollup_manifest.v1"}'):
        with pytest.raises(RollupManifestError):
            snapshot_from_json(garbage)


def test_unknown_fields_are_ignored() -> None:
    document = json.loads(first().to_json())
    document["future_field"] = {"anything": 1}
    assert snapshot_from_json(json.dumps(document)) == first()


def test_apply_adds_removes_and_accumulates_the_ledger() -> None:
    one = first()
    removed = one.data_files("points")[0].path
    delta = {
        "2026-11-21T10": LedgerHour(2, 20, Setsum.of([("m2", "b" * 64), ("m3", "c" * 64)]).hex),
        "2026-11-21T11": LedgerHour(1, 5, Setsum.of([("m4", "d" * 64)]).hex),
    }
    two = second(
        one,
        Changes(
            added_files=(data_file("y", version=2), data_file("z", version=2, table="rollup_1m")),
            removed_files=(removed,),
            added_ledger_files=("rollup/v1/ledger/date=2026-11-21/hour=10/l2.parquet",),
            ledger_delta=delta,
        ),
    )
    assert [f.path.rsplit("/", 1)[1] for f in two.data_files("points")] == ["y.parquet"]
    assert len(two.data_files("rollup_1m")) == 1
    assert two.removed_files == (removed,)
    assert two.previous_manifest_key == one.manifest_key
    assert two.ledger_files == (LEDGER_1, "rollup/v1/ledger/date=2026-11-21/hour=10/l2.parquet")
    expected = Setsum.of([("m1", "a" * 64), ("m2", "b" * 64), ("m3", "c" * 64)]).hex
    assert two.ledger_hours["2026-11-21T10"] == LedgerHour(3, 30, expected)
    assert two.ledger_hours["2026-11-21T11"].batches == 1
    assert one.data_files("points")[0].path == removed  # the base is untouched
    assert removed not in two.reachable_keys() and removed in one.reachable_keys()
    three = second(
        two, Changes(), version=3, commit_id="c-3", manifest_key_of_base=two.manifest_key
    )
    assert three.removed_files == ()  # removed files are per commit, not carried forward


@pytest.mark.parametrize(
    ("changes", "overrides", "problem"),
    [
        (Changes(), {"version": 3}, "expected version 2, found 3"),
        (Changes(), {"version": 1}, "expected version 2, found 1"),
        (
            Changes(),
            {"manifest_key_of_base": "rollup/v1/manifests/other.json"},
            "base manifest key",
        ),
        (Changes(), {"owner_epoch": 2}, "owner epoch 2 is older than the base's epoch 3"),
        (Changes(), {"commit_id": "has/slash"}, "commit id"),
        (Changes(), {"created_at": "2026-11-21 10:00"}, "created_at"),
        (
            Changes(removed_files=("rollup/v1/tables/points/nope.parquet",)),
            {},
            "not in base version 1",
        ),
        (Changes(added_files=(data_file("x", version=2),)), {}, "already in the base"),
        (Changes(added_files=(data_file("n", version=2), data_file("n", version=2))), {}, "twice"),
        (
            Changes(added_files=(data_file("n", version=1),)),
            {},
            "expected added_version 2, found 1",
        ),
        (
            Changes(added_files=(replace(data_file("n", version=2), partition=BASE_HOUR.next()),)),
            {},
            "is not under",
        ),
        (
            Changes(added_files=(replace(data_file("n", version=2), table="nope"),)),
            {},
            "unknown table",
        ),
        (Changes(added_ledger_files=(LEDGER_1,)), {}, "already in the base"),
        (Changes(added_ledger_files=("elsewhere/l.parquet",)), {}, "not under rollup/v1/ledger/"),
        (
            Changes(ledger_delta={"2026-11-21T10": LedgerHour(1, 1, SUM_1)}),
            {},
            "adds 1 batches but no ledger file",
        ),
        (
            Changes(
                added_ledger_files=("rollup/v1/ledger/a.parquet",),
                ledger_delta={"2026-11-21 10": LedgerHour(1, 1, SUM_1)},
            ),
            {},
            "ledger hour",
        ),
        (
            Changes(
                added_ledger_files=("rollup/v1/ledger/a.parquet",),
                ledger_delta={"2026-11-21T10": LedgerHour(1, 1, "ABC")},
            ),
            {},
            "setsum",
        ),
    ],
)
def test_apply_refuses_each_invariant_violation(
    changes: Changes, overrides: dict[str, Any], problem: str
) -> None:
    with pytest.raises(RollupInvariantError, match=problem):
        second(first(), changes, **overrides)


def test_first_version_rules() -> None:
    with pytest.raises(RollupInvariantError, match="expected version 1, found 2"):
        first(version=2)
    with pytest.raises(RollupInvariantError, match="version 1 has no base"):
        first(manifest_key_of_base="rollup/v1/manifests/x.json")


def test_created_at_format() -> None:
    text = format_created_at(BASE_HOUR.start_ns + 123_456_789)
    assert text == "2026-11-21T10:00:00Z"
    assert parse_created_at(text).timestamp() * 1e9 == BASE_HOUR.start_ns
    assert parse_created_at("2026-11-21T10:00:00.5Z").microsecond == 500_000


def test_a_tombstone_leaves_once_retention_dropped_its_range_from_every_table() -> None:
    """Issue 24 item 10: ``tombstones`` was cumulative. A tombstone whose range ends at
    or before every named table's retention cutoff can never match a row again: the
    commit that moves the cutoff past it drops it; the others stay."""
    from datetime import UTC, datetime

    from tests.rollup.test_delete import tombstone

    h12 = datetime(2026, 11, 21, 12, tzinfo=UTC)
    both = tombstone(id="00000000-0000-4000-8000-000000000001", end=h12)
    points_only = tombstone(id="00000000-0000-4000-8000-000000000002", end=h12, tables=("points",))
    later = tombstone(id="00000000-0000-4000-8000-000000000003", end=h12.replace(hour=14))
    v2 = second(first(), Changes(added_tombstones=(both, points_only, later)))
    assert len(v2.tombstones) == 3
    # Points retention alone past 12:00: only the points-only tombstone is fully applied.
    dropped = tuple(f.path for f in v2.data_files("points"))  # hour 10: before the cutoff
    v3 = second(v2, Changes(retention={"points": "2026-11-21T12"}, removed_files=dropped))
    assert [t.id for t in v3.tombstones] == [both.id, later.id]
    # rollup_1m's cutoff too: the one ending at 12:00 goes; the one ending at 14:00 stays.
    v4 = second(v3, Changes(retention={"points": "2026-11-21T13", "rollup_1m": "2026-11-21T12"}))
    assert [t.id for t in v4.tombstones] == [later.id]
    assert snapshot_from_json(v4.to_json()).tombstones == v4.tombstones
