"""The collector's feature gate (PROTOCOL §3.10 "Writing", `collector.server.Worker`): a
collector registers under its log writer id at start, and refuses to start (exit 2, naming
the feature and the record) when the store's feature record turns on a feature it does
not implement. Real ``lm-collector`` processes on a filesystem store."""

from __future__ import annotations

import json
from pathlib import Path

from protocol import keys
from protocol.records import VersionEntry
from tests.collector.conftest import CollectorLauncher, run_cli

RECORD = {"schema": "lightmetrics.features.v1", "written_by": "op", "written_at_unix_ns": 1}


def test_a_collector_registers_under_its_log_writer_id(
    collectors: CollectorLauncher, tmp_path: Path
) -> None:
    store_dir = tmp_path / "store"
    collector = collectors.start(store_url=f"file://{store_dir}", name="edge:1")
    entry_path = store_dir / keys.version_entry_key("collector", keys.index_writer_id("edge:1"))
    entry = VersionEntry.from_json(entry_path.read_bytes())  # written before it listened
    assert entry.reads_bundles
    collector.stop()
    assert entry_path.exists()  # a collector's entry stays: enable-bundles matches its log


def test_serve_refuses_a_feature_it_does_not_implement(tmp_path: Path) -> None:
    store_dir = tmp_path / "store"
    record = store_dir / keys.INDEX_FEATURES_KEY
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({**RECORD, "bundles": True, "zstd_frames": True}))
    done = run_cli(
        ["serve"],
        {
            "LM_HTTP__PORT": "0",
            "LM_STORE__URL": f"file://{store_dir}",
            "LM_INGEST__PROBE_ON_START": "false",
        },
        tmp_path,
        timeout_s=60,
    )
    assert done.returncode == 2, done
    assert "'zstd_frames'" in done.stderr and keys.INDEX_FEATURES_KEY in done.stderr
    assert not (store_dir / keys.INDEX_VERSIONS_PREFIX).exists()  # refused before registering
