"""`S3Store`'s listings: ListObjectsV2 page by page, one page asked for ahead.

`list` (and `list_until`, `store.base.BoundedListing`) resume each page after the last key
seen (``StartAfter``), so a page repeated against a restarted server needs no server
state; `common_prefixes` lists folders (``Delimiter="/"``) by continuation token. A page
is a read, repeated with bounded jittered backoff (`S3Requests._retrying`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from store.base import ObjectInfo
from store.errors import Unavailable
from store.s3_requests import S3Requests, quoted_etag, whole_seconds_ns

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client
    from types_aiobotocore_s3.type_defs import ListObjectsV2OutputTypeDef


class S3Listing(S3Requests):
    """The listing calls of `store.s3.S3Store`."""

    def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        return self._listing(prefix, start_after, None)

    def list_until(
        self, prefix: str, start_after: str | None, until: str
    ) -> AsyncIterator[ObjectInfo]:
        """`store.base.BoundedListing`: no page is asked for once one passed ``until``."""
        return self._listing(prefix, start_after, until)

    async def _listing(
        self, prefix: str, start_after: str | None, until: str | None
    ) -> AsyncIterator[ObjectInfo]:
        if prefix.startswith("/"):
            raise ValueError(f"list {prefix!r}: prefix must not start with '/'")
        full_prefix = self._root + prefix
        after = self._root + start_after if start_after is not None else None
        bound = self._root + until if until is not None else None
        page = await self._list_page(prefix, full_prefix, after)
        # One page ahead: the next page is asked for as soon as this one names its last
        # key, so the server prepares it while the caller works through this one (a long
        # listing's wall time is then about the larger of the two, not their sum). Bounded
        # to one page; a caller that stops early costs at most one unread page.
        ahead: asyncio.Task[ListObjectsV2OutputTypeDef] | None = None
        try:
            while True:
                contents = page.get("Contents", [])
                truncated = bool(page.get("IsTruncated"))
                if truncated and not contents:
                    raise Unavailable("list", prefix, "truncated page without keys")
                past = bound is not None and bool(contents) and contents[-1]["Key"] >= bound
                if truncated and not past:
                    # Each page resumes after the last key seen rather than from a
                    # continuation token, so a page retried against a restarted server
                    # needs no server state.
                    ahead = asyncio.ensure_future(
                        self._list_page(prefix, full_prefix, contents[-1]["Key"])
                    )
                for entry in contents:
                    full_key = entry["Key"]
                    if not full_key.startswith(full_prefix):
                        raise Unavailable(
                            "list", prefix, f"server returned foreign key {full_key!r}"
                        )
                    if bound is not None and full_key > bound:
                        return
                    yield ObjectInfo(
                        key=full_key[len(self._root) :],
                        size=entry["Size"],
                        etag=quoted_etag(entry["ETag"]),
                        last_modified_ns=whole_seconds_ns(entry["LastModified"]),
                    )
                if ahead is None:
                    return
                page, ahead = await ahead, None
        finally:
            if ahead is not None:  # the caller stopped early, or this page failed
                ahead.cancel()
                await asyncio.gather(ahead, return_exceptions=True)

    async def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        """ListObjectsV2 with ``Delimiter="/"``: its ``CommonPrefixes``, page by page.

        Pages follow each other by ``ContinuationToken`` (unlike `list`, which resumes
        after its last key: ``StartAfter`` a folder ``f/`` would list ``f/``'s own keys
        again). One entry per folder, so such a listing is short."""
        if prefix.startswith("/"):
            raise ValueError(f"list {prefix!r}: prefix must not start with '/'")
        full_prefix = self._root + prefix
        token: str | None = None
        while True:
            page = await self._folder_page(prefix, full_prefix, token)
            for entry in page.get("CommonPrefixes", []):
                folder = entry.get("Prefix", "")
                if not folder.startswith(full_prefix) or not folder.endswith("/"):
                    raise Unavailable("list", prefix, f"server returned foreign prefix {folder!r}")
                yield folder[len(self._root) :]
            token = page.get("NextContinuationToken")
            if not page.get("IsTruncated"):
                return
            if not token:
                raise Unavailable("list", prefix, "truncated page without a continuation token")

    async def _folder_page(
        self, prefix: str, full_prefix: str, token: str | None
    ) -> ListObjectsV2OutputTypeDef:
        async def attempt(s3: S3Client) -> ListObjectsV2OutputTypeDef:
            if token is None:
                return await s3.list_objects_v2(
                    Bucket=self.bucket, Prefix=full_prefix, Delimiter="/"
                )
            return await s3.list_objects_v2(
                Bucket=self.bucket, Prefix=full_prefix, Delimiter="/", ContinuationToken=token
            )

        return await self._retrying("list", prefix, attempt)

    async def _list_page(
        self, prefix: str, full_prefix: str, after: str | None
    ) -> ListObjectsV2OutputTypeDef:
        async def attempt(s3: S3Client) -> ListObjectsV2OutputTypeDef:
            if not after:  # nothing sorts before "": the same as no bound
                return await s3.list_objects_v2(Bucket=self.bucket, Prefix=full_prefix)
            return await s3.list_objects_v2(
                Bucket=self.bucket, Prefix=full_prefix, StartAfter=after
            )

        # A list page is a read: repeating it is always safe.
        return await self._retrying("list", prefix, attempt)
