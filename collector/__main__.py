"""``lm-collector``: serve, probe the store, list conflicts, make tokens, query points.

Exit codes: 0 success, 1 runtime failure (store unreachable, probe failed), 2 bad
configuration or arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from pathlib import Path

from config import Settings, SettingsError, configure_logging, generate_token
from config.cli import add_settings_flags, settings_from_flags
from store.errors import StoreConfigError, StoreError
from store.open import open_store_from_settings

from .conflicts_api import DEFAULT_CONFLICTS_LIMIT, ConflictQuery, read_conflicts_page
from .probe import ProbeFailed, probe_for
from .promql.config_cli import add_promql_config_command, run_promql_config
from .query.cli import add_query_command, run_query
from .server import serve
from .startup_checks import StartupError


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="lm-collector", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    serve_cmd = commands.add_parser("serve", help="accept batches over HTTP")
    serve_cmd.add_argument(
        "--workers", type=int, default=1, help="worker processes sharing the port (SO_REUSEPORT)"
    )
    serve_cmd.add_argument(
        "--ready-file", type=Path, help="write {host, port, pid} JSON here once listening"
    )
    commands.add_parser("probe", help="check that the configured store enforces conditional writes")
    conflicts = commands.add_parser(
        "conflicts", help="list identity conflicts (quarantine records) from the store"
    )
    conflicts.add_argument("--agent-id")
    conflicts.add_argument("--limit", type=int, default=100)
    token = commands.add_parser("token", help="generate a bearer token and its tokens-file entry")
    token.add_argument("name")
    token.add_argument(
        "--agents", nargs="*", default=["*"], help="glob patterns of agent_id it may write"
    )
    token.add_argument("--admin", action="store_true")
    token.add_argument(
        "--read", action="store_true", help="may read points (GET /v1/query, lm-collector query)"
    )
    add_query_command(commands)
    add_promql_config_command(commands)
    add_settings_flags(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "query":  # a client: needs no settings
        return run_query(args)
    if args.command == "token":
        generated = generate_token(args.name, args.agents, admin=args.admin, read=args.read)
        print("# bearer token (give it to the agent; it is not stored anywhere):")
        print(f"# {generated.token}")
        print(generated.toml)
        return 0
    try:
        settings = settings_from_flags(args)
    except SettingsError as exc:
        print(f"lm-collector: configuration error:\n{exc}", file=sys.stderr)
        return 2
    configure_logging(settings.logging)
    if args.command == "promql-config":
        try:
            return run_promql_config(args, settings)
        except (ValueError, OSError) as exc:
            print(f"lm-collector promql-config: {exc}", file=sys.stderr)
            return 2
    try:
        if args.command == "serve":
            return serve(
                settings,
                config_path=str(args.config) if args.config else None,
                workers=args.workers,
                ready_file=args.ready_file,
            )
        if args.command == "probe":
            return asyncio.run(_probe(settings))
        return asyncio.run(_conflicts(settings, args.agent_id, args.limit))
    except (StartupError, SettingsError) as exc:
        print(f"lm-collector: refusing to start: {exc}", file=sys.stderr)
        return 2
    except StoreConfigError as exc:
        print(
            f"lm-collector: the object store refuses us (credentials, policy or bucket?): {exc}",
            file=sys.stderr,
        )
        return 2
    except ProbeFailed as exc:
        print(f"lm-collector: conditional-write probe failed: {exc}", file=sys.stderr)
        return 1
    except StoreError as exc:
        print(f"lm-collector: object store unavailable: {exc}", file=sys.stderr)
        return 1


async def _probe(settings: Settings) -> int:
    store = open_store_from_settings(settings.store)
    try:
        result = await probe_for(store, settings)
    finally:
        await store.close()
    print(f"probe passed: {result.store_url}: {result.detail}")
    return 0


async def _conflicts(settings: Settings, agent_id: str | None, limit: int) -> int:
    """Up to ``limit`` conflicts, a page of `read_conflicts_page` at a time (as
    ``GET /v1/conflicts`` answers them), following each page's ``next``."""
    store = open_store_from_settings(settings.store)
    shown = 0
    after: str | None = None
    try:
        while shown < limit:
            page = await read_conflicts_page(
                store,
                ConflictQuery(agent_id, None, min(limit - shown, DEFAULT_CONFLICTS_LIMIT), after),
            )
            for conflict in page.conflicts:
                print(json.dumps(conflict))
            shown += len(page.conflicts)
            after = page.next
            if after is None:
                break
        if after is not None:
            print("... more (raise --limit to see them)", file=sys.stderr)
    finally:
        await store.close()
    print(f"{shown} identity conflict(s)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
