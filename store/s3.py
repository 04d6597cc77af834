"""`ObjectStore` on S3 (or an S3-compatible server) through aiobotocore.

``s3://bucket/prefix``: object ``K`` is the S3 key ``prefix/K``; keys handed in and out
are relative to the prefix, so two stores with different prefixes in one bucket never
see each other's objects.

Retries. botocore's own retries are switched off: a silent SDK retry of a conditional
create whose first answer was lost turns "we created it" into a 412, and the caller
would believe another writer won. Instead every request is sent once and its failure is
mapped to a `store.errors` type; reads, list pages, deletes and unconditional puts are
then repeated here with bounded jittered backoff (each loop says why repeating is safe),
and conditional puts never are: the caller decides, usually by reading the key.

Error mapping (``mutating`` = put or delete):

- 412 → `PreconditionFailed`; 404/NoSuchKey on ``If-Match`` → `PreconditionFailed`
  (S3 answers 404 when there is no object to match).
- 409 ConditionalRequestConflict/OperationAborted → `ConditionConflict`.
- 404 NoSuchKey/NotFound → `NotFound`; NoSuchBucket, 400/403 and other refusals that
  repeating cannot fix → `StoreConfigError`.
- 503/SlowDown/throttling/RequestTimeout → `Unavailable` (refused before applying).
- other 5xx (500 InternalError, 502, 504) → `OutcomeUnknown` when mutating, else
  `Unavailable`.
- refused or timed-out connects, DNS, TLS, proxy failures → `Unavailable` (not sent).
- read timeouts, resets and closed connections after sending → `OutcomeUnknown` when
  mutating, else `Unavailable` (a read changes nothing).

Below botocore, aiohttp also resends a PUT or DELETE once, silently, when the connection
drops before the answer (its RFC 9112 "idempotent method" retry), with the same effect
on a conditional create; `_SendOnceHTTPSession` switches that off too.

Signed deletes (PROTOCOL §3.5 rule 6): `sign_delete` makes a pre-signed DELETE URL
(``X-Amz-Expires``) with the client's credentials, and `send_signed_delete` sends it once
with aiohttp on a fresh connection. S3 refuses it with 403 "Request has expired" once its
clock is past ``X-Amz-Date`` + ``X-Amz-Expires`` (`RequestExpired`); other answers and
transport failures are mapped as above (a DELETE is mutating).

Only this module and its helpers (`store.s3_timestamps`, `store.s3_request_cache`,
`store.s3_upload`) import aiobotocore/botocore.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.httpsession import AIOHTTPSession
from aiobotocore.session import AioSession
from botocore import exceptions as botoexc
from botocore import handlers as botohandlers
from yarl import URL

from protocol.clock import Clock, SystemClock
from store.base import (
    PUT_FILE_PART_BYTES,
    ObjectInfo,
    SignedDelete,
    check_key,
    check_put_conditions,
    check_signed_expiry,
)
from store.errors import (
    NotFound,
    PreconditionFailed,
    RequestExpired,
    StoreConfigError,
    Unavailable,
)
from store.retry import Backoff, repeat_while_unavailable
from store.s3_errors import ERROR_BODY_MAX, error_code_and_message, map_error_answer, map_s3_error
from store.s3_fast_list import use_fast_listings
from store.s3_request_cache import speed_up_client
from store.s3_timestamps import use_fast_timestamps
from store.s3_upload import upload_file
from store.s3_url import check_bucket_name, normalize_prefix, parse_s3_url
from store.time import DEFAULT_MAX_CLOCK_SKEW_S, ClockOffset

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client
    from types_aiobotocore_s3.type_defs import ListObjectsV2OutputTypeDef

T = TypeVar("T")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MIN_PART_BYTES = 5 * 1024 * 1024  # S3's least part size (all parts but the last)


class S3Credentials(NamedTuple):
    """Explicit credentials; without them the standard AWS chain is used."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __repr__(self) -> str:
        return f"S3Credentials(access_key_id={self.access_key_id!r}, secret_access_key=***)"


