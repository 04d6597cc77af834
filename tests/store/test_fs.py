"""What only the filesystem store promises: files an operator can read, atomicity across
OS processes, hidden temporary files, S3 order from a directory walk."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from protocol.clock import ManualClock
from store.base import ObjectStore
from store.errors import NotFound, PreconditionFailed, StoreError
from store.fs import FileSystemStore, KeyPathConflict, KeySegmentTooLong

REPO = Path(__file__).resolve().parents[2]


async def _keys(store: ObjectStore, prefix: str = "", start_after: str | None = None) -> list[str]:
    return [info.key async for info in store.list(prefix, start_after)]


async def test_object_is_the_file_at_root_slash_key(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path)
    assert store.url == f"file://{tmp_path}"
    await store.put("accepted/v1/agent=61/x.json", b'{"a": 1}', if_none_match=True)
    assert (tmp_path / "accepted/v1/agent=61/x.json").read_bytes() == b'{"a": 1}'
    # And a file an operator drops in is an object.
    (tmp_path / "accepted/v1/agent=61/y.json").write_bytes(b"{}")
    assert await _keys(store) == ["accepted/v1/agent=61/x.json", "accepted/v1/agent=61/y.json"]
    assert (await store.get("accepted/v1/agent=61/y.json"))[0] == b"{}"


async def test_last_modified_comes_from_the_clock(tmp_path: Path) -> None:
    clock = ManualClock(start_ns=1_700_000_000_123_456_789)
    store = FileSystemStore(tmp_path, clock=clock)
    await store.put("k", b"x")
    assert (await store.head("k")).last_modified_ns == 1_700_000_000_123_456_789
    clock.advance(5)
    etag = (await store.head("k")).etag
    await store.put("k", b"y", if_match=etag)
    assert (await store.head("k")).last_modified_ns == 1_700_000_005_123_456_789


async def test_a_path_cannot_be_file_and_directory(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path)
    await store.put("a", b"leaf")
    with pytest.raises(KeyPathConflict):
        await store.put("a/b", b"x", if_none_match=True)
    with pytest.raises(KeyPathConflict):
        await store.put("a/b/c", b"x")
    await store.put("x/y", b"leaf")
    with pytest.raises(KeyPathConflict):
        await store.put("x", b"x", if_none_match=True)
    with pytest.raises(ValueError):  # KeyPathConflict is a ValueError: the key is the problem
        await store.put("x", b"x")
    assert await _keys(store) == ["a", "x/y"]
    assert not list((tmp_path / ".lm-store" / "tmp").iterdir())


async def test_an_empty_directory_left_behind_does_not_block_a_key(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path)
    (tmp_path / "husk" / "inner").mkdir(parents=True)
    await store.put("husk/inner", b"x", if_none_match=True)
    assert (await store.get("husk/inner"))[0] == b"x"


async def test_delete_prunes_empty_directories(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path)
    await store.put("a/b/c/d", b"x")
    await store.put("a/keep", b"x")
    await store.delete("a/b/c/d")
    assert not (tmp_path / "a" / "b").exists()
    assert (tmp_path / "a" / "keep").exists()


async def test_concurrent_deletes_in_one_directory_all_succeed(tmp_path: Path) -> None:
    # One delete may prune the directory the others' unlinks left empty before they fsync
    # it: each then makes the nearest directory still there durable, never errs.
    store = FileSystemStore(tmp_path)
    for round_ in range(20):
        names = [f"gc/marks/{round_}-{i}" for i in range(8)]
        for name in names:
            await store.put(name, b"x")
        await asyncio.gather(*(store.delete(name) for name in names))
        assert not (tmp_path / "gc").exists()


@pytest.mark.parametrize("key", [".lm-store/tmp/x", ".lm-store"])
async def test_reserved_keys_are_refused(tmp_path: Path, key: str) -> None:
    store = FileSystemStore(tmp_path)
    with pytest.raises(ValueError):
        await store.put(key, b"x")
    with pytest.raises(ValueError):
        await store.get(key)


async def test_an_overlong_segment_is_a_store_error_and_no_object_is_there(
    tmp_path: Path,
) -> None:
    """A key no file can have: put says so with a `StoreError` (callers that count store
    errors per record handle it); reads find nothing, as S3 would for a key never written."""
    store = FileSystemStore(tmp_path)
    key = "a/" + "x" * 256 + "/b"
    with pytest.raises(KeySegmentTooLong) as refused:
        await store.put(key, b"x", if_none_match=True)
    assert isinstance(refused.value, StoreError) and refused.value.key == key
    with pytest.raises(NotFound):
        await store.get(key)
    with pytest.raises(NotFound):
        await store.head(key)
    await store.delete(key)  # absent: not an error
    assert await _keys(store, "a/" + "x" * 256 + "/") == []
    await store.put("a/" + "x" * 255, b"ok", if_none_match=True)  # the longest name fits


async def test_store_bookkeeping_is_never_listed(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path)
    await store.put("k", b"x")
    assert await _keys(store, ".") == []
    assert await _keys(store, ".lm-store/") == []
    assert await _keys(store) == ["k"]


async def test_temporary_files_never_appear_in_listings(tmp_path: Path) -> None:
    store = FileSystemStore(tmp_path)
    keys = {f"w/{i % 5}/{i:04d}" for i in range(300)}
    writers_done = asyncio.Event()

    async def write() -> None:
        limit = asyncio.Semaphore(16)

        async def put(key: str) -> None:
            async with limit:
                await store.put(key, b"x" * 4096, if_none_match=True)

        await asyncio.gather(*(put(k) for k in sorted(keys)))
        writers_done.set()

    async def watch() -> int:
        listings = 0
        while not writers_done.is_set():
            seen = [info async for info in store.list("")]
            assert {info.key for info in seen} <= keys
            assert all(info.size == 4096 for info in seen)  # never a partial body
            assert [i.key for i in seen] == sorted((i.key for i in seen), key=str.encode)
            listings += 1
        return listings

    _, listings = await asyncio.gather(write(), watch())
    assert listings >= 1
    assert set(await _keys(store)) == keys
    assert not list((tmp_path / ".lm-store" / "tmp").iterdir())


_RACER = """
import asyncio, json, sys
from pathlib import Path
from store.errors import NotFound, PreconditionFailed, StoreError
from store.fs import FileSystemStore

