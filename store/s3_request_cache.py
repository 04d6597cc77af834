"""Per-request work of a botocore S3 client that can be done once per client.

Measured on this machine (botocore 1.43, aiobotocore 3.9; `bench.ingest --profile`):
every request rebuilds its ``User-Agent`` string from scratch (~67 µs: OS, language,
config and feature components, sanitized one by one) and resolves the endpoint ruleset's
parameters (~52 µs: an event, then every one of the ruleset's 17 parameters looked up in
the operation, its arguments, the client context and the builtins). For the collector's
two PUTs per batch that is ~0.24 ms of CPU, ~5 % of a batch.

Both results depend on few inputs, so both are memoized on the client, keyed by exactly
those inputs, and each cache is bounded:

- the User-Agent string: by the set of feature ids the request registered (botocore's
  context) and the client's own; everything else in it is fixed per client;
- the endpoint parameters: by the operation, the values of its arguments that are
  ruleset context parameters except ``Key`` (which is looked up fresh for every
  request, so a key-dependent rule still sees it), and the builtins after the
  ``before-endpoint-resolution`` hooks ran (those hooks, e.g. the region-redirect
  cache, still run on every request). Operations with JMESPath context parameters and
  builtins given as callables are never cached (builtins the ruleset does not read, such
  as botocore's lazily resolved account ID, are left out of both). The endpoint provider's own resolution
  of the parameters runs as before (botocore memoizes it).

Nothing about the requests changes: the same headers, URL and signature. Both patches
reach into private attributes; when a botocore release renames them, the client is left
unpatched (and only slower).
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from aiobotocore._helpers import resolve_awaitable  # type: ignore[import-untyped]
from botocore.context import get_context

MAX_CACHED = 256  # distinct (operation, bucket, builtins) or feature sets; then cleared


def speed_up_client(client: Any) -> list[str]:
    """Memoize ``client``'s per-request User-Agent and endpoint-parameter work; returns
    the names of the patches applied."""
    applied = []
    if _cache_user_agent(client):
        applied.append("user_agent")
    if _cache_endpoint_params(client):
        applied.append("endpoint_params")
    return applied


def _cache_user_agent(client: Any) -> bool:
    creator = getattr(client, "_user_agent_creator", None)
    build = getattr(creator, "to_string", None)
    if creator is None or build is None or not hasattr(creator, "_client_features"):
        return False
    cache: dict[Hashable, str] = {}

    def to_string() -> str:
        context = get_context()
        features = frozenset(() if context is None else context.features)
        key = (features, frozenset(creator._client_features or ()))
        text = cache.get(key)
        if text is None:
            if len(cache) >= MAX_CACHED:
                cache.clear()
            text = cache[key] = build()
        return text

    creator.to_string = to_string  # the request-created handler calls self.to_string()
    return True


_RESOLVER_PARTS = (
    "_get_customized_builtins",
    "_param_definitions",
    "_resolve_param_from_context",
    "_resolve_param_as_builtin",
    "_register_endpoint_feature_ids",
    "_get_dynamic_context_params",
)
_FRESH_PARAMS = ("Key",)  # looked up for every request, never part of the cache key


def _cache_endpoint_params(client: Any) -> bool:
    resolver = getattr(client, "_ruleset_resolver", None)
    if resolver is None or not all(hasattr(resolver, part) for part in _RESOLVER_PARTS):
        return False
    original = resolver._get_provider_params
    cache: dict[Hashable, dict[str, Any]] = {}
    read = {
        str(getattr(d.builtin, "value", d.builtin))
        for d in resolver._param_definitions.values()
        if d.builtin is not None
    }

    def _read_by_ruleset(builtins: dict[Any, Any]) -> dict[Any, Any]:
        """The builtins the ruleset's parameters read, the only ones that decide them.
        botocore 1.37+ adds the account ID as a callable (resolved lazily, for
        account-based endpoints) that S3's ruleset never reads: left in, it made every
        request uncacheable (measured: the full resolution on every request)."""
        return {k: v for k, v in builtins.items() if str(getattr(k, "value", k)) in read}

    async def get_provider_params(
        operation_model: Any, call_args: dict[str, Any], request_context: dict[str, Any]
    ) -> dict[str, Any]:
        if getattr(operation_model, "operation_context_parameters", None):
            params: dict[str, Any] = await original(operation_model, call_args, request_context)
            return params
        builtins = _read_by_ruleset(
            await resolver._get_customized_builtins(operation_model, call_args, request_context)
        )
        if any(callable(value) for value in builtins.values()):
            return await _provider_params(resolver, operation_model, call_args, builtins)
        dynamic = resolver._get_dynamic_context_params(operation_model)
        try:
            key = (
                operation_model.name,
                tuple(
                    (name, call_args.get(member))
                    for name, member in sorted(dynamic.items())
                    if name not in _FRESH_PARAMS
                ),
                frozenset(builtins.items()),
            )
            cached = cache.get(key)
        except TypeError:  # an unhashable argument or builtin: not cacheable
            return await _provider_params(resolver, operation_model, call_args, builtins)
        if cached is None:
            params = await _provider_params(resolver, operation_model, call_args, builtins)
            if len(cache) >= MAX_CACHED:
                cache.clear()
            cache[key] = {k: v for k, v in params.items() if k not in _FRESH_PARAMS}
            return params
        params = dict(cached)
        for name in _FRESH_PARAMS:
            if name in resolver._param_definitions:
                value = resolver._resolve_param_from_context(name, operation_model, call_args)
                if value is not None:
                    params[name] = value
        for name, value in params.items():  # the User-Agent's feature ids, as botocore does
            resolver._register_endpoint_feature_ids(name, value)
        return params

    resolver._get_provider_params = get_provider_params
    return True


async def _provider_params(
    resolver: Any, operation_model: Any, call_args: dict[str, Any], builtins: dict[str, Any]
) -> dict[str, Any]:
    """aiobotocore's `_get_provider_params` after its builtins step (same order, same
    feature ids)."""
    params: dict[str, Any] = {}
    for name, definition in resolver._param_definitions.items():
        value = resolver._resolve_param_from_context(name, operation_model, call_args)
        if value is None and definition.builtin is not None:
            value = await resolve_awaitable(
                resolver._resolve_param_as_builtin(
                    builtin_name=definition.builtin, builtins=builtins
                )
            )
        if value is not None:
            params[name] = value
            resolver._register_endpoint_feature_ids(name, value)
    return params
