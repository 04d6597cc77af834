"""The ledger's retracted part (PROTOCOL §3.7 "Retraction", §4.1): a retraction moves an
included batch's digest from its hour's totals to ``retracted`` and a later inclusion of
the same batch moves it back, each in one commit; the JSON round-trips. Which part of an
hour a batch leaves (``late_excluded`` or not) is found from the setsums."""

from __future__ import annotations

from dataclasses import replace

import pytest

from protocol import keys
from protocol.setsum import Setsum
from rollup.table.ledger_retracted import MAX_LATE_SEARCH, RetractedBatch, in_late_part
from rollup.table.manifest import Changes, LedgerHour, RollupInvariantError
from rollup.table.manifest_codec import snapshot_from_json
from tests.rollup.dataset_builder import BOOT
from tests.rollup.test_manifest import LEDGER_1, first, second

HOUR = "2026-11-21T10"
PHANTOM = keys.BatchIdentity("agent-a", BOOT, 0, 9).manifest_id
REAL = keys.BatchIdentity("agent-a", BOOT, 10, 19).manifest_id
LEDGER_2 = "rollup/v1/ledger/date=2026-11-21/hour=10/l2.parquet"
LEDGER_3 = "rollup/v1/ledger/date=2026-11-21/hour=10/l3.parquet"


def both() -> LedgerHour:
    total = Setsum.of([(PHANTOM, "b" * 64), (REAL, "c" * 64)])
    return LedgerHour(2, 20, total.hex)


def only_real() -> LedgerHour:
    return LedgerHour(1, 10, Setsum.of([(REAL, "c" * 64)]).hex)


def test_retract_then_restore_moves_the_digest_and_round_trips() -> None:
    one = first()
    two = second(
        one,
        Changes(added_ledger_files=(LEDGER_2,), ledger_delta={HOUR: both()}),
    )
    phantom = RetractedBatch(PHANTOM, "b" * 64, 10, HOUR)
    three = second(
        two,
        Changes(
            added_ledger_files=(LEDGER_3,),
            removed_ledger_files=(LEDGER_2,),
            added_retracted=(phantom,),
        ),
        commit_id="c-3",
    )
    assert three.ledger_hours[HOUR] == one.ledger_hours[HOUR] + only_real()
    assert three.retracted_hours[HOUR] == phantom.totals
    assert three.ledger_retracted == (replace(phantom, added_version=3),)
    assert snapshot_from_json(three.to_json()) == three
    # Retracting it again without a restore would take its digest out twice.
    with pytest.raises(RollupInvariantError, match="already retracted"):
        second(
            three,
            Changes(added_ledger_files=(LEDGER_2 + "x.parquet",), added_retracted=(phantom,)),
            commit_id="c-4",
        )
    back = LedgerHour(1, 10, Setsum.of([(PHANTOM, "b" * 64)]).hex)
    four = second(
        three,
        Changes(
            added_ledger_files=("rollup/v1/ledger/date=2026-11-21/hour=10/l4.parquet",),
            ledger_delta={HOUR: back},
            restored=((HOUR, PHANTOM),),
        ),
        commit_id="c-4",
    )
    assert four.ledger_hours[HOUR] == two.ledger_hours[HOUR]
    assert four.ledger_retracted == ()
    assert "retracted" not in snapshot_from_json(four.to_json()).to_json().decode()


def test_a_retraction_needs_its_hour_rewritten_and_a_restore_needs_an_inclusion() -> None:
    one = first()
    phantom = RetractedBatch(PHANTOM, "b" * 64, 10, HOUR)
    with pytest.raises(RollupInvariantError, match="no rewritten ledger file"):
        second(one, Changes(added_retracted=(phantom,)))
    bigger = replace(phantom, record_count=11)  # more than the hour holds
    with pytest.raises(RollupInvariantError, match="cannot remove"):
        second(one, Changes(added_ledger_files=(LEDGER_3,), added_retracted=(bigger,)))
    with pytest.raises(RollupInvariantError, match="is not retracted"):
        second(one, Changes(restored=((HOUR, PHANTOM),)))
    assert LEDGER_1 in one.ledger_files


def _batches(count: int) -> list[tuple[str, str]]:
    return [
        (keys.BatchIdentity("agent-r", BOOT, 10 * i, 10 * i + 9).manifest_id, f"{i:064x}")
        for i in range(count)
    ]


def _totals(batches: list[tuple[str, str]]) -> LedgerHour:
    return LedgerHour(len(batches), 10 * len(batches), Setsum.of(batches).hex)


@pytest.mark.parametrize(
    ("late", "on_time"), [(0, 4), (1, 5), (2, 6), (3, 40), (40, 3), (6, 0), (4, 4)]
)
def test_which_batches_are_in_the_late_part_is_found_from_the_setsums(
    late: int, on_time: int
) -> None:
    batches = _batches(late + on_time)
    late_part, hour = _totals(batches[:late]), _totals(batches)
    found = [in_late_part(late_part, hour, b, [o for o in batches if o != b]) for b in batches]
    if min(late, on_time) - 1 > MAX_LATE_SEARCH:
        assert set(found) == {None}  # the caller attributes it to the included totals
    else:
        assert found == [True] * late + [False] * on_time
