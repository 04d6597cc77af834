"""`S3Store`'s signed deletes (PROTOCOL §3.5 rule 6).

`sign_delete` makes a pre-signed DELETE URL (``X-Amz-Expires``) with the client's
credentials, and `send_signed_delete` sends it once with aiohttp on a fresh connection. S3 refuses it with 403 "Request has expired" once its
clock is past ``X-Amz-Date`` + ``X-Amz-Expires`` (`RequestExpired`); other answers and
transport failures are mapped as `store.s3_requests` says (a DELETE is mutating).
"""

from __future__ import annotations

from datetime import UTC, datetime

import aiohttp
from botocore import exceptions as botoexc
from yarl import URL

from store.base import SignedDelete, check_key, check_signed_expiry
from store.errors import NotFound, RequestExpired, StoreConfigError
from store.s3_errors import ERROR_BODY_MAX, error_code_and_message, map_error_answer, map_s3_error
from store.s3_requests import S3Requests, whole_seconds_ns


class S3SignedDeletes(S3Requests):
    """The signed-delete calls of `store.s3.S3Store`."""

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


def _signed_at_ns(key: str, url: str) -> int:
    """The ``X-Amz-Date`` of a pre-signed URL: when S3 starts counting its expiry."""
    stamp = URL(url, encoded=True).query.get("X-Amz-Date", "")
    try:
        signed = datetime.strptime(stamp, "%Y%m%dT%H%M%SZ").replace(tzinfo=UTC)
    except ValueError:
        raise StoreConfigError(f"sign_delete {key!r}: no X-Amz-Date in the signed URL") from None
    return whole_seconds_ns(signed)
