"""A fake NRI runtime, written from the protocol: it listens on a unix socket,
accepts a plugin, and speaks the multiplexer and ttrpc with its own struct
packing (not numa_agent.nri's framing, so a mistake there is not mirrored here)."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field

from numa_agent.nri import nri_api_pb2 as api
from numa_agent.nri import ttrpc_wire_pb2 as wire

PLUGIN_CONN, RUNTIME_CONN = 1, 2


@dataclass
class Message:
    conn: int
    stream_id: int
    type: int
    flags: int
    payload: bytes


@dataclass
class FakeRuntime:
    path: str
    listener: socket.socket = field(init=False)
    conn: socket.socket | None = None
    frame_sizes: list[int] = field(default_factory=list)  # payload sizes of the plugin's mux frames
    _buf: bytes = b""
    _streams: dict[int, bytes] = field(default_factory=lambda: {PLUGIN_CONN: b"", RUNTIME_CONN: b""})
    _next_stream: int = 1

    def __post_init__(self) -> None:
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.path)
        self.listener.listen(1)

    def accept(self, timeout: float = 10) -> None:
        self.listener.settimeout(timeout)
        self.conn, _ = self.listener.accept()
        self.conn.settimeout(timeout)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.listener.close()

    # --- raw bytes

    def send_raw(self, data: bytes) -> None:
        assert self.conn is not None
        self.conn.sendall(data)

    def send_mux(self, conn_id: int, data: bytes, chunk: int = 4096) -> None:
        for start in range(0, max(len(data), 1), chunk):
            piece = data[start:start + chunk]
            self.send_raw(struct.pack(">II", conn_id, len(piece)) + piece)

    def send_ttrpc(self, conn_id: int, stream_id: int, type_: int, payload: bytes) -> None:
        self.send_mux(conn_id, struct.pack(">IIBB", len(payload), stream_id, type_, 0) + payload)

    def _recv_mux(self) -> None:
        assert self.conn is not None
        while len(self._buf) < 8 or len(self._buf) < 8 + struct.unpack_from(">II", self._buf)[1]:
            data = self.conn.recv(65536)
            if not data:
                raise EOFError("the plugin closed the connection")
            self._buf += data
        conn_id, length = struct.unpack_from(">II", self._buf)
        self.frame_sizes.append(length)
        self._streams[conn_id] += self._buf[8:8 + length]
        self._buf = self._buf[8 + length:]

    def read_message(self) -> Message:
        while True:
            for conn_id, data in self._streams.items():
                if len(data) >= 10:
                    length, stream_id, type_, flags = struct.unpack_from(">IIBB", data)
                    if len(data) >= 10 + length:
                        self._streams[conn_id] = data[10 + length:]
                        return Message(conn_id, stream_id, type_, flags, data[10:10 + length])
            self._recv_mux()

    # --- calls

    def expect_register(self) -> api.RegisterPluginRequest:
        """Reads the plugin's RegisterPlugin on connection 2 and accepts it."""
        m = self.read_message()
        assert (m.conn, m.type) == (RUNTIME_CONN, 1)
        assert m.stream_id % 2 == 1
        request = wire.Request.FromString(m.payload)
        assert (request.service, request.method) == ("nri.pkg.api.v1alpha1.Runtime", "RegisterPlugin")
        self.send_ttrpc(RUNTIME_CONN, m.stream_id, 2, wire.Response(payload=api.Empty().SerializeToString())
                        .SerializeToString())
        return api.RegisterPluginRequest.FromString(request.payload)

    def send_call(self, method: str, message, service: str = "nri.pkg.api.v1alpha1.Plugin",
                  timeout_nano: int = 2_000_000_000) -> int:
        stream_id = self._next_stream
        self._next_stream += 2
        request = wire.Request(service=service, method=method, payload=message.SerializeToString(),
                               timeout_nano=timeout_nano)
        self.send_ttrpc(PLUGIN_CONN, stream_id, 1, request.SerializeToString())
        return stream_id

    def read_answer(self, stream_id: int) -> wire.Response:
        m = self.read_message()
        assert (m.conn, m.type, m.stream_id) == (PLUGIN_CONN, 2, stream_id)
        return wire.Response.FromString(m.payload)

    def read_answers(self, count: int) -> dict[int, wire.Response]:
        """The next `count` answers on connection 1, by stream id, in whatever order they came."""
        answers = {}
        for _ in range(count):
            m = self.read_message()
            assert (m.conn, m.type) == (PLUGIN_CONN, 2)
            answers[m.stream_id] = wire.Response.FromString(m.payload)
        return answers

    def call(self, method: str, message, response_type=None, **kw):
        """(status code, status message, the decoded answer or None)."""
        response = self.read_answer(self.send_call(method, message, **kw))
        decoded = response_type.FromString(response.payload) if response_type and not response.status.code \
            else None
        return response.status.code, response.status.message, decoded
