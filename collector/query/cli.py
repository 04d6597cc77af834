"""``lm-collector query``: ask a collector's ``GET /v1/query`` and print the answer.

The bearer token comes from ``--token-file`` or the ``LM_TOKEN`` environment variable
(`config.tokens.client_token`), never from the command line. ``--format json`` prints
the answer as the collector sent it; ``table`` (default) prints a header line saying
whether it is complete, then the rows. Exit codes: 0 answered; 1 the collector refused
or could not be reached (its JSON error on stderr); 2 bad arguments or token file.
"""

from __future__ import annotations

import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, TextIO

from config import SettingsError
from config.tokens import client_token
from rollup.read.render import render


def add_query_command(commands: Any) -> None:
    query = commands.add_parser("query", help="read points from a collector (GET /v1/query)")
    query.add_argument("--url", default="http://127.0.0.1:8080", help="the collector's base URL")
    query.add_argument("--metric", required=True)
    query.add_argument(
        "--label", action="append", default=[], metavar="K=V", help="label filter (repeatable)"
    )
    query.add_argument("--agent", help="only this agent_id")
    query.add_argument(
        "--from", metavar="TIME", help="first time included (RFC 3339 or unix seconds)"
    )
    query.add_argument("--to", metavar="TIME", help="first time excluded (as --from; default: now)")
    query.add_argument("--step", choices=["1m"], help="one row per minute and series")
    query.add_argument("--table", choices=["points", "rollup_1m"])
    which = query.add_mutually_exclusive_group()
    which.add_argument("--version", type=int, help="committed part as of this snapshot version")
    which.add_argument("--as-of", metavar="TIME", help="committed part as of this time")
    query.add_argument("--token-file", type=Path, help="file holding the bearer token")
    query.add_argument("--format", choices=["table", "json"], default="table")
    query.add_argument("--timeout", type=float, default=60.0, help="seconds")


def query_url(args: argparse.Namespace) -> str:
    params: list[tuple[str, str]] = [("metric", args.metric)]
    params += [("label", label) for label in args.label]
    for name, value in (
        ("agent", args.agent),
        ("from", getattr(args, "from")),
        ("to", args.to),
        ("step", args.step),
        ("table", args.table),
        ("version", None if args.version is None else str(args.version)),
        ("as_of", args.as_of),
    ):
        if value is not None:
            params.append((name, value))
    return f"{args.url.rstrip('/')}/v1/query?{urllib.parse.urlencode(params)}"


def print_answer(answer: dict[str, Any], fmt: str, out: TextIO) -> None:
    if fmt == "json":
        out.write(json.dumps(answer, ensure_ascii=False) + "\n")
        return
    sources = answer.get("sources", {})
    out.write(
        f"complete={str(answer['complete']).lower()} "
        f"snapshot_version={answer['snapshot_version']} "
        f"sealed_through_ns={answer['sealed_through_ns']} "
        f"live_through_ns={answer['live_through_ns']} "
        f"snapshot_rows={sources.get('snapshot_rows')} live_rows={sources.get('live_rows')} "
        f"late_batches={sources.get('late_batches')}\n"
    )
    columns = answer["columns"]
    rows = [dict(zip(columns, row, strict=True)) for row in answer["rows"]]
    render(rows, columns, "table", out)


def run_query(args: argparse.Namespace) -> int:
    if not args.url.startswith(("http://", "https://")):
        print(
            f"lm-collector query: --url must be http:// or https://, got {args.url!r}",
            file=sys.stderr,
        )
        return 2
    try:
        token = client_token(args.token_file)
    except SettingsError as exc:
        print(f"lm-collector query: {exc}", file=sys.stderr)
        return 2
    request = urllib.request.Request(query_url(args))
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=args.timeout) as response:
            answer = json.loads(response.read())
    except urllib.error.HTTPError as exc:
        body = exc.read().decode("utf-8", "replace")
        print(f"lm-collector query: HTTP {exc.code}: {body}", file=sys.stderr)
        return 1
    except (urllib.error.URLError, OSError, ValueError) as exc:
        print(f"lm-collector query: {args.url}: {exc}", file=sys.stderr)
        return 1
    print_answer(answer, args.format, sys.stdout)
    return 0