class S3Store:
    """An `ObjectStore` over one bucket and prefix.

    One aiobotocore client (and its connection pool) lives from the first call (or
    `open`) until `close`; it belongs to the event loop that opened it. Use one store per
    event loop, and ``async with`` or `close` to release it.
    """

    def __init__(
        self,
        *,
        bucket: str,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str = "us-east-1",
        max_pool_connections: int = 64,
        connect_timeout_s: float = 3.0,
        read_timeout_s: float = 20.0,
        credentials: S3Credentials | tuple[str, str] | tuple[str, str, str] | None = None,
        profile: str | None = None,
        backoff: Backoff | None = None,
        rng: random.Random | None = None,
        clock: Clock | None = None,
        max_clock_skew_s: float = DEFAULT_MAX_CLOCK_SKEW_S,
        upload_part_bytes: int = PUT_FILE_PART_BYTES,
    ) -> None:
        check_bucket_name(bucket)
        if upload_part_bytes < MIN_PART_BYTES:
            raise StoreConfigError(f"upload_part_bytes must be at least {MIN_PART_BYTES} (S3)")
        self.upload_part_bytes = upload_part_bytes
        prefix = normalize_prefix(prefix)
        if credentials is not None and profile is not None:
            raise StoreConfigError("give explicit credentials or a profile, not both")
        if max_pool_connections < 1 or connect_timeout_s <= 0 or read_timeout_s <= 0:
            raise StoreConfigError("pool size and timeouts must be positive")
        self.bucket = bucket
        self.prefix = prefix
        self.url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
        self._root = f"{prefix}/" if prefix else ""
        self._endpoint_url = endpoint_url
        self._region = region
        self._credentials = None if credentials is None else S3Credentials(*credentials)
        self._profile = profile
        self._config = AioConfig(
            region_name=region,
            max_pool_connections=max_pool_connections,
            connect_timeout=connect_timeout_s,
            read_timeout=read_timeout_s,
            # One attempt per call: see the module docstring for why retries are ours.
            retries={"total_max_attempts": 1, "mode": "standard"},
            # S3-compatible servers on an IP or localhost have no per-bucket hostnames.
            s3={"addressing_style": "path" if endpoint_url else "auto"},
            user_agent_extra="lightmetrics-ingest",
            # SigV4 everywhere; botocore would pre-sign with SigV2 (no X-Amz-Expires) else.
            signature_version="s3v4",
            http_session_cls=_SendOnceHTTPSession,
        )
        self._backoff = backoff if backoff is not None else Backoff()
        self._rng = rng if rng is not None else random.Random()
        self._clock: Clock = clock if clock is not None else SystemClock()
        self.clock_offset = ClockOffset(max_skew_s=max_clock_skew_s)
        self._client: S3Client | None = None
        self._signed_http: aiohttp.ClientSession | None = None
        self._signed_timeout = aiohttp.ClientTimeout(
            total=connect_timeout_s + read_timeout_s,
            sock_connect=connect_timeout_s,
            sock_read=read_timeout_s,
        )
        self._exit_stack: AsyncExitStack | None = None
        self._open_lock = asyncio.Lock()
        self._closed = False

    @classmethod
    def from_url(cls, url: str, **options: Any) -> S3Store:
        """Build a store for ``s3://bucket/prefix``; ``options`` are the other arguments."""
        bucket, prefix = parse_s3_url(url)
        return cls(bucket=bucket, prefix=prefix, **options)

    def __repr__(self) -> str:
        return f"<S3Store {self.url} endpoint={self._endpoint_url or 'aws'}>"

    # -- lifecycle ---------------------------------------------------------------------

    async def open(self) -> None:
        """Create the client now (otherwise the first call does). Idempotent."""
        await self._s3()

    async def close(self) -> None:
        """Release the client and its connections; the store cannot be used afterwards."""
        self._closed = True
        stack, self._exit_stack, self._client = self._exit_stack, None, None
        signed_http, self._signed_http = self._signed_http, None
        if signed_http is not None:
            await signed_http.close()
        if stack is not None:
            await stack.aclose()

    async def __aenter__(self) -> S3Store:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _s3(self) -> S3Client:
        if self._client is not None:
            return self._client
        async with self._open_lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            if self._client is None:
                stack = AsyncExitStack()
                creds = self._credentials
                try:
                    session = AioSession(profile=self._profile)
                    use_fast_timestamps(session)  # listings: ~70 µs a key saved
                    self._client = await stack.enter_async_context(
                        session.create_client(
                            "s3",
                            region_name=self._region,
                            endpoint_url=self._endpoint_url,
                            aws_access_key_id=creds.access_key_id if creds else None,
                            aws_secret_access_key=creds.secret_access_key if creds else None,
                            aws_session_token=creds.session_token if creds else None,
                            config=self._config,
                        )
                    )
                except botoexc.BotoCoreError as exc:
                    await stack.aclose()
                    raise StoreConfigError(f"{self.url}: cannot create S3 client: {exc}") from exc
                # botocore asks for "Expect: 100-continue" on every PutObject: one more round
                # trip per PUT (measured 46 vs 26 ms at 20 ms RTT). Our bodies are small frames
                # and manifests, so sending the body at once is cheaper even when a 412 follows.
                use_fast_listings(self._client)  # listings: botocore's XML walk skipped
                self._client.meta.events.unregister(
                    "before-call.s3", botohandlers.add_expect_header
                )
                # User-Agent and endpoint parameters once per distinct input, not per
                # request (~0.12 ms of CPU per request; store/s3_request_cache.py).
                speed_up_client(self._client)
                self._client.meta.events.register("before-call.s3", self._note_sent)
                self._client.meta.events.register("after-call.s3", self._note_date)
                self._exit_stack = stack
            return self._client

    # -- store time: the Date header of every answer (store.time) --------------------

    def _note_sent(self, context: dict[str, Any], **_: Any) -> None:
        context["lightmetrics_sent_ns"] = self._clock.now_ns()

    def _note_date(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        """botocore's ``after-call`` comes for error answers (4xx/5xx) too."""
        date = parsed.get("ResponseMetadata", {}).get("HTTPHeaders", {}).get("date")
        sent_ns = context.get("lightmetrics_sent_ns")
        if isinstance(date, str) and isinstance(sent_ns, int):
            self.clock_offset.observe(date, sent_ns=sent_ns, answered_ns=self._clock.now_ns())

    # -- the ObjectStore operations ----------------------------------------------------

    async def get(self, key: str) -> tuple[bytes, str]:
        check_key("get", key)

        async def attempt(s3: S3Client) -> tuple[bytes, str]:
            answer = await s3.get_object(Bucket=self.bucket, Key=self._root + key)
            async with answer["Body"] as stream:
                body = await stream.read()
            return body, _etag(answer["ETag"])

        # A read changes nothing, so repeating it is always safe.
        return await self._retrying("get", key, attempt)

    async def get_if_none_match(self, key: str, etag: str) -> tuple[bytes, str] | None:
        """`get` with ``If-None-Match: etag``: ``None`` on 304 Not Modified (one request,
        no body)."""
        check_key("get", key)

        async def attempt(s3: S3Client) -> tuple[bytes, str] | None:
            try:
                answer = await s3.get_object(
                    Bucket=self.bucket, Key=self._root + key, IfNoneMatch=etag
                )
            except botoexc.ClientError as exc:
                if exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") == 304:
                    return None
                raise
            async with answer["Body"] as stream:
                body = await stream.read()
            return body, _etag(answer["ETag"])

        # A read changes nothing, so repeating it is always safe.
        return await self._retrying("get", key, attempt)

    async def head(self, key: str) -> ObjectInfo:
        check_key("head", key)

        async def attempt(s3: S3Client) -> ObjectInfo:
            answer = await s3.head_object(Bucket=self.bucket, Key=self._root + key)
            return ObjectInfo(
                key=key,
                size=answer["ContentLength"],
                etag=_etag(answer["ETag"]),
                last_modified_ns=_to_ns(answer["LastModified"]),
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

        async def attempt(s3: S3Client) -> str:
            if if_none_match:
                answer = await s3.put_object(
                    Bucket=self.bucket, Key=full_key, Body=body, IfNoneMatch="*"
                )
            elif if_match is not None:
                answer = await s3.put_object(
                    Bucket=self.bucket, Key=full_key, Body=body, IfMatch=if_match
                )
            else:
                answer = await s3.put_object(Bucket=self.bucket, Key=full_key, Body=body)
            etag = answer.get("ETag")
            if not etag:
                raise StoreConfigError(f"put {key!r}: the server returned no ETag")
            return _etag(etag)

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
        return _etag(etag)

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
                        etag=_etag(entry["ETag"]),
                        last_modified_ns=_to_ns(entry["LastModified"]),
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

    async def delete(self, key: str) -> None:
        check_key("delete", key)

        async def attempt(s3: S3Client) -> None:
            await s3.delete_object(Bucket=self.bucket, Key=self._root + key)

        # Repeated only when the attempt provably did not apply (not sent, 429/503).
        # After a lost answer (`OutcomeUnknown`) the attempt may still land later, so a
        # repeat that "succeeds" would hide it: the caller gets `OutcomeUnknown` and
        # decides (the GC leaves its mark "deleting" until a settle time has passed).
        await self._retrying("delete", key, attempt, mutating=True, repeat_unknown=False)

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        """A pre-signed DELETE URL (``X-Amz-Expires`` = ``expires_in_s``); sends nothing."""
        check_key("sign_delete", key)
        check_signed_expiry(key, expires_in_s)
        s3 = await self._s3()
        try:
            url = await s3.generate_presigned_url(
                "delete_object",
                Params={"Bucket": self.bucket, "Key": self._root + key},
                ExpiresIn=expires_in_s,
            )
        except botoexc.BotoCoreError as exc:
            raise map_s3_error("sign_delete", key, exc, mutating=False) from exc
        return SignedDelete(key, expires_in_s, _signed_at_ns(key, url), url)

    async def send_signed_delete(self, request: SignedDelete) -> None:
        """Send ``request`` once, on its own connection, and map the answer as every other
        call here is mapped. Never repeated: not by botocore (not involved), not by aiohttp
        (its hidden resend is off and no connection is reused), not here."""
        if not request.url:
            raise ValueError(f"send_signed_delete {request.key!r}: not signed by an S3 store")
        session = await self._signed_session()
        try:
            async with session.delete(URL(request.url, encoded=True)) as answer:
                status = answer.status
                body = await answer.content.read(ERROR_BODY_MAX)
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise map_s3_error("delete", request.key, exc, mutating=True) from exc
        if status < 300:
            return
        code, message = error_code_and_message(body)
        if status == 403 and "expired" in message.lower():
            raise RequestExpired("delete", request.key, f"{code} (HTTP 403): {message}")
        error = map_error_answer("delete", request.key, status, code, message, mutating=True)
        if isinstance(error, NotFound):
            return  # no such key: deleted already, as `delete` treats it
        raise error

    async def _signed_session(self) -> aiohttp.ClientSession:
        async with self._open_lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            if self._signed_http is None:
                session = aiohttp.ClientSession(
                    # A fresh connection per request: a signed DELETE is never resent on a
                    # reused connection that turned out to be closed.
                    connector=aiohttp.TCPConnector(force_close=True),
                    timeout=self._signed_timeout,
                    trust_env=True,  # HTTP(S)_PROXY / NO_PROXY, as botocore honours them
                )
                session._retry_connection = False  # see _SendOnceHTTPSession
                self._signed_http = session
            return self._signed_http

    # -- one request, mapped errors, bounded retries -----------------------------------

    async def _once(
        self,
        op: str,
        key: str,
        attempt: Callable[[S3Client], Awaitable[T]],
        *,
        mutating: bool = False,
    ) -> T:
        s3 = await self._s3()
        try:
            return await attempt(s3)
        except (
            botoexc.ClientError,
            botoexc.BotoCoreError,
            aiohttp.ClientError,
            TimeoutError,
        ) as exc:
            raise map_s3_error(op, key, exc, mutating=mutating) from exc

    async def _send(
        self,
        op: str,
        key: str,
        attempt: Callable[[S3Client], Awaitable[T]],
        *,
        mutating: bool,
        repeat: str | None,
    ) -> T:
        """`_once` (``repeat=None``) or `_retrying`, repeating after an unknown outcome
        too when ``repeat == "always"`` (`store.s3_upload.Send`)."""
        if repeat is None:
            return await self._once(op, key, attempt, mutating=mutating)
        return await self._retrying(
            op, key, attempt, mutating=mutating, repeat_unknown=repeat == "always"
        )

    async def _retrying(
        self,
        op: str,
        key: str,
        attempt: Callable[[S3Client], Awaitable[T]],
        *,
        mutating: bool = False,
        repeat_unknown: bool = True,
    ) -> T:
        """``attempt`` with bounded jittered retries on `Unavailable` (see
        `store.retry.repeat_while_unavailable`). Callers use this only where repeating
        the request is safe; they say why."""
        return await repeat_while_unavailable(
            lambda: self._once(op, key, attempt, mutating=mutating),
            backoff=self._backoff,
            rng=self._rng,
            sleep=self._clock.sleep,
            repeat_unknown=repeat_unknown,
        )


class _SendOnceHTTPSession(AIOHTTPSession):
    """aiobotocore's HTTP session with aiohttp's hidden resend of PUT/DELETE turned off.

    aiohttp has no public switch; ``_retry_connection`` is the flag its own test client
    clears. ``tests/store/test_s3.py`` checks that a dropped conditional PUT reaches the
    server exactly once, so an aiohttp upgrade that renames the flag is caught there.
    """

    async def _get_session(self, proxy_url: str | None) -> aiohttp.ClientSession:
        session: aiohttp.ClientSession = await super()._get_session(proxy_url)  # type: ignore[misc]
        session._retry_connection = False
        return session


def _signed_at_ns(key: str, url: str) -> int:
    """The ``X-Amz-Date`` of a pre-signed URL: when S3 starts counting its expiry."""
    stamp = URL(url, encoded=True).query.get("X-Amz-Date", "")
    try:
        signed = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise StoreConfigError(f"sign_delete {key!r}: no X-Amz-Date in the signed URL") from None
    return (signed - _EPOCH) // timedelta(seconds=1) * 1_000_000_000


def _etag(raw: str) -> str:
    """ETags as S3 sends them in headers: quoted (some listings drop the quotes)."""
    return raw if raw.startswith('"') else f'"{raw}"'


def _to_ns(moment: datetime) -> int:
    """Whole seconds since the epoch, in ns: HTTP Last-Modified (head/get) has one-second
    resolution while listings may carry milliseconds; truncating makes both agree."""
    return (moment - _EPOCH) // timedelta(seconds=1) * 1_000_000_000


__all__ = [
    "S3Credentials",
    "S3Store",
    "check_bucket_name",
    "map_s3_error",
    "parse_s3_url",
]
