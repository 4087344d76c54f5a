"""What one client may cost the Kafka-wire listener (``--kafka-listen``, ``python -m quorum.kafka``).

The listener takes no credential, so everything a connection may hold is bounded up front, in
the spirit of Kafka's own broker settings (``max.connections``, ``socket.request.max.bytes``,
``connections.max.idle.ms``):

* **connection cap**: at ``max_connections`` open connections a new one is closed at once
  (counted in ``refused_connections``); the admin tool needs one or two;
* **frame cap**: a request frame over ``max_frame`` bytes closes the connection before any of
  its body is read (the largest request the listener answers, AddRaftVoter with a few
  endpoints, is well under a kilobyte);
* **read deadline**: a frame whose size has arrived must be complete within
  ``read_timeout_s``, else the connection is closed (a client announcing a frame and sending
  nothing more holds no buffer for long);
* **idle deadline**: a connection with no request for ``idle_timeout_s`` is closed.

So the memory the listener can spend on request bodies is at most
``max_connections * max_frame`` (8 MiB with the defaults), whatever clients do.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KafkaLimits"]


@dataclass
class KafkaLimits:
    """The listener's limits and the counters it reports."""

    max_connections: int = 32
    max_frame: int = 256 * 1024
    read_timeout_s: float = 10.0
    idle_timeout_s: float = 120.0
    # live counters
    refused_connections: int = 0
    refused_frames: int = 0
    timed_out: int = 0
