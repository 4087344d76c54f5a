"""Reading Kafka's size-prefixed frames, the one way both directions do it: the node's Kafka
listener reading requests (:mod:`quorum.kafka.server`) and the operator's Kafka client reading
responses (``kraftkeeper_operator.kafka.wire``).

On the wire every request and response is an int32 big-endian size followed by that many bytes
(Kafka protocol guide, "Common Request and Response Structure"). The size is checked against the
reader's limits before any of the body is read, so a peer announcing a huge frame costs no
buffer. After any :class:`FrameError` the stream position is lost: the caller closes the
connection. A clean end of stream before a frame starts is :class:`asyncio.IncompleteReadError`,
as from the stream itself.
"""

from __future__ import annotations

import asyncio
import struct

__all__ = [
    "MAX_RESPONSE_FRAME",
    "REQUEST_HEADER_BYTES",
    "FrameError",
    "FrameIdle",
    "FrameSizeError",
    "FrameStalled",
    "read_frame",
]

# The fixed part of a request header: api_key int16, api_version int16, correlation_id int32. A
# shorter request frame cannot name its API and is refused.
REQUEST_HEADER_BYTES = 8

# The largest response a client of ours accepts: DescribeQuorum of a large quorum is kilobytes;
# the cap only bounds what a broken or hostile peer can make the client buffer.
MAX_RESPONSE_FRAME = 64 * 1024 * 1024

_SIZE = struct.Struct(">i")


class FrameError(Exception):
    """A frame that cannot be read; the connection must be closed."""


class FrameSizeError(FrameError):
    """The announced size is outside ``min_size .. max_size`` (nothing of the body was read)."""

    def __init__(self, size: int, min_size: int, max_size: int) -> None:
        super().__init__(f"frame of {size} bytes (accepted: {min_size} to {max_size})")
        self.size, self.min_size, self.max_size = size, min_size, max_size


class FrameIdle(FrameError):
    """No frame started within the idle deadline."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"idle for {seconds:.0f}s")
        self.seconds = seconds


class FrameStalled(FrameError):
    """A frame's size arrived but its body was not complete within the read deadline."""

    def __init__(self, size: int, seconds: float) -> None:
        super().__init__(f"a {size}-byte frame not received within {seconds:.0f}s")
        self.size, self.seconds = size, seconds


async def read_frame(
    reader: asyncio.StreamReader,
    *,
    min_size: int,
    max_size: int,
    idle_timeout: float | None = None,
    read_timeout: float | None = None,
) -> bytes:
    """The body of the next frame on ``reader``. ``idle_timeout`` bounds the wait for the frame's
    size (:class:`FrameIdle`), ``read_timeout`` the wait for its body once the size is known
    (:class:`FrameStalled`); ``None`` waits as long as the caller's own deadline allows. Raises
    :class:`FrameSizeError` for a size outside the limits and :class:`asyncio.IncompleteReadError`
    when the stream ends (before or inside the frame)."""
    try:
        async with asyncio.timeout(idle_timeout):
            head = await reader.readexactly(_SIZE.size)
    except TimeoutError:
        raise FrameIdle(idle_timeout or 0.0) from None
    (size,) = _SIZE.unpack(head)
    if not min_size <= size <= max_size:
        raise FrameSizeError(size, min_size, max_size)
    try:
        async with asyncio.timeout(read_timeout):
            return await reader.readexactly(size)
    except TimeoutError:
        raise FrameStalled(size, read_timeout or 0.0) from None
