"""`S3Store`'s PutObject of a small body: signed by the client, sent without its pipeline.

Why. A PutObject through the aiobotocore client costs ~0.75 ms of CPU (a 600-byte
conditional create at 32 in flight on MiniStack, with every saving of `store.s3_requests`
and `store.s3_request_cache` applied); most of it is botocore's per-request pipeline
(events, serialization, endpoint rules, the retry handler, response parsing). The
collector makes one such PUT per accepted batch (the manifest create, PROTOCOL §3.2) and
the raw write of a bundle or frame (§3.10), its largest single cost. Built here, the same
request costs ~0.35 ms (`bench/RESULTS.md`, "Direct small PUTs").

What is botocore's still, so nothing about the request S3 checks changes:

- the URL: each store's first PUT (of any size) goes through the client, and the URL it
  was sent to (the client's endpoint resolution: virtual-host or path style, region,
  FIPS, dual-stack...) is remembered without its key; later small PUTs go to ``that
  base + percent_encode(key)``, as botocore encodes a key (``safe="/~"``). (A pre-signed
  URL would not do: botocore pre-signs for S3's global endpoint.)
- the signature: the client's request signer (SigV4 with the client's credentials,
  refreshed as the client would, and the signing region its endpoint rules chose for
  that first PUT); the body's SHA-256 is signed in ``x-amz-content-sha256``, since a
  small body carries no checksum header (`store.s3_requests` "Checksums");
- the transport: the client's own HTTP session (its pool, TLS, proxies, timeouts, and the
  send-once rule of `store.s3_requests._SendOnceHTTPSession`), so a failure raises the
  same botocore exceptions `store.s3_errors.map_s3_error` maps.

What is ours: reading the answer (status, ``ETag``, the S3 error document mapped by
`store.s3_errors.map_error_answer`, ``Date`` observed for the store time as every other
answer is). Bodies of `SDK_CHECKSUM_MIN_BYTES` and more still go through the client, with
their CRC32.

A bucket in another region than configured: S3 answers a redirect or
AuthorizationHeaderMalformed, which applied nothing, so the request is sent again
through the client, whose redirector finds the bucket's region; from then on this store
sends every PUT through the client (logged once: configure the bucket's region).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import structlog
from botocore.awsrequest import AWSRequest
from botocore.utils import percent_encode

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


class S3DirectPuts(S3Requests):
    """The small-body PutObject of `store.s3.S3Store` (see the module docstring)."""

    _put_base_url: str | None = None  # learnt from the client's first PUT
    _put_signing: dict[str, Any] | None = None  # that PUT's signing context
    _last_sdk_put: tuple[str, dict[str, Any]] | None = None
    _watched_client: object | None = None
    _direct_puts_off: bool = False

    async def _direct_put(
        self, s3: S3Client, key: str, body: bytes, headers: dict[str, str]
    ) -> str | None:
        """PUT ``body`` to ``key`` (relative to the prefix) with ``headers`` (the
        conditions); the answer's ETag as sent ("" if none: the caller refuses that as
        it refuses the client's), or None when the caller must send it through the
        client instead (the URL is not learnt yet, or a redirect answer, which applied
        nothing). Failures of the transport raise what the client's session raises; error
        answers raise the `store.errors` exception `map_error_answer` names."""
        base = self._put_base_url
        if base is None or self._direct_puts_off:
            return None
        request = AWSRequest(
            method="PUT",
            url=base + percent_encode(self._root + key, safe="/~"),
            data=body,
            headers={"User-Agent": _user_agent(s3), **headers},
        )
        request.context["signing"] = dict(self._put_signing or {})
        client: Any = s3  # its private parts (`has_private_parts` checked them)
        await client._request_signer.sign("PutObject", request)
        sent_ns = self._clock.now_ns()
        # The session reads the whole answer before it returns (S3's are empty or a short
        # error document); a failure while reading raises as a lost answer does.
        answer = await client._endpoint.http_session.send(request.prepare())
        status = answer.status_code
        date = answer.headers.get("date")
        if date is not None:
            self.clock_offset.observe(date, sent_ns=sent_ns, answered_ns=self._clock.now_ns())
        if status < 300:
            return str(answer.headers.get("etag", ""))
        code, message = error_code_and_message((await answer.content)[:ERROR_BODY_MAX])
        if status in _REDIRECT_STATUSES or code in _REDIRECT_CODES:
            self._direct_puts_off = True
            log.warning(
                "s3_bucket_in_another_region",
                store=self.url,
                region=self._region,
                answer=f"{code or 'redirect'} (HTTP {status})",
                hint="set the store's region to the bucket's: PUTs now go through the "
                "SDK's region redirect, a little slower",
            )
            return None
        raise map_error_answer("put", key, status, code, message, mutating=True)

    def _learn_put_url(self, key: str) -> None:
        """After the client's PUT of ``key`` succeeded: remember its URL without the key,
        and its signing context. The last PUT the client created may be another one (PUTs
        run concurrently): then nothing is learnt, and a later PUT tries again."""
        if self._put_base_url is not None or self._last_sdk_put is None:
            return
        url, signing = self._last_sdk_put
        url = url.partition("?")[0]
        suffix = percent_encode(self._root + key, safe="/~")
        if url.endswith("/" + suffix):
            self._put_signing = signing
            self._put_base_url = url[: -len(suffix)]

    def _watch_sdk_puts(self, s3: S3Client) -> None:
        if self._watched_client is s3:
            return
        self._watched_client = s3
        if not has_private_parts(s3):
            self._direct_puts_off = True  # the client sends every PUT (only slower)
            return
        s3.meta.events.register("request-created.s3.PutObject", self._note_sdk_put)

    def _note_sdk_put(self, request: AWSRequest, **_: Any) -> None:
        self._last_sdk_put = (str(request.url), dict(request.context.get("signing") or {}))


def has_private_parts(client: Any) -> bool:
    """Whether ``client`` has the request signer and HTTP session this module uses. An
    aiobotocore release that renames them leaves every PUT to the client, as it sends
    them today (``tests/store/test_s3_direct_put.py`` fails on such a release)."""
    signer = getattr(client, "_request_signer", None)
    session = getattr(getattr(client, "_endpoint", None), "http_session", None)
    return callable(getattr(signer, "sign", None)) and callable(getattr(session, "send", None))


def _user_agent(s3: Any) -> str:
    """The client's User-Agent (its creator memoizes it: `store.s3_request_cache`)."""
    creator = getattr(s3, "_user_agent_creator", None)
    return str(creator.to_string()) if creator is not None else "lightmetrics-ingest"
