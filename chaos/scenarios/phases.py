"""Fault phases the scenarios switch between (`chaos.proxy.Phase`)."""

from __future__ import annotations

from chaos.proxy import FaultKind, FaultRule, Latency, Phase

K = FaultKind
CONDITIONAL = frozenset({"put_if_none_match", "put_if_match"})
READS = frozenset({"get", "head", "list"})
QUICK = Latency("exponential", 0.005, cap_s=0.2, rate=0.5)
SLOW = Latency("lognormal", 0.05, 1.0, cap_s=1.5)


def light(name: str = "light") -> Phase:
    """Background weather: a few 409s on conditional writes, a little latency."""
    return Phase(name, (FaultRule({K.CONFLICT_409: 0.05, K.SLOWDOWN_503: 0.01}, latency=QUICK),))


STORMS: dict[str, tuple[FaultRule, ...]] = {
    "slowdown": (FaultRule({K.SLOWDOWN_503: 0.12}, latency=QUICK),),
    "lost-manifests": (
        FaultRule({K.LOST_ANSWER: 0.25, K.CONFLICT_409: 0.1}, ops=CONDITIONAL, prefix="accepted/"),
        FaultRule({K.CONFLICT_409: 0.05}, latency=QUICK),
    ),
    "lost-blobs": (
        FaultRule({K.LOST_ANSWER: 0.2, K.RESET: 0.05}, ops=CONDITIONAL, prefix="raw-blobs/"),
        FaultRule({K.CONFLICT_409: 0.05}, latency=QUICK),
    ),
    "timeouts": (
        FaultRule({K.TIMEOUT: 0.05, K.LATE_APPLY: 0.04}, ops=CONDITIONAL),
        FaultRule({K.TIMEOUT: 0.03}, ops=READS),
    ),
    "errors": (FaultRule({K.ERROR_500: 0.08, K.RESET: 0.04}, latency=QUICK),),
    "conflicts": (FaultRule({K.CONFLICT_409: 0.3}, ops=CONDITIONAL, latency=QUICK),),
    "latency": (FaultRule({}, latency=SLOW),),
    "index-lost": (
        # Collectors' log segments and the reconciler's catalog files and work markers.
        FaultRule({K.LOST_ANSWER: 0.3, K.SLOWDOWN_503: 0.3}, ops=CONDITIONAL, prefix="index/"),
        FaultRule({K.LOST_ANSWER: 0.3, K.SLOWDOWN_503: 0.3}, ops=CONDITIONAL, prefix="work/"),
    ),
    "gc-writes": (
        FaultRule(
            {K.LATE_APPLY: 0.3, K.LOST_ANSWER: 0.1}, ops=frozenset({"delete"}), prefix="raw-blobs/"
        ),
        # Low: one lost mark or log write ends the whole GC run (it retries next pass).
        FaultRule({K.LOST_ANSWER: 0.02, K.CONFLICT_409: 0.02}, ops=CONDITIONAL, prefix="gc/"),
    ),
    "rollup-commit": (
        FaultRule(
            {K.LOST_ANSWER: 0.3, K.CONFLICT_409: 0.15}, ops=CONDITIONAL, prefix="rollup/v1/_latest"
        ),
        FaultRule({K.LOST_ANSWER: 0.2}, ops=CONDITIONAL, prefix="rollup/v1/manifests/"),
        FaultRule({K.SLOWDOWN_503: 0.1}, ops=CONDITIONAL, prefix="rollup/v1/owner"),
    ),
}


def combined(*names: str) -> Phase:
    rules: tuple[FaultRule, ...] = ()
    for name in names:
        rules += STORMS[name]
    return Phase("+".join(names), rules)
