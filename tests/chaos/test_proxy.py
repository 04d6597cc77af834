"""The fault proxy: every fault kind as a real `S3Store` sees it through the proxy in
front of MiniStack, triggers, and seeded replay (the pure decisions: `test_faults`)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import pytest

from chaos.proxy import (
    CALM,
    FaultKind,
    FaultProxy,
    FaultRule,
    LostMode,
    Phase,
    Trigger,
    decide,
)
from store.errors import (
    ConditionConflict,
    NotFound,
    OutcomeUnknown,
    PreconditionFailed,
    Unavailable,
)
from tests.chaos.conftest import PREFIX, Proxied, s3_store
from tests.s3_servers import RunningServer

K = FaultKind
pytestmark = pytest.mark.s3
CREATES = frozenset({"put_if_none_match"})


def always(kind: FaultKind, ops: frozenset[str] | None = CREATES) -> Phase:
    return Phase(f"always-{kind.value}", (FaultRule({kind: 1.0}, ops=ops),))


# --- through the proxy, against MiniStack ----------------------------------------------------


async def absent(p: Proxied, key: str) -> bool:
    try:
        await p.direct.head(key)
    except NotFound:
        return True
    return False


async def test_no_fault_passes_everything_through(proxied: Proxied) -> None:
    etag = await proxied.store.put("a/b", b"hello", if_none_match=True)
    assert await proxied.store.get("a/b") == (b"hello", etag)
    info = await proxied.store.head("a/b")
    assert (info.size, info.etag) == (5, etag)
    assert [i.key async for i in proxied.store.list("a/")] == ["a/b"]
    with pytest.raises(PreconditionFailed):
        await proxied.store.put("a/b", b"again", if_none_match=True)
    await proxied.store.delete("a/b")
    assert await absent(proxied, "a/b")
    assert proxied.proxy.forwarded >= 6
    assert not proxied.proxy.injected


async def test_503_slowdown_is_unavailable_and_nothing_is_written(proxied: Proxied) -> None:
    proxied.proxy.set_phase(always(K.SLOWDOWN_503))
    with pytest.raises(Unavailable) as caught:
        await proxied.store.put("k/503", b"x", if_none_match=True)
    assert not isinstance(caught.value, OutcomeUnknown)
    assert "SlowDown" in str(caught.value)
    assert await absent(proxied, "k/503")
    proxied.proxy.set_phase(always(K.SLOWDOWN_503, ops=frozenset({"head"})))
    with pytest.raises(Unavailable):
        await proxied.store.head("k/503")


async def test_409_is_a_condition_conflict_and_nothing_is_written(proxied: Proxied) -> None:
    proxied.proxy.set_phase(always(K.CONFLICT_409, ops=None))
    with pytest.raises(ConditionConflict, match="ConditionalRequestConflict"):
        await proxied.store.put("k/409", b"x", if_none_match=True)
    assert await absent(proxied, "k/409")
    await proxied.store.put("k/plain", b"x")  # unconditional: never a 409
    assert proxied.proxy.injected[K.CONFLICT_409] == 1


@pytest.mark.parametrize("kind", [K.ERROR_500, K.RESET, K.TIMEOUT])
async def test_failures_before_forwarding_are_unknown_outcomes_not_applied(
    proxied: Proxied, kind: FaultKind
) -> None:
    proxied.proxy.set_phase(always(kind))
    with pytest.raises(OutcomeUnknown):
        await proxied.store.put(f"k/{kind.value}", b"x", if_none_match=True)
    assert await absent(proxied, f"k/{kind.value}")
    assert proxied.proxy.injected[kind] == 1


def keys_with_lost_mode(seed: int, phase: Phase, mode: LostMode) -> Iterator[str]:
    for n in range(10_000):
        key = f"k/lost-{mode}-{n}"
        if decide(seed, phase, "put_if_none_match", key, 0).lost_mode == mode:
            yield key


@pytest.mark.parametrize("mode", ["reset", "error_500", "hold"])
async def test_lost_answer_on_a_conditional_put_is_unknown_and_the_object_is_there(
    proxied: Proxied, mode: LostMode
) -> None:
    phase = always(K.LOST_ANSWER)
    proxied.proxy.set_phase(phase)
    key = next(keys_with_lost_mode(proxied.proxy.seed, phase, mode))
    with pytest.raises(OutcomeUnknown):
        await proxied.store.put(key, b"applied", if_none_match=True)
    body, _ = await proxied.direct.get(key)
    assert body == b"applied"
    proxied.proxy.set_phase(CALM)
    with pytest.raises(PreconditionFailed):  # a retry learns it was applied
        await proxied.store.put(key, b"applied", if_none_match=True)


async def test_late_apply_lands_after_the_client_gave_up(proxied: Proxied) -> None:
    proxied.proxy.set_phase(always(K.LATE_APPLY))
    with pytest.raises(OutcomeUnknown):
        await proxied.store.put("k/late", b"late", if_none_match=True)
    for _ in range(100):  # bounded: the proxy applies it within late_extra_s
        if not await absent(proxied, "k/late"):
            break
        await asyncio.sleep(0.02)
    assert (await proxied.direct.get("k/late"))[0] == b"late"


async def test_outage_resets_everything_until_it_ends(proxied: Proxied) -> None:
    await proxied.store.put("k/o", b"x")
    proxied.proxy.set_phase(Phase("down", outage=True))
    with pytest.raises(Unavailable):
        await proxied.store.get("k/o")
    with pytest.raises(OutcomeUnknown):
        await proxied.store.put("k/o2", b"x", if_none_match=True)
    proxied.proxy.set_phase(CALM)
    assert (await proxied.store.get("k/o"))[0] == b"x"
    assert proxied.proxy.injected[K.OUTAGE] == 2


async def test_the_same_seed_replays_the_same_fault_schedule(
    ministack_server: RunningServer, ministack_bucket: str
) -> None:
    phase = Phase(
        "mixed",
        (FaultRule({K.SLOWDOWN_503: 0.25, K.CONFLICT_409: 0.2, K.ERROR_500: 0.15}, ops=CREATES),),
    )
    requests = [f"k/replay-{i % 12}/{i}" for i in range(36)]

    async def schedule(seed: int, order: list[str]) -> tuple[list[tuple[str, int, str]], str]:
        proxy = FaultProxy(
            upstream=ministack_server.endpoint_url,
            seed=seed,
            bucket=ministack_bucket,
            prefix=PREFIX,
            phase=phase,
        )
        await proxy.start()
        store = s3_store(ministack_bucket, proxy.url)
        try:
            for key in order:
                try:
                    await store.put(key, b"x", if_none_match=True)
                except (Unavailable, ConditionConflict, PreconditionFailed):
                    pass
        finally:
            await store.close()
            await proxy.stop()
        faults = sorted((f.key, f.occurrence, f.kind.value) for f in proxy.faults)
        return faults, proxy.schedule_digest

    first, digest = await schedule(11, requests)
    again, digest_again = await schedule(11, requests)
    assert first == again and first
    assert digest == digest_again
    shuffled = list(requests)
    random.Random(1).shuffle(shuffled)
    reordered, _ = await schedule(11, shuffled)
    assert reordered == first  # decisions depend on the key and its occurrence, not the order
    other, other_digest = await schedule(12, requests)
    assert other != first
    assert digest != other_digest


async def test_listens_on_loopback_only() -> None:
    proxy = FaultProxy(upstream="http://127.0.0.1:9", seed=1, bucket="b")
    with pytest.raises(ValueError, match="loopback"):
        await proxy.start(host="0.0.0.0")


@pytest.mark.parametrize("when", ["before", "after"])
async def test_a_trigger_fires_once_around_its_request(proxied: Proxied, when: str) -> None:
    fired: list[str] = []

    async def action() -> None:
        fired.append(when)

    key = f"t/{when}"
    proxied.proxy.trigger(Trigger(CREATES, "t/", action, when))  # type: ignore[arg-type]
    with pytest.raises(OutcomeUnknown):  # its sender is presumed dead: the answer is dropped
        await proxied.store.put(key, b"x", if_none_match=True)
    assert fired == [when]
    assert await absent(proxied, key) == (when == "before")
    await proxied.store.put(f"{key}-again", b"x", if_none_match=True)  # fired once only
    assert fired == [when]
