#!/usr/bin/env python3
"""A stand-in "Prometheus 2.41" for the supervision test: answers ``/-/ready`` and
``/api/v1/status/buildinfo`` (version 2.41.0) on its ``--web.listen-address``; every
other flag is ignored. The supervised engine must refuse it and not restart it."""

from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, HTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        if self.path == "/-/ready":
            body = b"Prometheus Server is Ready.\n"
        elif self.path == "/api/v1/status/buildinfo":
            body = json.dumps({"status": "success", "data": {"version": "2.41.0"}}).encode()
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    flag = next(a for a in sys.argv[1:] if a.startswith("--web.listen-address="))
    host, _, port = flag.partition("=")[2].rpartition(":")
    HTTPServer((host, int(port)), Handler).serve_forever()


if __name__ == "__main__":
    main()
