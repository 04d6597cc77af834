"""How a full audit visits every record, and the cursors that make it resumable.

Two walks, one per input; both hand chunks of listed records (`Listed`: key and ETag) to
the audit (``process``: catalog the ones the catalog lacks or holds otherwise, True when
every write succeeded) and keep `WalkState.cursors`, which the
audit saves in its `AuditRecord` (their meaning is below).

- `ListingWalk`: agent groups (``accepted/v1/agent=<hex>/``) discovered in key order by
  one listing of ``accepted/v1/`` that skips past large groups (`reconciler.audit.partitions.groups`),
  ``concurrency`` groups at a time (the quarantine prefix is one more group). A group of
  at most `HANDOFF_KEYS` keys comes with the keys discovery read, so it is not listed
  again; a larger one is listed lazily from its cursor. Either way it is audited in chunks
  of `CHUNK`. Memory: up to ``2 x concurrency`` handed-over groups of at most
  `HANDOFF_KEYS` keys, plus cursors for groups past the frontier, bounded by a window:
  discovery waits while it is full and some group is still in progress.
- `InventoryWalk`: the data files of an S3 Inventory report one after the other, rows in
  chunks of `CHUNK`, the cursor being the next row to read.

A chunk's cursor moves only when ``process`` reports success; a group (or file) with a
failure stops there, discovery of new groups stops, and the audit ends incomplete.

Cursors (in the audit's record, saved now and then):
- listing audits: per agent group ``accepted/v1/agent=<hex>/`` the last key audited, or
  ``"done"``; the quarantine group likewise; the discovery frontier (`FRONTIER`).
- inventory audits: ``cursors["inventory:manifest"]`` names the report, and
  ``cursors["file:<data file key>"]`` holds the next row to read, or ``"done"``.
- ``cursors[VERIFY_CURSOR]``: where blob verification stands (`reconciler.audit.blob_verify`); the
  only cursor a completed record keeps, and the one a new audit's record starts with.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from protocol import keys
from reconciler.audit.inventory import InventorySource
from reconciler.audit.partitions import SKIP_AFTER_KEYS, Group, closing, groups
from reconciler.context import ReconcilerContext
from store.base import ObjectInfo
from store.errors import StoreError
from store.lease import LeaseLost

CHUNK = 32
HANDOFF_KEYS = SKIP_AFTER_KEYS
"""Groups with at most this many keys are handed to their worker with the keys discovery
read (one list page: S3 returned them anyway)."""
DONE = "done"
FRONTIER = keys.ACCEPTED_PREFIX
"""Cursor key of the listing frontier: every agent group up to it (inclusive) is done."""
INVENTORY_CURSOR = "inventory:manifest"
"""Cursor key naming the inventory report an inventory audit reads."""
FILE_CURSOR = "file:"
"""Prefix of the cursor keys of inventory data files."""

Listed = tuple[str, str | None]
"""A listed record: its key and the ETag the listing showed (``None``: an inventory,
which has none)."""
Process = Callable[[list[Listed], bool], Awaitable[bool]]
"""Catalog what the catalog lacks (or holds otherwise) of these listed records (quarantine
records when the flag is set); True if all went well."""
Checkpoint = Callable[[], Awaitable[None]]
"""Called after a cursor moved: saves progress now and then."""
Work = tuple[str, str | None, list[Listed] | None]
"""A group for a worker: its prefix, its cursor, and its keys when discovery read them."""


@dataclass
class WalkState:
    cursors: dict[str, str]
    failed: bool = False
    stopped: bool = False
    groups_done: int = field(default=0)


class _Walk:
    def __init__(
        self, ctx: ReconcilerContext, state: WalkState, process: Process, checkpoint: Checkpoint
    ) -> None:
        self._ctx = ctx
        self._state = state
        self._process = process
        self._checkpoint = checkpoint

    async def _moved(self) -> bool:
        """After a cursor moved: checkpoint, and say whether to go on."""
        await self._checkpoint()
        if self._ctx.stopping.is_set() or self._state.stopped:
            self._state.stopped = True  # stopping, or the audit's pin lapsed
            return False
        return True

    def _fail(self, stage: str, key: str, exc: StoreError) -> None:
        self._state.failed = True
        self._ctx.metrics.store_failures.labels(stage).inc()
        self._ctx.log.warning("audit_store_failure", stage=stage, key=key, error=str(exc))


class ListingWalk(_Walk):
    """``born_before_ns``: the audit's start (store time) plus the settle margin. A listed
    record whose LastModified is later was created after the audit started: the audit
    promises nothing about it (PROTOCOL §3.7, "every record that existed at its start"),
    and the steady pass catalogs it from the log, so the audit neither reads nor checks
    it. The margin keeps the cut safe against the store-time estimate of the start (a
    lower bound, 1 s resolution, within the allowed skew). Without this, an audit over a
    busy store read and cataloged every batch accepted while it ran, in the steady pass's
    process: the catalog's lag grew to minutes (bench.steady_lag). Such a record cannot be
    a phantom either: a phantom is older than the start minus the settle margin."""

    def __init__(
        self,
        ctx: ReconcilerContext,
        state: WalkState,
        process: Process,
        checkpoint: Checkpoint,
        *,
        born_before_ns: int | None = None,
    ) -> None:
        super().__init__(ctx, state, process, checkpoint)
        self._born_before_ns = born_before_ns
        self.skipped_young = 0
        self._order: deque[str] = deque()  # groups admitted, not yet passed by the frontier
        self._finished: set[str] = set()
        self._in_flight = 0
        self._changed = asyncio.Condition()
        self._window = max(64, 4 * ctx.reconciler_settings.concurrency)

    async def run(self) -> None:
        workers = self._ctx.reconciler_settings.concurrency
        queue: asyncio.Queue[Work | None] = asyncio.Queue(maxsize=workers)
        try:
            async with asyncio.TaskGroup() as group:
                for _ in range(workers):
                    group.create_task(self._worker(queue))
                await self._discover(queue)
                for _ in range(workers):
                    await queue.put(None)  # no more groups: each worker exits on one
        except BaseExceptionGroup as errors:
            _raise_first(errors)

    async def _discover(self, queue: asyncio.Queue[Work | None]) -> None:
        cursors = self._state.cursors
        quarantine = cursors.get(keys.QUARANTINE_PREFIX)
        if quarantine != DONE:
            self._in_flight += 1
            await queue.put((keys.QUARANTINE_PREFIX, quarantine, None))
        frontier = cursors.get(FRONTIER)
        start_after = Group(frontier, None).past if frontier else None
        found = groups(
            self._ctx.store,
            keys.ACCEPTED_PREFIX,
            depth=1,
            start_after=start_after,
            max_keys=HANDOFF_KEYS,
            keep_keys=True,
        )
        try:
            async with closing(found) as listing:
                async for group in listing:
                    if self._ctx.stopping.is_set():
                        self._state.stopped = True
                        return
                    if self._state.failed or self._state.stopped:
                        return  # cannot complete this time: finish what is in hand, resume later
                    # A whole-key group (a stray key) is listed as a prefix, as it always was.
                    held: list[Listed] | None = (
                        None
                        if group.whole_key or group.infos is None
                        else [(info.key, info.etag) for info in group.infos if self._old(info)]
                    )
                    await self._admit(group.prefix, held, queue)
        except StoreError as exc:
            self._fail("audit_discovery", keys.ACCEPTED_PREFIX, exc)

    def _old(self, info: ObjectInfo) -> bool:
        """Whether the record existed when the audit started (see the class docstring)."""
        if self._born_before_ns is None or info.last_modified_ns <= self._born_before_ns:
            return True
        self.skipped_young += 1
        return False

    async def _admit(
        self, group_prefix: str, held: list[Listed] | None, queue: asyncio.Queue[Work | None]
    ) -> None:
        cursor = self._state.cursors.get(group_prefix)
        async with self._changed:
            await self._changed.wait_for(
                lambda: (
                    len(self._order) < self._window or self._in_flight == 0 or self._state.failed
                )
            )
            self._order.append(group_prefix)
            if cursor == DONE:
                self._finished.add(group_prefix)
                self._advance_frontier()
                return
            self._in_flight += 1
        await queue.put((group_prefix, cursor, held))

    async def _worker(self, queue: asyncio.Queue[Work | None]) -> None:
        while (item := await queue.get()) is not None:
            group_prefix, after, held = item
            if self._ctx.stopping.is_set():
                self._state.stopped = True
                done = False  # left for the resumed audit, untouched
            elif held is not None:
                done = await self._walk_held(group_prefix, after, held)
            else:
                done = await self._walk_group(group_prefix, after)
            async with self._changed:
                self._in_flight -= 1
                if done:
                    self._state.groups_done += 1
                    self._state.cursors[group_prefix] = DONE
                    if group_prefix != keys.QUARANTINE_PREFIX:
                        self._finished.add(group_prefix)
                        self._advance_frontier()
                self._changed.notify_all()
            await self._checkpoint()

    def _advance_frontier(self) -> None:
        cursors = self._state.cursors
        while self._order and self._order[0] in self._finished:
            passed = self._order.popleft()
            self._finished.discard(passed)
            cursors.pop(passed, None)
            cursors[FRONTIER] = passed

    async def _walk_group(self, group_prefix: str, after: str | None) -> bool:
        """Audit one group from ``after``; True when all of it was done."""
        quarantine = group_prefix == keys.QUARANTINE_PREFIX
        chunk: list[Listed] = []
        try:
            async with closing(self._ctx.store.list(group_prefix, start_after=after)) as listing:
                async for info in listing:
                    if not self._old(info):
                        continue
                    chunk.append((info.key, info.etag))
                    if len(chunk) < CHUNK:
                        continue
                    if not await self._chunk_done(group_prefix, chunk, quarantine):
                        return False
                    chunk = []
        except StoreError as exc:
            self._fail("audit_list", group_prefix, exc)
            return False
        return not chunk or await self._chunk_done(group_prefix, chunk, quarantine)

    async def _walk_held(self, group_prefix: str, after: str | None, held: list[Listed]) -> bool:
        """Audit the keys discovery read for this group (all of it, in order) past ``after``."""
        todo = [entry for entry in held if after is None or entry[0] > after]
        for start in range(0, len(todo), CHUNK):
            if not await self._chunk_done(group_prefix, todo[start : start + CHUNK], False):
                return False
        return True

    async def _chunk_done(self, group_prefix: str, chunk: list[Listed], quarantine: bool) -> bool:
        if not await self._process(chunk, quarantine):
            return False
        self._state.cursors[group_prefix] = chunk[-1][0]
        return await self._moved()


class InventoryWalk(_Walk):
    def __init__(
        self,
        ctx: ReconcilerContext,
        state: WalkState,
        process: Process,
        checkpoint: Checkpoint,
        inventory: InventorySource,
    ) -> None:
        super().__init__(ctx, state, process, checkpoint)
        self._inventory = inventory

    async def run(self) -> None:
        report = await self._inventory.report()
        for file_key in report.files:
            cursor_key = FILE_CURSOR + file_key
            state = self._state.cursors.get(cursor_key)
            if state == DONE:
                continue
            if await self._walk_file(file_key, cursor_key, int(state) if state else 0):
                self._state.cursors[cursor_key] = DONE
                self._state.groups_done += 1
            if self._state.stopped or self._ctx.stopping.is_set():
                self._state.stopped = True
                return

    async def _walk_file(self, file_key: str, cursor_key: str, skip_rows: int) -> bool:
        prefixes = (keys.ACCEPTED_PREFIX, keys.QUARANTINE_PREFIX)
        chunk: list[tuple[int, str]] = []
        try:
            rows = self._inventory.objects(file_key, prefixes, skip_rows=skip_rows)
            async with closing(rows) as listing:
                async for row, obj in listing:
                    chunk.append((row, obj.key))
                    if len(chunk) < CHUNK:
                        continue
                    if not await self._rows_done(cursor_key, chunk):
                        return False
                    chunk = []
        except StoreError as exc:
            self._fail("inventory_read", file_key, exc)
            return False
        return not chunk or await self._rows_done(cursor_key, chunk)

    async def _rows_done(self, cursor_key: str, chunk: list[tuple[int, str]]) -> bool:
        manifests: list[Listed] = [
            (key, None) for _row, key in chunk if key.startswith(keys.ACCEPTED_PREFIX)
        ]
        quarantines: list[Listed] = [
            (key, None) for _row, key in chunk if key.startswith(keys.QUARANTINE_PREFIX)
        ]
        if not (await self._process(manifests, False) and await self._process(quarantines, True)):
            return False
        self._state.cursors[cursor_key] = str(chunk[-1][0] + 1)
        return await self._moved()


def _raise_first(errors: BaseExceptionGroup[BaseException]) -> None:
    """Re-raise the most important error of a task group: losing the lease first."""
    flat: list[BaseException] = []

    def walk(group: BaseExceptionGroup[BaseException]) -> None:
        for error in group.exceptions:
            if isinstance(error, BaseExceptionGroup):
                walk(error)
            else:
                flat.append(error)

    walk(errors)
    for error in flat:
        if isinstance(error, LeaseLost):
            raise error
    raise flat[0]
