"""A child process for the kill -9 test of the audit's listing (test_audit_listing.py).

``python -m tests.reconciler.listing_child ENDPOINT BUCKET AUDIT_DIR PART_KEYS HANG_AFTER``
runs `list_for_audit` (concurrency 2, every prefix cut into the most ranges: previous
counts of a big store) on the MiniStack bucket with parts of ``PART_KEYS`` keys. Once ``HANG_AFTER`` parts are written, every later put of a part waits for ever, and
the child prints ``parts-written`` so the test kills it with SIGKILL at a known point:
mid-listing, with streams in flight and some ranges finished, others not.
"""

from __future__ import annotations

import asyncio
import sys

from reconciler.audit import listing as audit_listing
from reconciler.audit.ranges import KINDS
from store.s3 import S3Store
from tests.reconciler.counting_list_store import HangAfterParts


async def main(endpoint: str, bucket: str, audit_dir: str, part_keys: int, hang: int) -> None:
    audit_listing.PART_KEYS = part_keys
    inner = S3Store(bucket=bucket, prefix="lm", endpoint_url=endpoint)
    store = HangAfterParts(inner, audit_dir, hang)
    big: dict[str, int] = dict.fromkeys(KINDS, 10**9)
    await audit_listing.list_for_audit(store, audit_dir, concurrency=2, previous=big)
    print("finished", flush=True)  # the test fails if it gets here: it hung too late


if __name__ == "__main__":
    endpoint, bucket, audit_dir, part_keys, hang = sys.argv[1:6]
    asyncio.run(main(endpoint, bucket, audit_dir, int(part_keys), int(hang)))
