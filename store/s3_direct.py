"""`S3Store`'s PutObject of a small body and its GetObjects: signed by the client, sent
without its pipeline.

Why. A request through the aiobotocore client costs ~0.7-0.75 ms of CPU (a 600-byte
conditional create at 32 in flight, or a GET of 10 KB at 8, on MiniStack, with every
saving of `store.s3_requests` and `store.s3_request_cache` applied); most of it is
botocore's per-request pipeline (events, serialization, endpoint rules, the retry
handler, response parsing). The collector makes one such PUT per accepted batch (the
manifest create, PROTOCOL §3.2) and the raw write of a bundle or frame (§3.10), its
largest single cost; the reconciler makes one GET per index log segment (§3.7), the
query path one per catalog file and raw object it reads. Built here, a PUT costs ~0.35 ms
and a GET ~0.3 ms (`bench/RESULTS.md`, "Direct small PUTs", "Direct GETs").

What is botocore's still, so nothing about the request S3 checks changes:

- the URL: each store's first PutObject or GetObject goes through the client, and the URL
  it was sent to (the client's endpoint resolution: virtual-host or path style, region,
  FIPS, dual-stack...) is remembered without its key; later requests go to ``that base +
  percent_encode(key)``, as botocore encodes a key (``safe="/~"``). (A pre-signed URL
  would not do: botocore pre-signs for S3's global endpoint.)
- the signature: the client's request signer (SigV4 with the client's credentials,
  refreshed as the client would, and the signing region its endpoint rules chose for
  that first request); a PUT body's SHA-256 is signed in ``x-amz-content-sha256``, since
  a small body carries no checksum header (`store.s3_requests` "Checksums");
- the transport: the client's own HTTP session (its pool, TLS, proxies, timeouts, and the
  send-once rule of `store.s3_requests._SendOnceHTTPSession`), so a failure raises the
  same botocore exceptions `store.s3_errors.map_s3_error` maps; it reads a GET's whole
  body before it returns, as the client's GetObject does here.
- a GET's checksum: asked for as the client asks (``x-amz-checksum-mode: ENABLED``) and
  checked as it checks one without the CRT (CRC32, SHA-1 or SHA-256 of the whole object;
  a multipart object's composite one is skipped, as botocore skips it, and so is a 206's:
  a part is not the whole). A mismatch is `Unavailable` (the body was damaged on its way:
  reading again is safe).

What is ours: reading the answer (status, ``ETag``, the S3 error document mapped by
`store.s3_errors.map_error_answer`, ``Date`` observed for the store time as every other
answer is). PUT bodies of `SDK_CHECKSUM_MIN_BYTES` and more still go through the client,
with their CRC32, and so do the other operations (HEAD, DELETE, listings, multipart).

A bucket in another region than configured: S3 answers a redirect or
AuthorizationHeaderMalformed, which applied nothing, so the request is sent again
through the client, whose redirector finds the bucket's region; from then on this store
sends every request through the client (logged once: configure the bucket's region).
"""

from __future__ import annotations

import base64
import hashlib
import zlib
from collections.abc import Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import structlog
from botocore.awsrequest import AWSRequest
from botocore.utils import percent_encode

from store.errors import StoreConfigError, Unavailable
from store.s3_errors import ERROR_BODY_MAX, error_code_and_message, map_error_answer
from store.s3_requests import S3Requests

if TYPE_CHECKING:
    from types_aiobotocore_s3.client import S3Client

log = structlog.get_logger(__name__)

# The answers of a bucket that lives in another region (botocore's S3RegionRedirector
# reacts to the same ones); none of them applied the write.
_REDIRECT_STATUSES = frozenset({301, 302, 307})
_REDIRECT_CODES = frozenset(
    {"PermanentRedirect", "AuthorizationHeaderMalformed", "IllegalLocationConstraintException"}
)
# The response checksums botocore checks without the CRT, in its order of preference.
_RESPONSE_CHECKSUMS: dict[str, Callable[[bytes], bytes]] = {
    "crc32": lambda body: zlib.crc32(body).to_bytes(4, "big"),
    "sha1": lambda body: hashlib.sha1(body).digest(),
    "sha256": lambda body: hashlib.sha256(body).digest(),
}
OPERATION_METHODS = {"PutObject": "PUT", "GetObject": "GET"}
"""The operations this module sends, and their HTTP methods."""


class DirectAnswer(NamedTuple):
    """A direct request's answer: its status (2xx or one the caller accepted), headers
    (lower-case names) and body."""

    status: int
    headers: Mapping[str, str]
    body: bytes

    @property
    def etag(self) -> str:
        return str(self.headers.get("etag", ""))

    @property
    def content_range(self) -> str | None:
        """A ranged GET's ``Content-Range`` (None: the server sent the whole object)."""
        return self.headers.get("content-range")


