"""The one Kafka frame reader (quorum.kafka.frames), as the node's listener and the operator's
client use it: limits checked before the body is read, the deadlines, and the end of stream."""

from __future__ import annotations

import asyncio
import struct

import pytest

from quorum.kafka.frames import FrameIdle, FrameSizeError, FrameStalled, read_frame


def _reader(data: bytes, eof: bool = True) -> asyncio.StreamReader:
    r = asyncio.StreamReader()
    r.feed_data(data)
    if eof:
        r.feed_eof()
    return r


def test_a_frame_is_read_and_the_next_one_follows() -> None:
    async def go() -> list[bytes]:
        r = _reader(struct.pack(">i", 3) + b"abc" + struct.pack(">i", 8) + b"12345678")
        return [await read_frame(r, min_size=1, max_size=8) for _ in range(2)]

    assert asyncio.run(go()) == [b"abc", b"12345678"]


@pytest.mark.parametrize("size", [0, -1, 7, 9, 1 << 30])
def test_a_size_outside_the_limits_is_refused_before_the_body_is_read(size: int) -> None:
    async def go() -> tuple[FrameSizeError, int]:
        body = b"x" * 16
        r = _reader(struct.pack(">i", size) + body)
        with pytest.raises(FrameSizeError) as e:
            await read_frame(r, min_size=8, max_size=8)
        return e.value, len(await r.read())

    err, left = asyncio.run(go())
    assert err.size == size and f"frame of {size} bytes" in str(err) and "8 to 8" in str(err)
    assert left == 16  # nothing of the body was consumed


def test_the_idle_and_the_body_deadlines_are_told_apart() -> None:
    async def go() -> tuple[str, str]:
        with pytest.raises(FrameIdle) as idle:
            await read_frame(_reader(b"", eof=False), min_size=1, max_size=10, idle_timeout=0.05)
        stalled_reader = _reader(struct.pack(">i", 10) + b"abc", eof=False)
        with pytest.raises(FrameStalled) as stalled:
            await read_frame(stalled_reader, min_size=1, max_size=10, read_timeout=0.05)
        return str(idle.value), str(stalled.value)

    idle, stalled = asyncio.run(go())
    assert idle.startswith("idle for")
    assert stalled.startswith("a 10-byte frame not received within")


@pytest.mark.parametrize("data", [b"", b"\0\0", struct.pack(">i", 5) + b"ab"])
def test_the_end_of_the_stream_is_an_incomplete_read(data: bytes) -> None:
    async def go() -> None:
        await read_frame(_reader(data), min_size=1, max_size=10)

    with pytest.raises(asyncio.IncompleteReadError):
        asyncio.run(go())
