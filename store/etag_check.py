"""Do the store's ETags attest an object? (PROTOCOL §3.6, §3.7)

The steady pass catalogs a collector's own create without reading it back, on the word of
the ETag the store answered for that PUT; a full audit later compares that ETag with the
one its LIST shows. Both only work on a store whose PUT, HEAD and LIST answers give one
object the same ETag (after `normalized_etag`), and whose LIST shows a completed PUT.

`check_etags` creates a fresh probe object, compares the three ETags and looks for it in a
LIST of its own key, then deletes it. Collectors refuse a store whose LIST misses the
object; the reconciler reads back every record on a store whose ETags disagree, and says
so in ``lm-reconciler status``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from .base import ObjectStore
from .errors import StoreError


def normalized_etag(etag: str | None) -> str | None:
    """An ETag without surrounding quotes or a weak ``W/`` prefix."""
    if etag is None:
        return None
    return etag.removeprefix("W/").strip('"')


@dataclass(frozen=True, slots=True)
class EtagCheck:
    agree: bool
    """PUT, HEAD and LIST gave the probe object one ETag."""
    listed: bool
    """A LIST made after the PUT showed the object."""
    detail: str


async def check_etags(store: ObjectStore, probe_prefix: str) -> EtagCheck:
    """Create ``<probe_prefix><uuid>``, compare its ETags, delete it. Raises `StoreError`
    when the store does not answer (nothing concluded)."""
    key = f"{probe_prefix}etag-{uuid.uuid4().hex}"
    put_etag = await store.put(key, b'{"probe": "etag"}', if_none_match=True)
    try:
        head_etag = (await store.head(key)).etag
        listed = [info.etag async for info in store.list(key) if info.key == key]
    finally:
        try:
            await store.delete(key)
        except StoreError:
            pass  # a leftover probe object is harmless
    if not listed:
        return EtagCheck(False, False, f"a LIST after the PUT of {key!r} did not show it")
    seen = {"PUT": put_etag, "HEAD": head_etag, "LIST": listed[0]}
    distinct = {normalized_etag(etag) for etag in seen.values()}
    if len(distinct) != 1:
        return EtagCheck(False, True, f"ETags of one object differ: {seen}")
    return EtagCheck(True, True, "PUT, HEAD and LIST give one ETag")
