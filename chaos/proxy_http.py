"""What the fault proxy (`chaos.proxy`) says on the wire besides forwarding: S3-shaped
error answers, a reset connection (RST, as a crashed server gives), and the headers it
never forwards (hop-by-hop, and those it recomputes)."""

from __future__ import annotations

import socket
import struct
import uuid

from aiohttp import web

# Hop-by-hop headers (RFC 9110 §7.6.1) and the ones the proxy recomputes. ``Expect`` is
# handled by this server (100 Continue) and not signed by SigV4; forwarding it would make
# the upstream client wait for a second 100.
REQUEST_HEADERS_DROPPED = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "content-length",
    }
)
RESPONSE_HEADERS_DROPPED = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "upgrade", "date", "server"}
)


def s3_error(request: web.Request, status: int, code: str, message: str) -> web.Response:
    request_id = uuid.uuid4().hex[:16].upper()
    headers = {"x-amz-request-id": request_id, "Content-Type": "application/xml"}
    if status == 503:
        headers["Retry-After"] = "1"
    if request.method == "HEAD":  # S3 sends no body with a HEAD error
        return web.Response(status=status, headers=headers)
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message>"
        f"<Resource>{request.rel_url.path}</Resource><RequestId>{request_id}</RequestId></Error>"
    )
    return web.Response(status=status, headers=headers, body=body.encode())


def reset_connection(request: web.Request) -> web.StreamResponse:
    """Reset the client's connection (RST, not FIN) and hand aiohttp a response it can
    no longer send."""
    transport = request.transport
    if transport is not None and not transport.is_closing():
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass  # already gone: closing is enough
        transport.abort()
    return web.Response(status=500)
