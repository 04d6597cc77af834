"""The memoized client sends what an unpatched client sends: same URL, same User-Agent,
same signed header names, request after request (store/s3_request_cache.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from aiobotocore.config import AioConfig
from aiobotocore.session import AioSession

from store import s3_request_cache
from store.s3_request_cache import speed_up_client


class _Captured(Exception):
    """Raised from before-send: the request is recorded and never sent."""


def _capture(seen: list[dict[str, Any]]) -> Any:
    def before_send(request: Any, **_: Any) -> None:
        headers = dict(request.headers.items())
        seen.append(
            {
                "url": request.url,
                "user_agent": headers.get("User-Agent"),
                "header_names": sorted(k.lower() for k in headers if k.lower() != "x-amz-date"),
            }
        )
        raise _Captured

    return before_send


async def _client(*, endpoint_url: str | None, patched: bool) -> AsyncIterator[Any]:
    config = AioConfig(
        region_name="eu-west-1",
        retries={"total_max_attempts": 1, "mode": "standard"},
        s3={"addressing_style": "path" if endpoint_url else "auto"},
        user_agent_extra="lightmetrics-ingest",
        signature_version="s3v4",
    )
    async with AioSession().create_client(
        "s3",
        region_name="eu-west-1",
        endpoint_url=endpoint_url,
        aws_access_key_id="AKIDEXAMPLE",
        aws_secret_access_key="secret",
        config=config,
    ) as client:
        if patched:
            assert speed_up_client(client) == ["user_agent", "endpoint_params"]
        yield client


CALLS: list[tuple[str, dict[str, Any]]] = [
    ("put_object", {"Bucket": "bucket-a", "Key": "lm/raw/1", "Body": b"x", "IfNoneMatch": "*"}),
    ("put_object", {"Bucket": "bucket-a", "Key": "lm/raw/2", "Body": b"yy", "IfNoneMatch": "*"}),
    ("put_object", {"Bucket": "bucket-a", "Key": "lm/m/1", "Body": b"{}", "IfMatch": '"e"'}),
    ("get_object", {"Bucket": "bucket-a", "Key": "lm/raw/1"}),
    ("get_object", {"Bucket": "bucket-b", "Key": "other/key"}),
    ("head_object", {"Bucket": "bucket-a", "Key": "lm/raw/2"}),
    ("list_objects_v2", {"Bucket": "bucket-a", "Prefix": "lm/raw/"}),
    ("list_objects_v2", {"Bucket": "bucket-a", "Prefix": "lm/m/", "StartAfter": "lm/m/0"}),
    ("delete_object", {"Bucket": "bucket-b", "Key": "lm/raw/1"}),
    ("put_object", {"Bucket": "bucket-a", "Key": "lm/raw/1", "Body": b"x", "IfNoneMatch": "*"}),
]


async def _requests(*, endpoint_url: str | None, patched: bool) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    async for client in _client(endpoint_url=endpoint_url, patched=patched):
        client.meta.events.register("before-send.s3", _capture(seen))
        for method, params in CALLS:
            with pytest.raises(_Captured):
                await getattr(client, method)(**params)
    return seen


@pytest.mark.parametrize("endpoint_url", ["http://127.0.0.1:9", None])
async def test_patched_client_sends_the_same_requests(endpoint_url: str | None) -> None:
    plain = await _requests(endpoint_url=endpoint_url, patched=False)
    patched = await _requests(endpoint_url=endpoint_url, patched=True)
    assert len(plain) == len(CALLS)
    assert patched == plain
    if endpoint_url is not None:
        assert plain[4]["url"] == "http://127.0.0.1:9/bucket-b/other/key"
    else:
        assert plain[0]["url"].startswith("https://bucket-a.s3.eu-west-1.amazonaws.com/")
        assert plain[4]["url"].startswith("https://bucket-b.s3.eu-west-1.amazonaws.com/")


async def test_puts_to_new_keys_resolve_the_endpoint_parameters_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """botocore's lazily resolved account ID builtin (a callable S3's ruleset never
    reads) must not make every request uncacheable."""
    resolved: list[str] = []
    full = s3_request_cache._provider_params

    async def counted(resolver: Any, operation_model: Any, *args: Any) -> dict[str, Any]:
        resolved.append(operation_model.name)
        return await full(resolver, operation_model, *args)

    monkeypatch.setattr(s3_request_cache, "_provider_params", counted)
    async for client in _client(endpoint_url="http://127.0.0.1:9", patched=True):
        client.meta.events.register("before-send.s3", _capture([]))
        for number in range(3):
            with pytest.raises(_Captured):
                await client.put_object(Bucket="bucket-a", Key=f"lm/raw/{number}", Body=b"x")
    assert resolved == ["PutObject"]


async def test_a_client_without_the_private_parts_is_left_alone() -> None:
    class Bare:
        pass

    assert speed_up_client(Bare()) == []
