from __future__ import annotations

import hashlib
import math

import pytest

from agent.load import LoadSpec, SyntheticLoad
from agent.truth import BatchKind
from protocol.frame import decode_frame

SPEC = LoadSpec(
    agents=3, batches=4, points_per_batch=50, duplicate_rate=0.5, conflict_rate=0.5, seed=42
)


def test_same_seed_same_bytes_other_seed_other_bytes():
    first = [p.frame for p in SyntheticLoad(SPEC).originals()]
    second = [p.frame for p in SyntheticLoad(SPEC).originals()]
    assert first == second and len(first) == SPEC.total_batches
    other = [p.frame for p in SyntheticLoad(LoadSpec(**{**_fields(SPEC), "seed": 43})).originals()]
    assert not set(first) & set(other)


def test_frames_carry_the_planned_identity_and_truth():
    seen = set()
    for planned in SyntheticLoad(SPEC).originals():
        frame = decode_frame(planned.frame)
        identity = planned.identity
        assert (frame.agent_id, frame.boot_id, frame.seq_start, frame.seq_end) == (
            identity.agent_id,
            identity.boot_id,
            identity.seq_start,
            identity.seq_end,
        )
        assert planned.frame_sha256 == hashlib.sha256(planned.frame).hexdigest()
        values = frame.points.column("value").to_pylist()
        assert planned.point_count == len(values) == SPEC.points_per_batch
        assert planned.value_sum == math.fsum(values)
        assert identity not in seen
        seen.add(identity)
    boots = {(i.agent_id, i.boot_id) for i in seen}
    assert len(boots) == SPEC.agents  # one boot per agent, stable across batches


def test_points_look_like_metrics():
    planned = SyntheticLoad(SPEC).original(1, 2)
    points = decode_frame(planned.frame).points
    metrics = set(points.column("metric").to_pylist())
    assert metrics <= {
        "cpu_usage_percent",
        "memory_used_bytes",
        "http_requests_total",
        "disk_written_bytes_total",
    }
    for labels in points.column("labels").to_pylist():
        keys = dict(labels)
        assert keys["host"] == "host-0001" and keys["region"]
    ts = points.column("ts").cast("int64").to_pylist()
    assert ts == sorted(ts) and len(set(ts)) == len(ts)


def test_duplicate_is_byte_identical():
    load = SyntheticLoad(SPEC)
    original = load.original(0, 0)
    duplicate = load.duplicate_of(original)
    assert duplicate.kind is BatchKind.DUPLICATE
    assert duplicate.frame == original.frame
    assert duplicate.frame_sha256 == original.frame_sha256
    assert duplicate.identity == original.identity


def test_conflict_shares_identity_with_other_content():
    load = SyntheticLoad(SPEC)
    original = load.original(2, 3)
    conflict = load.conflict_of(original)
    assert conflict.kind is BatchKind.CONFLICT
    assert conflict.identity == original.identity
    assert conflict.frame_sha256 != original.frame_sha256
    decoded = decode_frame(conflict.frame)
    assert (decoded.agent_id, decoded.boot_id, decoded.seq_start, decoded.seq_end) == (
        original.identity.agent_id,
        original.identity.boot_id,
        original.identity.seq_start,
        original.identity.seq_end,
    )
    assert load.conflict_of(original).frame == conflict.frame  # deterministic too


@pytest.mark.parametrize(("rate", "expected"), [(0.0, 0), (1.0, 12)])
def test_rates_decide_followups(rate: float, expected: int):
    spec = LoadSpec(
        agents=3, batches=4, points_per_batch=5, duplicate_rate=rate, conflict_rate=rate, seed=1
    )
    load = SyntheticLoad(spec)
    originals = list(load.originals())
    assert sum(p.want_duplicate for p in originals) == expected
    assert sum(p.want_conflict for p in originals) == expected
    followups = [f for p in originals for f in load.followups(p)]
    assert len(followups) == 2 * expected


def test_plan_does_not_depend_on_points_per_batch():
    small = LoadSpec(**{**_fields(SPEC), "points_per_batch": 3})
    flags = [(p.want_duplicate, p.want_conflict) for p in SyntheticLoad(SPEC).originals()]
    assert flags == [(p.want_duplicate, p.want_conflict) for p in SyntheticLoad(small).originals()]
    assert 0 < sum(d for d, _ in flags) < len(flags)


def test_spec_validation():
    with pytest.raises(ValueError, match="duplicate_rate"):
        LoadSpec(duplicate_rate=1.5)
    with pytest.raises(ValueError):
        LoadSpec(points_per_batch=0)


def _fields(spec: LoadSpec) -> dict:
    return {name: getattr(spec, name) for name in spec.__dataclass_fields__}
