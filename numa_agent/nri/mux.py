"""NRI's connection multiplexer: several byte streams on one unix socket.

Every frame on the socket is `u32 connection id, u32 length, payload` (big
endian). Connection 1 carries the runtime's calls to the plugin (the plugin
serves ttrpc there), connection 2 the plugin's calls to the runtime
(RegisterPlugin, UpdateContainers); 0 is reserved. A connection is a byte
stream: the frames are only its pieces, and a ttrpc message may span several.

The runtime reads each connection through a 4096-byte buffer and drops the
trunk on a frame larger than that, so `encode` cuts what it sends into frames
of at most 4096 bytes. The multiplexer's own cap on a frame is 16 MiB: a
header announcing more is refused before anything is read. Like the runtime,
`Demux` drops frames for a connection nobody opened, and counts them.
"""

from __future__ import annotations

import struct

from numa_agent.nri.ttrpc import TtrpcError, half_sent

HEADER = struct.Struct(">II")
HEADER_LEN = HEADER.size  # 8
PLUGIN_SERVICE_CONN = 1  # the runtime calls, the plugin serves
RUNTIME_SERVICE_CONN = 2  # the plugin calls, the runtime serves
WRITE_CHUNK = 4096  # the runtime's read buffer for one connection
MAX_PAYLOAD = 1 << 24  # the multiplexer's own cap on one frame


class MuxError(TtrpcError):
    """The trunk broke the multiplexer's framing; one line."""


def encode(conn_id: int, data: bytes, chunk: int = WRITE_CHUNK) -> bytes:
    """`data` for connection `conn_id`, as frames of at most `chunk` bytes of payload."""
    if not 0 < conn_id < 1 << 32:
        raise ValueError(f"connection id {conn_id} is reserved or not a u32")
    view = memoryview(data)
    out = bytearray()
    for start in range(0, len(view), chunk):
        piece = view[start:start + chunk]
        out += HEADER.pack(conn_id, len(piece))
        out += piece
    return bytes(out)


class Demux:
    """Splits the trunk's bytes, fed in any pieces, into (connection id, data)
    for the connections in `open_ids`."""

    def __init__(self, open_ids: frozenset[int] = frozenset({PLUGIN_SERVICE_CONN, RUNTIME_SERVICE_CONN})) -> None:
        self.open_ids = open_ids
        self.dropped = 0  # frames for a connection nobody opened
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[tuple[int, bytes]]:
        self._buf += data
        out: list[tuple[int, bytes]] = []
        while len(self._buf) >= HEADER_LEN:
            conn_id, length = HEADER.unpack_from(self._buf)
            if length > MAX_PAYLOAD:
                raise MuxError(f"the peer announced a multiplexer frame of {length} bytes, over the limit of "
                               f"{MAX_PAYLOAD} bytes: not an NRI runtime, or a broken one")
            end = HEADER_LEN + length
            if len(self._buf) < end:
                break
            payload = bytes(self._buf[HEADER_LEN:end])
            del self._buf[:end]
            if conn_id in self.open_ids:
                out.append((conn_id, payload))
            else:
                self.dropped += 1
        return out

    def close(self) -> None:
        """The trunk closed: MuxError if it left a frame half sent."""
        if why := half_sent(self._buf, "a multiplexer frame"):
            raise MuxError(why)
