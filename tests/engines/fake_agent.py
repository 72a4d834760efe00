"""A stand-in agent on a Unix socket for the hook's tests: records each request and answers
what the test set (the real agent's admission is tested elsewhere and in the guest)."""

from __future__ import annotations

import json
import socket
import threading


class FakeAgent:
    def __init__(self, path: str) -> None:
        self.path = path
        self.requests: list[tuple[str, str, dict | None]] = []
        self.answer: tuple[int, dict] = (201, {"name": "x"})
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(path)
        self._sock.listen(8)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            with conn:
                self._one(conn)

    def _one(self, conn: socket.socket) -> None:
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = conn.recv(65536)
            if not chunk:
                return
            data += chunk
        head, _, body = data.partition(b"\r\n\r\n")
        lines = head.decode().split("\r\n")
        method, path, _ = lines[0].split(" ", 2)
        length = next((int(v) for k, _, v in (line.partition(":") for line in lines[1:])
                       if k.strip().lower() == "content-length"), 0)
        while len(body) < length:
            body += conn.recv(65536)
        self.requests.append((method, path, json.loads(body) if length else None))
        status, answer = self.answer
        payload = json.dumps(answer).encode()
        conn.sendall(f"HTTP/1.1 {status} X\r\nContent-Type: application/json\r\n"
                     f"Content-Length: {len(payload)}\r\n\r\n".encode() + payload)

    def close(self) -> None:
        self._sock.close()
