"""`PolicyStore`: an `ObjectStore` that enforces the shipped IAM documents for one role.

MiniStack and the memory store do not evaluate IAM, so a delete the code makes through
the wrong role's client would only fail in production (S3 answers 403 AccessDenied, which
`store.s3.S3Store` raises as `StoreConfigError`). This wrapper asks the evaluator of
`tests.deploy.deploy_files` before every request, as S3 would for the role's session, and
refuses the same way. Every refusal is also kept in ``denied`` (code that swallows an
error must still fail the test).

Requests map to actions as S3 authorizes them: GET (ranged too) and HEAD →
``s3:GetObject``; PUT → ``s3:PutObject`` (``s3:if-none-match`` in the context for a
create with If-None-Match);
LIST → ``s3:ListBucket`` on the bucket with ``s3:prefix``; DELETE and a pre-signed DELETE
(authorized as its signer, checked when sent) → ``s3:DeleteObject``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from store.base import ObjectInfo, ObjectStore, SignedDelete
from store.errors import StoreConfigError
from tests.deploy.deploy_files import role_may


class PolicyStore:
    def __init__(self, inner: ObjectStore, role: str, *, bucket: str, prefix: str) -> None:
        self.inner = inner
        self.url = inner.url
        self.role = role
        self._bucket = bucket
        self._prefix = prefix.strip("/")
        self.denied: list[str] = []

    def _object_arn(self, key: str) -> str:
        return f"arn:aws:s3:::{self._bucket}/{self._prefix}/{key}"

    def _check(
        self, action: str, key: str, resource: str, extra: dict[str, str] | None = None
    ) -> None:
        if not role_may(self.role, action, resource, extra=extra):
            denial = f"{self.role} may not {action} {key!r}"
            self.denied.append(denial)
            raise StoreConfigError(f"AccessDenied (HTTP 403): {denial}")

    async def get(self, key: str) -> tuple[bytes, str]:
        self._check("s3:GetObject", key, self._object_arn(key))
        return await self.inner.get(key)

    async def get_range(self, key: str, offset: int, length: int) -> bytes:
        self._check("s3:GetObject", key, self._object_arn(key))  # a ranged GET is a GET
        return await self.inner.get_range(key, offset, length)

    async def head(self, key: str) -> ObjectInfo:
        self._check("s3:GetObject", key, self._object_arn(key))
        return await self.inner.head(key)

    async def put(
        self, key: str, body: bytes, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        extra = {"s3:if-none-match": "*"} if if_none_match else {}
        self._check("s3:PutObject", key, self._object_arn(key), extra)
        return await self.inner.put(key, body, if_none_match=if_none_match, if_match=if_match)

    async def put_file(
        self, key: str, path: str, *, if_none_match: bool = False, if_match: str | None = None
    ) -> str:
        # A multipart upload is s3:PutObject too (its abort: s3:AbortMultipartUpload).
        extra = {"s3:if-none-match": "*"} if if_none_match else {}
        self._check("s3:PutObject", key, self._object_arn(key), extra)
        self._check("s3:AbortMultipartUpload", key, self._object_arn(key))
        return await self.inner.put_file(key, path, if_none_match=if_none_match, if_match=if_match)

    def list(self, prefix: str, start_after: str | None = None) -> AsyncIterator[ObjectInfo]:
        self._check(
            "s3:ListBucket",
            prefix,
            f"arn:aws:s3:::{self._bucket}",
            {"s3:prefix": f"{self._prefix}/{prefix}"},
        )
        return self.inner.list(prefix, start_after)

    def common_prefixes(self, prefix: str) -> AsyncIterator[str]:
        self._check(
            "s3:ListBucket",
            prefix,
            f"arn:aws:s3:::{self._bucket}",
            {"s3:prefix": f"{self._prefix}/{prefix}"},
        )
        return self.inner.common_prefixes(prefix)

    async def delete(self, key: str) -> None:
        self._check("s3:DeleteObject", key, self._object_arn(key))
        await self.inner.delete(key)

    async def sign_delete(self, key: str, *, expires_in_s: int) -> SignedDelete:
        return await self.inner.sign_delete(key, expires_in_s=expires_in_s)

    async def send_signed_delete(self, request: SignedDelete) -> None:
        self._check("s3:DeleteObject", request.key, self._object_arn(request.key))
        await self.inner.send_signed_delete(request)

    async def close(self) -> None:
        await self.inner.close()
