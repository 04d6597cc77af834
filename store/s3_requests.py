"""How `store.s3.S3Store` sends a request: the client's life, one attempt with its failure
mapped to a `store.errors` type, bounded retries, and the store time every answer tells.

`S3Requests` is the base the store's rooms build on (`store.s3` the object calls,
`store.s3_listing` the listings, `store.s3_signed_delete` the pre-signed DELETEs,
`store.s3_direct` the small PUTs and the GETs).

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

Checksums. botocore 1.36+ adds a CRC32 of the body to every PutObject and UploadPart by
default (``request_checksum_calculation="when_supported"``), through its hook machinery
(~0.05-0.1 ms of CPU a request, measured). The client asks for one only where S3 requires
it (``"when_required"``) or where we name one: `S3Store.put` names CRC32
(`SDK_CHECKSUM`) for bodies of `SDK_CHECKSUM_MIN_BYTES` and more, and so does every
multipart part (`store.s3_upload`): for them nothing changes. Smaller bodies (manifests,
records, typical frames) stay covered in transit without it: botocore's S3 signer signs
the body's SHA-256 (``x-amz-content-sha256``, which S3 checks) whenever a request has no
checksum header or goes over plain ``http://``, so on ``https://`` a small body is signed
(~0.04 ms for 64 KiB, instead of the CRC32 hooks) and TLS protects it too. Large bodies
keep the CRC32 so that a 16 MiB bundle is not SHA-256-hashed again on the event loop
(TLS plus the checksum let botocore skip payload signing there, as before). At rest and on
read the records carry their own checks: frame blobs and bundles are named by the
SHA-256 of their bytes, a bundle's frames carry CRC32 and SHA-256 (PROTOCOL §3.10), JSON
records are parsed and checked (§3.7). Conditional creates need no Content-MD5. Sending
the SHA-256 the collector already holds as ``ChecksumSHA256`` (S3 verifies the body
against our own hash, end to end) would need the hash carried through `ObjectStore.put`
(~30 implementations and wrappers): not done.

Below botocore, aiohttp also resends a PUT or DELETE once, silently, when the connection
drops before the answer (its RFC 9112 "idempotent method" retry), with the same effect
on a conditional create; `_SendOnceHTTPSession` switches that off too.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, NamedTuple, Self, TypeVar

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.httpsession import AIOHTTPSession
from aiobotocore.session import AioSession
from botocore import exceptions as botoexc
from botocore import handlers as botohandlers

from protocol.clock import Clock, SystemClock
from store.base import PUT_FILE_PART_BYTES
from store.errors import StoreConfigError
from store.retry import Backoff, repeat_while_unavailable
from store.s3_errors import map_s3_error
from store.s3_fast_parse import use_fast_listings, use_fast_timestamps
from store.s3_request_cache import speed_up_client
from store.s3_url import check_bucket_name, normalize_prefix
from store.time import DEFAULT_MAX_CLOCK_SKEW_S, ClockOffset

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

T = TypeVar("T")

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
MIN_PART_BYTES = 5 * 1024 * 1024  # S3's least part size (all parts but the last)
SDK_CHECKSUM: Final = "CRC32"  # named on large bodies (see "Checksums")
SDK_CHECKSUM_MIN_BYTES = 1024 * 1024


class S3Credentials(NamedTuple):
    """Explicit credentials; without them the standard AWS chain is used."""

    access_key_id: str
    secret_access_key: str
    session_token: str | None = None

    def __repr__(self) -> str:
        return f"S3Credentials(access_key_id={self.access_key_id!r}, secret_access_key=***)"


class S3Requests:
    """One bucket and prefix, one aiobotocore client and the way every request is sent.

    One aiobotocore client (and its connection pool) lives from the first call (or
    `open`) until `close`; it belongs to the event loop that opened it. Use one store per
    event loop, and ``async with`` or `close` to release it. The aiohttp session of the
    signed DELETEs (`store.s3_signed_delete`) is closed with it.
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
            # An SDK checksum only where S3 demands one or we name one (see the module
            # docstring, "Checksums"): ~0.05-0.1 ms of CPU per small PutObject.
            request_checksum_calculation="when_required",
            # Every request's parameters are built here from checked keys (store.base
            # check_key, check_range), never from input: botocore's walk of them against
            # the model is ~0.04 ms of CPU per request for nothing.
            parameter_validation=False,
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

    async def __aenter__(self) -> Self:
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
    clears. ``tests/store/test_s3_scripted.py`` checks that a dropped conditional PUT
    reaches the server exactly once, so an aiohttp upgrade that renames the flag is caught
    there.
    """

    async def _get_session(self, proxy_url: str | None) -> aiohttp.ClientSession:
        session: aiohttp.ClientSession = await super()._get_session(proxy_url)  # type: ignore[misc]
        session._retry_connection = False
        return session


def quoted_etag(raw: str) -> str:
    """ETags as S3 sends them in headers: quoted (some listings drop the quotes)."""
    return raw if raw.startswith('"') else f'"{raw}"'


def whole_seconds_ns(moment: datetime) -> int:
    """Whole seconds since the epoch, in ns: HTTP Last-Modified (head/get) has one-second
    resolution while listings may carry milliseconds; truncating makes both agree."""
    return (moment - _EPOCH) // timedelta(seconds=1) * 1_000_000_000
