"""ttrpc framing and NRI's multiplexer: round trips, the 4096-byte chunks,
and peers that break the protocol."""

import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from numa_agent.nri import mux, ttrpc

payloads = st.binary(max_size=20_000)


def _pieces(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts})
    bounds = [0, *points, len(data)]
    return [data[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]


@given(st.lists(st.tuples(st.integers(0, 2**32 - 1), st.sampled_from([1, 2, 3]), st.integers(0, 255), payloads),
                max_size=5), st.lists(st.integers(0, 200_000), max_size=8))
def test_ttrpc_frames_round_trip_in_any_pieces(frames, cuts):
    data = b"".join(ttrpc.encode_frame(s, t, p, f) for s, t, f, p in frames)
    reader = ttrpc.FrameReader()
    got = [f for piece in _pieces(data, cuts) for f in reader.feed(piece)]
    assert got == [ttrpc.Frame(s, t, f, p) for s, t, f, p in frames]
    reader.close()


def test_the_header_is_ten_bytes_big_endian():
    assert ttrpc.encode_frame(3, ttrpc.TYPE_REQUEST, b"ab") == b"\0\0\0\x02\0\0\0\x03\x01\x00ab"


@given(st.text(max_size=30), st.text(max_size=30), payloads, st.integers(-2**63, 2**63 - 1),
       st.dictionaries(st.text(max_size=10), st.text(max_size=10), max_size=3))
def test_requests_round_trip(service, method, payload, timeout, metadata):
    request = ttrpc.decode_request(ttrpc.encode_request(service or "s", method or "m", payload, timeout, metadata))
    assert (request.service, request.method, request.payload, request.timeout_nano) == \
        (service or "s", method or "m", payload, timeout)
    assert {kv.key: kv.value for kv in request.metadata} == metadata


@given(payloads, st.integers(0, 16), st.text(max_size=40))
def test_responses_round_trip(payload, code, message):
    assert ttrpc.decode_response(ttrpc.encode_response(payload, code, message)) == (code, message, payload)


def test_a_length_over_4_mib_is_refused_from_the_header_alone():
    reader = ttrpc.FrameReader()
    assert reader.feed(struct.pack(">IIBB", 4 << 20, 1, 1, 0) + b"x") == []  # the cap itself is allowed
    with pytest.raises(ttrpc.TtrpcError, match="over the limit"):
        ttrpc.FrameReader().feed(struct.pack(">IIBB", (4 << 20) + 1, 1, 1, 0))
    with pytest.raises(ttrpc.TtrpcError, match="4 MiB"):
        ttrpc.encode_frame(1, 1, bytes((4 << 20) + 1))


def test_a_peer_closing_mid_message_is_a_clean_error():
    reader = ttrpc.FrameReader()
    reader.feed(ttrpc.encode_frame(1, 1, b"hello")[:-2])
    with pytest.raises(ttrpc.TtrpcError, match="in the middle of a ttrpc message"):
        reader.close()


def test_garbage_is_a_clean_error():
    with pytest.raises(ttrpc.TtrpcError, match="no protobuf Request"):
        ttrpc.decode_request(b"\xff\xff\xff\xff")
    with pytest.raises(ttrpc.TtrpcError, match="without a service"):
        ttrpc.decode_request(b"")
    with pytest.raises(ttrpc.TtrpcError, match="no protobuf Response"):
        ttrpc.decode_response(b"\x0a\x05ab")


def test_client_stream_ids_are_odd_and_increasing():
    ids = ttrpc.StreamIds()
    assert [ids.next() for _ in range(4)] == [1, 3, 5, 7]


@given(st.lists(st.tuples(st.sampled_from([1, 2]), payloads), max_size=5), st.lists(st.integers(0, 200_000),
                                                                                    max_size=8))
def test_mux_round_trips_and_reassembles(messages, cuts):
    data = b"".join(mux.encode(c, p) for c, p in messages)
    demux = mux.Demux()
    got = [x for piece in _pieces(data, cuts) for x in demux.feed(piece)]
    for conn in (1, 2):
        assert b"".join(p for c, p in got if c == conn) == b"".join(p for c, p in messages if c == conn)
    demux.close()


def test_writes_are_cut_into_frames_of_at_most_4096_bytes():
    data = bytes(range(256)) * 40  # 10240 bytes
    encoded = mux.encode(2, data)
    frames = []
    while encoded:
        conn, length = struct.unpack_from(">II", encoded)
        frames.append((conn, length))
        encoded = encoded[8 + length:]
    assert frames == [(2, 4096), (2, 4096), (2, 2048)]
    assert mux.encode(1, b"") == b""


def test_frames_for_an_unknown_connection_are_dropped_and_counted():
    demux = mux.Demux()
    assert demux.feed(mux.encode(7, b"xyz") + mux.encode(1, b"ok")) == [(1, b"ok")]
    assert demux.dropped == 1


def test_an_oversized_or_cut_mux_frame_is_a_clean_error():
    with pytest.raises(mux.MuxError, match="over the limit"):
        mux.Demux().feed(struct.pack(">II", 1, (1 << 24) + 1))
    demux = mux.Demux()
    demux.feed(mux.encode(1, b"abcdef")[:-1])
    with pytest.raises(mux.MuxError, match="in the middle"):
        demux.close()
    with pytest.raises(ValueError):
        mux.encode(0, b"x")
