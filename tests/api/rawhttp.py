"""Send raw bytes to a Unix socket and parse the HTTP answer (for hostile-input tests)."""

from __future__ import annotations

import json
import socket


def send_raw(path: str, data: bytes, timeout: float = 5.0) -> tuple[int, dict]:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(path)
    try:
        try:
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        sock.close()
    raw = b"".join(chunks)
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ")[1])
    return status, json.loads(body) if body else {}


def post(path: str, body: bytes, target: str = "/v1/workloads") -> tuple[int, dict]:
    head = (f"POST {target} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode()
    return send_raw(path, head + body)
