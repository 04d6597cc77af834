"""``lm-rollup verify`` in the version registry (PROTOCOL §3.10 "Writing"): it registers
for its run (and leaves), and refuses a feature this version does not implement. The
console entry in process, on a filesystem store (no Spark)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from protocol import keys
from rollup.__main__ import main

RECORD = {"schema": "lightmetrics.features.v1", "written_by": "op", "written_at_unix_ns": 1}


@pytest.fixture
def store_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LM_STORE__URL", f"file://{tmp_path}")
    return tmp_path


def test_verify_registers_for_its_run(
    store_dir: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    seen: list[list[str]] = []
    from rollup.read import verify as verify_mod

    real = verify_mod.verify

    async def spying(*args: object, **kwargs: object) -> object:
        versions = store_dir / keys.INDEX_VERSIONS_PREFIX
        seen.append(sorted(p.name for p in versions.iterdir()))
        return await real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(verify_mod, "verify", spying)
    assert main(["verify"]) == 0
    assert len(seen) == 1 and len(seen[0]) == 1 and seen[0][0].startswith("rollup-verify-")
    versions = store_dir / keys.INDEX_VERSIONS_PREFIX
    assert not versions.exists() or list(versions.iterdir()) == []  # left when done


def test_verify_refuses_a_feature_it_does_not_implement(
    store_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    record = store_dir / keys.INDEX_FEATURES_KEY
    record.parent.mkdir(parents=True)
    record.write_text(json.dumps({**RECORD, "bundles": True, "later": True}))
    assert main(["verify"]) == 2
    error = capsys.readouterr().err
    assert "'later'" in error and keys.INDEX_FEATURES_KEY in error
