"""``[ingest]`` group commit keys (PROTOCOL §3.10): defaults, bounds, errors naming the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from config import SettingsError, load_settings
from config.ingest_settings import IngestSettings
from protocol.bundle import max_bundle_bytes


def load(tmp_path: Path, text: str) -> IngestSettings:
    path = tmp_path / "lm.toml"
    path.write_text(text, encoding="utf-8")
    return load_settings(path, environ={}).ingest


def test_bundle_defaults(tmp_path: Path) -> None:
    ingest = load(tmp_path, "")
    assert ingest.bundle is True
    assert (ingest.bundle_max_in_flight, ingest.bundle_max_bytes, ingest.bundle_max_frames) == (
        2,
        8 * 1024 * 1024,
        1000,
    )
    assert ingest.bundle_eager_frames == 8
    assert ingest.bundles_configured
    # §3.10: bundle_max_bytes + max_frame_bytes + 44 x bundle_max_frames + 12
    assert ingest.largest_raw_object_bytes() == 16 * 1024 * 1024 + 44_000 + 12
    assert ingest.largest_raw_object_bytes() == max_bundle_bytes(
        bundle_max_bytes=ingest.bundle_max_bytes,
        max_frame_bytes=ingest.max_frame_bytes,
        bundle_max_frames=ingest.bundle_max_frames,
    )


def test_bundle_false_writes_frame_blobs_and_spool_mode_bundles_too(tmp_path: Path) -> None:
    off = load(tmp_path, "[ingest]\nbundle = false\n")
    assert not off.bundles_configured
    assert off.largest_raw_object_bytes() == off.max_frame_bytes
    assert load(tmp_path, '[ingest]\nacceptance = "local_spool"\n').bundles_configured


@pytest.mark.parametrize(
    ("line", "key"),
    [
        ("bundle_max_in_flight = 0", "ingest.bundle_max_in_flight"),
        ("bundle_max_bytes = 0", "ingest.bundle_max_bytes"),
        ("bundle_max_frames = 0", "ingest.bundle_max_frames"),
        ("bundle_eager_frames = 1", "ingest.bundle_eager_frames"),
        ("bundle_eager_frames = -1", "ingest.bundle_eager_frames"),
        ('bundle = "sometimes"', "ingest.bundle"),
        ("bundle_max_bytes = 6_000_000_000", "ingest.bundle_max_bytes"),
    ],
)
def test_bad_bundle_values_name_their_key(tmp_path: Path, line: str, key: str) -> None:
    with pytest.raises(SettingsError) as exc:
        load(tmp_path, f"[ingest]\n{line}\n")
    assert exc.value.problems[0].key == key


def test_bundle_eager_frames_zero_keeps_the_slots_alone(tmp_path: Path) -> None:
    assert load(tmp_path, "[ingest]\nbundle_eager_frames = 0\n").bundle_eager_frames == 0
    assert load(tmp_path, "[ingest]\nbundle_eager_frames = 2\n").bundle_eager_frames == 2
