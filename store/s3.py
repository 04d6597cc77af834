"""`ObjectStore` on S3 (or an S3-compatible server) through aiobotocore.

``s3://bucket/prefix``: object ``K`` is the S3 key ``prefix/K``; keys handed in and out
are relative to the prefix, so two stores with different prefixes in one bucket never
see each other's objects.

The store is built in rooms, one purpose each: `store.s3_requests` (the client, sending
one request, error mapping and retries: its docstring says which requests are repeated
and why), `store.s3_listing` (listings), `store.s3_signed_delete` (pre-signed DELETEs,
PROTOCOL §3.5 rule 6), `store.s3_direct` (small PutObjects and the GetObjects, without
botocore's pipeline), `store.s3_upload` (multipart `put_file`); this module holds the
object calls (get, head, put, put_file, delete) and puts the rooms together.

Only the ``store/s3*.py`` modules import aiobotocore/botocore.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from botocore import exceptions as botoexc

from store.base import ObjectInfo, check_key, check_put_conditions, check_range
from store.errors import NotFound, PreconditionFailed, StoreConfigError
from store.s3_direct import S3Direct
from store.s3_errors import map_s3_error
from store.s3_listing import S3Listing
from store.s3_requests import (
    MIN_PART_BYTES,
    SDK_CHECKSUM,
    SDK_CHECKSUM_MIN_BYTES,
    S3Credentials,
    quoted_etag,
    whole_seconds_ns,
)
from store.s3_signed_delete import S3SignedDeletes
from store.s3_upload import upload_file
from store.s3_url import check_bucket_name, parse_s3_url

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client


class S3Store(S3Listing, S3SignedDeletes, S3Direct):
    """An `ObjectStore` over one bucket and prefix (`store.s3_requests.S3Requests` says
    how long its client lives)."""

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3Store:
        """Build a store for ``s3://bucket/prefix``; ``options`` are the other arguments."""
        bucket, prefix = parse_s3_url(url)
        return cls(bucket=bucket, prefix=prefix, **options)

    # -- the ObjectStore operations ----------------------------------------------------

    async def get(self, key: str) -> tuple[bytes, str]:
        check_key("get", key)

        async def attempt(s3: S3Client) -> tuple[bytes, str]:
            direct = await self._direct_get(s3, key, {}, accepted=())
            if direct is not None:  # None: sent through the client (store.s3_direct)
                return direct.body, quoted_etag(direct.etag)
            answer, body = await self._sdk_get(s3, key)
            return body, quoted_etag(answer["ETag"])

        # A read changes nothing, so repeating it is always safe.
        return await self._retrying("get", key, attempt)

    async def get_if_none_match(self, key: str, etag: str) -> tuple[bytes, str] | None:
        """`get` with ``If-None-Match: etag``: ``None`` on 304 Not Modified (one request,
        no body)."""
        check_key("get", key)

        async def attempt(s3: S3Client) -> tuple[bytes, str] | None:
            direct = await self._direct_get(s3, key, {"If-None-Match": etag}, accepted=(304,))
            if direct is not None:
                return None if direct.status == 304 else (direct.body, quoted_etag(direct.etag))
            try:
                answer, body = await self._sdk_get(s3, key, IfNoneMatch=etag)
            except botoexc.ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 304:
                    return None
                raise
            return body, quoted_etag(answer["ETag"])

        # A read changes nothing, so repeating it is always safe.
        return await self._retrying("get", key, attempt)

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        """One GET with ``Range: bytes=offset-(offset+length-1)`` (206 Partial Content);
        416 (the object ends at or before ``offset``) is no bytes."""
        check_key("get", key)
        check_range(key, offset, length)
        wanted = f"bytes={offset}-{offset + length - 1}"

        def cut(content_range: str | None, body: bytes) -> bytes:
            # A server that ignored the Range sends the whole object (200, no
            # Content-Range): cut the range out of it, so the answer is the same either way.
            return body if content_range else body[offset : offset + length]

        async def attempt(s3: S3Client) -> bytes:
            direct = await self._direct_get(s3, key, {"Range": wanted}, accepted=(416,))
            if direct is not None:
                return b"" if direct.status == 416 else cut(direct.content_range, direct.body)
            try:
                answer, body = await self._sdk_get(s3, key, Range=wanted)
            except botoexc.ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 416:
                    return b""
                raise
            return cut(answer.get("ContentRange"), body)

        # A read changes nothing, so repeating it is always safe.
        return await self._retrying("get", key, attempt)

    async def _sdk_get(self, s3: S3Client, key: str, **params: Any) -> tuple[Any, bytes]:
        """One GetObject of ``key`` through the client (``params``: its conditions), the
        whole body read; it teaches `store.s3_direct` the URL."""
        self._watch_sdk_requests(s3)
        answer = await s3.get_object(Bucket=self.bucket, Key=self._root + key, **params)
        async with answer["Body"] as stream:
            body = await stream.read()
        self._learn_object_url(key)
        return answer, body

    async def head(self, key: str) -> ObjectInfo:
        check_key("head", key)

        async def attempt(s3: S3Client) -> ObjectInfo:
            answer = await s3.head_object(Bucket=self.bucket, Key=self._root + key)
            return ObjectInfo(
                key=key,
                size=answer["ContentLength"],
                etag=quoted_etag(answer["ETag"]),
                last_modified_ns=whole_seconds_ns(answer["LastModified"]),
            )

        # A read changes nothing, so repeating it is always safe.
        return await self._retrying("head", key, attempt)

    async def put(
        self,
        key: str,
        body: bytes,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        check_key("put", key)
        check_put_conditions(key, if_none_match, if_match)
        full_key = self._root + key

        extra: dict[str, Any] = {}
        conditions: dict[str, str] = {}
        if if_none_match:
            extra["IfNoneMatch"] = conditions["If-None-Match"] = "*"
        elif if_match is not None:
            extra["IfMatch"] = conditions["If-Match"] = if_match
        small = len(body) < SDK_CHECKSUM_MIN_BYTES
        if not small:
            # Small bodies go without an SDK checksum, large ones with botocore's CRC32
            # (store.s3_requests "Checksums").
            extra["ChecksumAlgorithm"] = SDK_CHECKSUM

        async def attempt(s3: S3Client) -> str:
            # A small body: signed by the client, sent without its pipeline
            # (store.s3_direct); None: not yet learnt, or a redirect answer (which
            # applied nothing), so the client sends it.
            etag = await self._direct_put(s3, key, body, conditions) if small else None
            if etag is None:
                self._watch_sdk_requests(s3)
                answer = await s3.put_object(Bucket=self.bucket, Key=full_key, Body=body, **extra)
                etag = answer.get("ETag", "")
                if etag:  # a large PUT teaches the URL too (the §3.6 probe's)
                    self._learn_object_url(key)
            if not etag:
                raise StoreConfigError(f"put {key!r}: the server returned no ETag")
            return quoted_etag(etag)

        if if_none_match or if_match is not None:
            # Conditional: never repeated here. If the first answer was lost, a repeat
            # would report 412 for our own write; the caller reads the key to decide.
            try:
                return await self._once("put", key, attempt, mutating=True)
            except NotFound as exc:
                if if_match is None:
                    raise
                # S3 answers 404 NoSuchKey to If-Match on an absent key; the contract
                # says PreconditionFailed (there is no object with that ETag).
                raise PreconditionFailed("put", key, "no object to match") from exc
        # Unconditional: writing the same body again leaves the same object, so a repeat
        # after an unknown outcome converges on what the first attempt meant to do.
        return await self._retrying("put", key, attempt, mutating=True)

    async def put_file(
        self,
        key: str,
        path: str,
        *,
        if_none_match: bool = False,
        if_match: str | None = None,
    ) -> str:
        """`put` of the file at ``path``: up to ``upload_part_bytes`` one PutObject of its
        bytes, beyond that a multipart upload of parts read one at a time
        (`store.s3_upload`), the condition on its completion, aborted on failure."""
        check_key("put", key)
        check_put_conditions(key, if_none_match, if_match)
        size = await asyncio.to_thread(os.path.getsize, path)
        if size <= self.upload_part_bytes:
            body = await asyncio.to_thread(Path(path).read_bytes)
            return await self.put(key, body, if_none_match=if_none_match, if_match=if_match)
        etag = await upload_file(
            self._send,
            bucket=self.bucket,
            key=key,
            full_key=self._root + key,
            path=path,
            size=size,
            part_bytes=self.upload_part_bytes,
            if_none_match=if_none_match,
            if_match=if_match,
        )
        return quoted_etag(etag)

    async def delete(self, key: str) -> None:
        check_key("delete", key)

        async def attempt(s3: S3Client) -> None:
            await s3.delete_object(Bucket=self.bucket, Key=self._root + key)

        # Repeated only when the attempt provably did not apply (not sent, 429/503).
        # After a lost answer (`OutcomeUnknown`) the attempt may still land later, so a
        # repeat that "succeeds" would hide it: the caller gets `OutcomeUnknown` and
        # decides (the GC leaves its mark "deleting" until a settle time has passed).
        await self._retrying("delete", key, attempt, mutating=True, repeat_unknown=False)


__all__ = [
    "MIN_PART_BYTES",
    "S3Credentials",
    "S3Store",
    "check_bucket_name",
    "map_s3_error",
    "parse_s3_url",
]
