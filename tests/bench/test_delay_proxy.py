"""The benchmarks' delay proxy (`bench.delay_proxy`): every byte reaches the server, in
order, at least the delay late, with a bounded delay line (a large upload through a slow
receiver neither stalls nor is held whole)."""

from __future__ import annotations

import hashlib
import socket
import threading
import time
from pathlib import Path

from bench.delay_proxy import start_delay_proxy

BODY = bytes(range(256)) * (32 * 1024)  # 8 MiB: far more than the line holds (64 x 64 KiB)


def _digest_server(sock: socket.socket, out: dict[str, object]) -> None:
    """Accept one connection, read to EOF slowly, answer the SHA-256 of what came."""
    conn, _ = sock.accept()
    with conn:
        digest, first_at = hashlib.sha256(), None
        while chunk := conn.recv(1 << 14):
            first_at = first_at or time.monotonic()
            digest.update(chunk)
            time.sleep(0.0005)  # a slow receiver: the line fills up
        out["first_at"] = first_at
        conn.sendall(digest.hexdigest().encode())


def test_every_byte_arrives_in_order_and_late(tmp_path: Path) -> None:
    server = socket.create_server(("127.0.0.1", 0))
    out: dict[str, object] = {}
    thread = threading.Thread(target=_digest_server, args=(server, out), daemon=True)
    thread.start()
    proxy = start_delay_proxy(
        upstream_port=server.getsockname()[1], delay_ms=200, work_dir=tmp_path
    )
    try:
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=60) as client:
            sent_at = time.monotonic()
            client.sendall(BODY)
            client.shutdown(socket.SHUT_WR)
            answer = b""
            while chunk := client.recv(128):
                answer += chunk
    finally:
        proxy.stop()
        server.close()
    thread.join(timeout=10)
    assert answer.decode() == hashlib.sha256(BODY).hexdigest()
    assert isinstance(out["first_at"], float) and out["first_at"] - sent_at >= 0.2