class S3Direct(S3Requests):
    """The direct PutObject and GetObject of `store.s3.S3Store` (see the module
    docstring)."""

    _object_base_url: str | None = None  # learnt from the client's first object request
    _object_signing: dict[str, Any] | None = None  # that request's signing context
    _last_sdk_request: tuple[str, dict[str, Any]] | None = None
    _watched_client: object | None = None
    _direct_off: bool = False

    async def _direct_put(
        self, s3: S3Client, key: str, body: bytes, headers: dict[str, str]
    ) -> str | None:
        """PUT ``body`` to ``key`` (relative to the prefix) with ``headers`` (the
        conditions); the answer's ETag as sent ("" if none: the caller refuses that as
        it refuses the client's), or None when the caller must send it through the
        client instead (the URL is not learnt yet, or a redirect answer, which applied
        nothing). Failures of the transport raise what the client's session raises; error
        answers raise the `store.errors` exception `map_error_answer` names."""
        answer = await self._direct_request(
            s3, "PutObject", key, body=body, headers=headers, accepted=()
        )
        return None if answer is None else answer.etag

    async def _direct_get(
        self, s3: S3Client, key: str, headers: Mapping[str, str], *, accepted: Collection[int]
    ) -> DirectAnswer | None:
        """GET ``key`` with ``headers`` (a range, a condition); the answer when its status
        is 2xx or in ``accepted`` (304, 416), None as `_direct_put`. A whole object's
        body is checked against the checksum S3 sends with it (a mismatch: `Unavailable`)."""
        answer = await self._direct_request(
            s3,
            "GetObject",
            key,
            body=None,
            headers={**headers, "x-amz-checksum-mode": "ENABLED"},
            accepted=accepted,
        )
        if answer is not None and answer.status == 200:
            if not answer.etag:
                raise StoreConfigError(f"get {key!r}: the server returned no ETag")
            _check_response_checksum(key, answer.headers, answer.body)
        return answer

    async def _direct_request(
        self,
        s3: S3Client,
        operation: str,
        key: str,
        *,
        body: bytes | None,
        headers: Mapping[str, str],
        accepted: Collection[int],
    ) -> DirectAnswer | None:
        base = self._object_base_url
        if base is None or self._direct_off:
            return None
        method = OPERATION_METHODS[operation]
        request = AWSRequest(
            method=method,
            url=base + percent_encode(self._root + key, safe="/~"),
            data=body,
            headers={"User-Agent": _user_agent(s3), **headers},
        )
        request.context["signing"] = dict(self._object_signing or {})
        client: Any = s3  # its private parts (`has_private_parts` checked them)
        await client._request_signer.sign(operation, request)
        sent_ns = self._clock.now_ns()
        # The session reads the whole answer before it returns; a failure while reading
        # raises as a lost answer does.
        answer = await client._endpoint.http_session.send(request.prepare())
        status, answer_headers = answer.status_code, answer.headers
        date = answer_headers.get("date")
        if date is not None:
            self.clock_offset.observe(date, sent_ns=sent_ns, answered_ns=self._clock.now_ns())
        content: bytes = await answer.content
        if status < 300 or status in accepted:
            return DirectAnswer(status, answer_headers, content)
        code, message = error_code_and_message(content[:ERROR_BODY_MAX])
        if status in _REDIRECT_STATUSES or code in _REDIRECT_CODES:
            self._direct_off = True
            log.warning(
                "s3_bucket_in_another_region",
                store=self.url,
                region=self._region,
                answer=f"{code or 'redirect'} (HTTP {status})",
                hint="set the store's region to the bucket's: requests now go through the "
                "SDK's region redirect, a little slower",
            )
            return None
        op = method.lower()  # "put" or "get", as the store names its operations
        raise map_error_answer(op, key, status, code, message, mutating=method == "PUT")

    def _learn_object_url(self, key: str) -> None:
        """After the client's PutObject or GetObject of ``key`` succeeded: remember its URL
        without the key, and its signing context. The last object request the client
        created may be another one (requests run concurrently): then nothing is learnt,
        and a later request tries again."""
        if self._object_base_url is not None or self._last_sdk_request is None:
            return
        url, signing = self._last_sdk_request
        url = url.partition("?")[0]
        suffix = percent_encode(self._root + key, safe="/~")
        if url.endswith("/" + suffix):
            self._object_signing = signing
            self._object_base_url = url[: -len(suffix)]

    def _watch_sdk_requests(self, s3: S3Client) -> None:
        if self._watched_client is s3:
            return
        self._watched_client = s3
        if not has_private_parts(s3):
            self._direct_off = True  # the client sends every request (only slower)
            return
        for operation in OPERATION_METHODS:
            s3.meta.events.register(f"request-created.s3.{operation}", self._note_sdk_request)

    def _note_sdk_request(self, request: AWSRequest, **_: Any) -> None:
        self._last_sdk_request = (str(request.url), dict(request.context.get("signing") or {}))


def _check_response_checksum(key: str, headers: Mapping[str, str], body: bytes) -> None:
    """The first whole-object checksum botocore would check (composite ones, of
    multipart objects, end in ``-N`` and are skipped as it skips them)."""
    for name, digest in _RESPONSE_CHECKSUMS.items():
        expected = headers.get(f"x-amz-checksum-{name}")
        if expected is None or "-" in expected:
            continue
        if base64.b64encode(digest(body)).decode() != expected:
            raise Unavailable(
                "get", key, f"the body does not match its x-amz-checksum-{name} (damaged)"
            )
        return


def has_private_parts(client: Any) -> bool:
    """Whether ``client`` has the request signer and HTTP session this module uses. An
    aiobotocore release that renames them leaves every request to the client, as it sends
    them today (``tests/store/test_s3_direct.py`` fails on such a release)."""
    signer = getattr(client, "_request_signer", None)
    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    return callable(getattr(signer, "sign", None)) and callable(getattr(session, "send", None))


def _user_agent(s3: Any) -> str:
    """The client's User-Agent (its creator memoizes it: `store.s3_request_cache`)."""
    creator = getattr(s3, "_user_agent_creator", None)
    return str(creator.to_string()) if creator is not None else "lightmetrics-ingest"
