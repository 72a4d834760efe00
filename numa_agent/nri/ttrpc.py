"""ttrpc's framing: the RPC protocol NRI speaks inside each multiplexed connection.

Written here from the protocol's facts. A connection is a byte stream of
messages, each a 10-byte header then its payload:

    u32 length   the payload's length (big endian, as every field)
    u32 stream   the call's stream id: a client numbers its calls 1, 3, 5, ...
    u8  type     1 a request, 2 a response (3, streamed data, is not used by NRI)
    u8  flags

A request's payload is a protobuf `Request` (service, method, payload,
timeout_nano, metadata), an answer's a `Response` (a google.rpc.Status and the
payload); see ttrpc_wire.proto. ttrpc refuses a message longer than 4 MiB, and
so does this module, from the header alone, before reading it.

Everything here is pure bytes in, bytes out: `FrameReader` is fed what the
peer sent, in whatever pieces it arrived, and says what is wrong in one line
(`TtrpcError`): a length over the cap, a peer that closed mid-message, a
payload that is no protobuf message.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from numa_agent.nri import ttrpc_wire_pb2 as wire

HEADER = struct.Struct(">IIBB")
HEADER_LEN = HEADER.size  # 10
MESSAGE_LENGTH_MAX = 4 << 20  # ttrpc's own limit on a message's payload
TYPE_REQUEST = 1
TYPE_RESPONSE = 2
STREAM_ID_MAX = (1 << 32) - 1

# google.rpc.Code values ttrpc answers with.
OK = 0
INVALID_ARGUMENT = 3
DEADLINE_EXCEEDED = 4
NOT_FOUND = 5
RESOURCE_EXHAUSTED = 8
FAILED_PRECONDITION = 9
UNIMPLEMENTED = 12
INTERNAL = 13
UNAVAILABLE = 14


class TtrpcError(Exception):
    """The peer broke the protocol, or a call failed; the message is one line."""


class RemoteError(TtrpcError):
    """The peer answered a call with a non-OK status."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(f"status {code}: {message}")
        self.code = code
        self.status_message = message


@dataclass(frozen=True)
class Frame:
    stream_id: int
    type: int
    flags: int
    payload: bytes


def encode_frame(stream_id: int, type_: int, payload: bytes, flags: int = 0) -> bytes:
    if len(payload) > MESSAGE_LENGTH_MAX:
        raise TtrpcError(f"a ttrpc message of {len(payload)} bytes is over ttrpc's limit of "
                         f"{MESSAGE_LENGTH_MAX // (1 << 20)} MiB")
    if not 0 <= stream_id <= STREAM_ID_MAX:
        raise ValueError(f"stream id {stream_id} is not a u32")
    return HEADER.pack(len(payload), stream_id, type_, flags) + payload


class FrameReader:
    """Reassembles frames from a byte stream fed in any pieces."""

    def __init__(self, limit: int = MESSAGE_LENGTH_MAX) -> None:
        self.limit = limit
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        """The frames `data` completes, in order; TtrpcError when a header
        announces more than the limit (checked before the payload arrives)."""
        self._buf += data
        frames: list[Frame] = []
        while len(self._buf) >= HEADER_LEN:
            length, stream_id, type_, flags = HEADER.unpack_from(self._buf)
            if length > self.limit:
                raise TtrpcError(f"the peer announced a ttrpc message of {length} bytes, over the limit of "
                                 f"{self.limit} bytes: not a ttrpc peer, or a broken one")
            end = HEADER_LEN + length
            if len(self._buf) < end:
                break
            frames.append(Frame(stream_id, type_, flags, bytes(self._buf[HEADER_LEN:end])))
            del self._buf[:end]
        return frames

    def pending(self) -> int:
        """Bytes of an incomplete message held."""
        return len(self._buf)

    def close(self) -> None:
        """The peer closed: TtrpcError if it left a message half sent."""
        if why := half_sent(self._buf, "a ttrpc message"):
            raise TtrpcError(why)


def half_sent(buf: bytearray, what: str) -> str:
    """At the peer's close, what a reassembler of `what` (its frames) still
    holds in `buf`, emptied: why that is an error, or "" for nothing held."""
    held = len(buf)
    buf.clear()
    return f"the peer closed the connection in the middle of {what} ({held} bytes of it received)" if held else ""


def encode_request(service: str, method: str, payload: bytes, timeout_nano: int = 0,
                   metadata: dict[str, str] | None = None) -> bytes:
    request = wire.Request(service=service, method=method, payload=payload, timeout_nano=timeout_nano)
    for key, value in (metadata or {}).items():
        request.metadata.add(key=key, value=value)
    return bytes(request.SerializeToString())


def decode_request(payload: bytes) -> wire.Request:
    request = wire.Request()
    try:
        request.ParseFromString(payload)
    except DecodeError as e:
        raise TtrpcError(f"a ttrpc request that is no protobuf Request: {e}") from None
    if not request.service or not request.method:
        raise TtrpcError("a ttrpc request without a service or a method")
    return request


def encode_response(payload: bytes = b"", code: int = OK, message: str = "") -> bytes:
    response = wire.Response(payload=payload)
    if code != OK or message:
        response.status.code = code
        response.status.message = message
    return bytes(response.SerializeToString())


def decode_response(payload: bytes) -> tuple[int, str, bytes]:
    """(status code, status message, payload)."""
    response = wire.Response()
    try:
        response.ParseFromString(payload)
    except DecodeError as e:
        raise TtrpcError(f"a ttrpc response that is no protobuf Response: {e}") from None
    return response.status.code, response.status.message, bytes(response.payload)


class StreamIds:
    """A client's stream ids: odd, increasing, from 1."""

    def __init__(self) -> None:
        self._next = 1

    def next(self) -> int:
        value = self._next
        if value > STREAM_ID_MAX:
            raise TtrpcError("the connection has used up its ttrpc stream ids")
        self._next += 2
        return value