async def main(root, name, count):
    store = FileSystemStore(Path(root))
    print("ready", flush=True)
    sys.stdin.readline()  # start together: the parent releases every racer at once
    won = []
    for i in range(count):
        key = f"race/{i % 10}/{i:04d}.json"
        try:
            await store.put(key, name.encode(), if_none_match=True)
        except PreconditionFailed:
            continue
        won.append(key)
    print(json.dumps(won))

asyncio.run(main(sys.argv[1], sys.argv[2], int(sys.argv[3])))
"""

_INCREMENTER = """
import asyncio, json, random, sys
from pathlib import Path
from protocol.clock import SystemClock
from store.cas import update_object
from store.fs import FileSystemStore
from store.retry import Backoff

async def main(root, count):
    store = FileSystemStore(Path(root))
    print("ready", flush=True)
    sys.stdin.readline()
    backoff = Backoff(attempts=10_000, base_s=0.0, cap_s=0.0)
    for _ in range(count):
        await update_object(
            store, "counter", lambda body: str(int(body or b"0") + 1).encode(),
            backoff=backoff, rng=random.Random(1), clock=SystemClock(),
        )
    print(json.dumps("done"))

asyncio.run(main(sys.argv[1], int(sys.argv[2])))
"""


def _run_together(script: str, argv_per_process: list[list[str]]) -> list[object]:
    """Start one Python process per argv, release them at once, return their JSON output."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", script, *argv],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for argv in argv_per_process
    ]
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline().strip() == "ready"
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=60)[0] for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert [proc.returncode for proc in procs] == [0] * len(procs)
    return [json.loads(out) for out in outputs]


async def test_processes_racing_to_create_have_one_winner_per_key(tmp_path: Path) -> None:
    count = 150
    names = ["p0", "p1", "p2"]
    results = await asyncio.to_thread(
        _run_together, _RACER, [[str(tmp_path), name, str(count)] for name in names]
    )
    store = FileSystemStore(tmp_path)
    all_keys = await _keys(store)
    assert len(all_keys) == count
    winners: dict[str, str] = {}
    for name, won in zip(names, results, strict=True):
        assert isinstance(won, list)
        for key in won:
            assert key not in winners, f"{key} won by {winners[key]} and {name}"
            winners[key] = name
    assert sorted(winners) == sorted(all_keys)
    for key, name in winners.items():
        assert (await store.get(key))[0] == name.encode()
    with pytest.raises(PreconditionFailed):
        await store.put(all_keys[0], b"late", if_none_match=True)


async def test_compare_and_swap_across_processes_loses_no_update(tmp_path: Path) -> None:
    per_process, processes = 40, 3
    await asyncio.to_thread(
        _run_together, _INCREMENTER, [[str(tmp_path), str(per_process)]] * processes
    )
    body, _ = await FileSystemStore(tmp_path).get("counter")
    assert int(body) == per_process * processes


# Segments over an alphabet that straddles '/': '-' and '.' sort before it, '0' and 'a'
# after, and 'é' is multi-byte.
_segments = st.text(alphabet="-.0aé", min_size=1, max_size=3).filter(lambda s: s not in (".", ".."))
_keys_strategy = st.lists(
    st.lists(_segments, min_size=1, max_size=3).map("/".join), min_size=1, max_size=25
)


def _storable(keys: list[str]) -> list[str]:
    """Drop keys that would need a path to be both a file and a directory."""
    unique = set(keys)
    return [k for k in unique if not any(other.startswith(k + "/") for other in unique)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(keys=_keys_strategy, cut=st.integers(0, 12), after_index=st.integers(-1, 30))
def test_fs_list_order_is_bytewise_key_order(keys: list[str], cut: int, after_index: int) -> None:
    stored = _storable(keys)
    ordered = sorted(stored, key=lambda k: k.encode("utf-8"))
    # A prefix cut from a stored key (so it often ends mid-segment), and a start_after
    # that is a stored key or a prefix of one.
    prefix = ordered[0][:cut]
    after = ordered[after_index % len(ordered)][: cut + 1] if after_index >= 0 else None

    async def scenario(root: Path) -> None:
        store = FileSystemStore(root)
        await asyncio.gather(*(store.put(k, k.encode()) for k in stored))
        assert await _keys(store) == ordered
        expected = [
            k
            for k in ordered
            if k.startswith(prefix) and (after is None or k.encode() > after.encode())
        ]
        assert await _keys(store, prefix, after) == expected

    with tempfile.TemporaryDirectory() as root:
        asyncio.run(scenario(Path(root)))
