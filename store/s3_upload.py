"""`S3Store.put_file` above one part: a multipart upload read from the file a part at a time.

Memory stays at about one part (``part_bytes``, `store.base.PUT_FILE_PART_BYTES` by
default; S3 wants at least 5 MiB for every part but the last), however big the file.

Requests, and why each may or may not be repeated (as `store.s3` says for its own):

- CreateMultipartUpload: repeated only when provably not applied (`Unavailable`); after a
  lost answer the upload it may have started is never completed (the bucket's
  AbortIncompleteMultipartUpload lifecycle rule removes it; deploy/ sets one).
- UploadPart: repeated on `Unavailable` and `OutcomeUnknown`: sending part N again
  replaces part N of an upload nobody can see yet.
- CompleteMultipartUpload: carries the put's condition (``If-None-Match: *`` or
  ``If-Match``: S3 evaluates it against the key at completion) and is sent once when
  conditional, as a conditional PutObject is (a repeat after a lost answer could report
  412 for our own write; the caller decides by reading the key); unconditional, it is
  repeated only when provably not applied.
- Any failure aborts the upload (AbortMultipartUpload, best effort, never repeated): its
  parts are not left billed. An abort after a completion that did land changes nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar

from store.errors import NotFound, PreconditionFailed, StoreConfigError, StoreError
from store.s3_requests import SDK_CHECKSUM

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

T = TypeVar("T")
Send = Callable[..., Awaitable[Any]]
"""``send(op, key, attempt, *, mutating, repeat)``: the store's one-request call with
its error mapping; ``repeat`` is ``None`` (once), ``"unavailable"`` or ``"always"``."""


async def upload_file(
    send: Send,
    *,
    bucket: str,
    key: str,
    full_key: str,
    path: str,
    size: int,
    part_bytes: int,
    if_none_match: bool,
    if_match: str | None,
) -> str:
    """Upload the file at ``path`` (``size`` bytes) to ``full_key``; returns the ETag."""

    async def create(s3: S3Client) -> str:
        answer = await s3.create_multipart_upload(Bucket=bucket, Key=full_key)
        return answer["UploadId"]

    upload_id: str = await send("put", key, create, mutating=True, repeat="unavailable")
    try:
        parts = []
        with open(path, "rb") as file:  # noqa: ASYNC230 - each read runs in a thread
            for number, offset in enumerate(range(0, size, part_bytes), start=1):
                body = await asyncio.to_thread(_read_at, file, offset, part_bytes)
                if not body:
                    raise StoreConfigError(f"put {key!r}: {path} shrank while it was uploaded")
                parts.append(
                    {
                        "PartNumber": number,
                        "ETag": await _part(send, bucket, key, full_key, upload_id, number, body),
                    }
                )
                del body
        return await _complete(
            send, bucket, key, full_key, upload_id, parts, if_none_match, if_match
        )
    except BaseException:
        await _abort(send, bucket, key, full_key, upload_id)
        raise


async def _part(
    send: Send, bucket: str, key: str, full_key: str, upload_id: str, number: int, body: bytes
) -> str:
    async def attempt(s3: S3Client) -> str:
        answer = await s3.upload_part(
            Bucket=bucket,
            Key=full_key,
            UploadId=upload_id,
            PartNumber=number,
            Body=body,
            ChecksumAlgorithm=SDK_CHECKSUM,  # store.s3_requests "Checksums"
        )
        return answer["ETag"]

    etag: str = await send("put", key, attempt, mutating=True, repeat="always")
    return etag


async def _complete(
    send: Send,
    bucket: str,
    key: str,
    full_key: str,
    upload_id: str,
    parts: list[dict[str, Any]],
    if_none_match: bool,
    if_match: str | None,
) -> str:
    conditions: dict[str, str] = {}
    if if_none_match:
        conditions["IfNoneMatch"] = "*"
    elif if_match is not None:
        conditions["IfMatch"] = if_match

    async def attempt(s3: S3Client) -> str:
        answer = await s3.complete_multipart_upload(
            Bucket=bucket,
            Key=full_key,
            UploadId=upload_id,
            MultipartUpload={"Parts": parts},  # type: ignore[typeddict-item]
            **conditions,  # type: ignore[arg-type]
        )
        etag = answer.get("ETag")
        if not etag:
            raise StoreConfigError(f"put {key!r}: the server returned no ETag")
        return etag

    if not conditions:
        etag: str = await send("put", key, attempt, mutating=True, repeat="unavailable")
        return etag
    try:
        etag = await send("put", key, attempt, mutating=True, repeat=None)
    except NotFound as exc:
        if if_match is None:
            raise
        # S3 answers 404 NoSuchKey to If-Match on an absent key (as `S3Store.put` says).
        raise PreconditionFailed("put", key, "no object to match") from exc
    return etag


async def _abort(send: Send, bucket: str, key: str, full_key: str, upload_id: str) -> None:
    async def attempt(s3: S3Client) -> None:
        await s3.abort_multipart_upload(Bucket=bucket, Key=full_key, UploadId=upload_id)

    try:
        await asyncio.shield(send("put", key, attempt, mutating=True, repeat=None))
    except (StoreError, asyncio.CancelledError):
        pass  # best effort: the lifecycle rule removes an upload left incomplete


def _read_at(file: Any, offset: int, length: int) -> bytes:
    file.seek(offset)
    data: bytes = file.read(length)
    return data
