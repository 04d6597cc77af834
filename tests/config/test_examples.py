"""Every example file in config/examples loads."""

from __future__ import annotations

from pathlib import Path

import pytest

import config
from config import S3Location, load_settings, load_tokens

EXAMPLES = Path(config.__file__).parent / "examples"
SETTINGS_EXAMPLES = sorted(p for p in EXAMPLES.glob("*.toml") if p.name != "tokens.toml")


def test_examples_exist() -> None:
    names = {p.name for p in SETTINGS_EXAMPLES}
    assert names == {
        "agent.toml",
        "collector.toml",
        "collector-s3.toml",
        "reconciler.toml",
        "rollup.toml",
    }


@pytest.mark.parametrize("path", SETTINGS_EXAMPLES, ids=lambda p: p.name)
def test_settings_example_loads(path: Path) -> None:
    load_settings(path, environ={})


def test_s3_example_points_at_a_bucket() -> None:
    settings = load_settings(EXAMPLES / "collector-s3.toml", environ={})
    assert isinstance(settings.store.location, S3Location)
    assert settings.store.endpoint_url is not None


def test_tokens_example_loads_and_admits_its_example_tokens() -> None:
    table = load_tokens(EXAMPLES / "tokens.toml")
    fleet = table.principal_for_token("example-token-DO-NOT-USE-0001")
    ops = table.principal_for_token("example-admin-token-DO-NOT-USE-0002")
    assert fleet is not None and fleet.may_write("example-42") and not fleet.admin
    assert ops is not None and ops.admin and not ops.may_read
    reader = table.principal_for_token("example-read-token-DO-NOT-USE-0003")
    assert reader is not None and reader.may_read and not reader.may_write("example-42")
