"""``kraftkeeper start``: run one node in the foreground until SIGTERM / SIGINT.

This is where the parts are wired: the transport (HTTP today; TLS passes its client
``ssl.SSLContext`` and peer check to :class:`HttpTransport`), the node, and the HTTP server
(the authentication middlewares go to ``build_app``, its server context to
``start_server``)."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import json
import logging
import os
import signal
import sys
import time

from quorum.runtime import kv as kvmod
from quorum.runtime.config import NodeConfig, load_config, parse_voters
from quorum.runtime.middleware import auth_middleware
from quorum.runtime.node import Node
from quorum.runtime.peerstream import StreamTransport, tls_stream_auth
from quorum.runtime.server import build_app, start_server
from quorum.runtime.transport import HttpTransport, Transport
from quorum.security.nodetls import NodeTls, check_plaintext_listen, load_node_tls
from quorum.storage.meta import load_meta
from quorum.timefmt import rfc3339
from quorum.types import ErrorCode, KraftError


class JsonFormatter(logging.Formatter):
    """One JSON object per line (``KRAFTKEEPER_LOG_FORMAT=json``): ts, level, logger, node, msg."""

    def __init__(self, node: str) -> None:
        super().__init__()
        self.node = node

    def format(self, record: logging.LogRecord) -> str:
        obj = {
            # UTC, as the Z says (logging's own formatTime would give local time).
            "ts": rfc3339(int(record.created * 1000), millis=True),
            "level": record.levelname,
            "logger": record.name,
            "node": self.node,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            obj["exc"] = self.formatException(record.exc_info)
        return json.dumps(obj)


def _setup_logging(node_hint: str) -> None:
    level = os.environ.get("KRAFTKEEPER_LOG_LEVEL", "INFO").upper()
    handler = logging.StreamHandler(sys.stderr)
    if os.environ.get("KRAFTKEEPER_LOG_FORMAT", "text").lower() == "json":
        fmt: logging.Formatter = JsonFormatter(node_hint)
        fmt.converter = time.gmtime
    else:
        fmt = logging.Formatter("%(asctime)s %(levelname)s %(name)s [" + node_hint + "] %(message)s")
    handler.setFormatter(fmt)
    logging.basicConfig(level=getattr(logging, level, logging.INFO), handlers=[handler])
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
# Catch-up moves megabytes per Fetch through a few large buffers (the leader's segment read and
# response, the replica's received body: 8-64 MiB each). glibc serves every
# allocation above its mmap threshold (at most 32 MiB, by default far less once adjusted) with a
# fresh mmap and returns it with munmap on free, so each such buffer costs a page fault per
# 4 KiB page on first touch: measured on this project's VM, copying 3 GiB through 32 MiB
# temporaries took 1.6 CPU s that way and 0.25 CPU s with the buffers kept in the heap. These
# settings serve buffers up to 128 MiB (a Fetch response is at most 2 x 64 MiB) from the heap
# and keep up to 256 MiB of freed heap top for the next one instead of returning it at once.
_MMAP_THRESHOLD_BYTES = 128 * 1024 * 1024
_TRIM_THRESHOLD_BYTES = 256 * 1024 * 1024


def keep_large_buffers() -> bool:
    """Tune glibc malloc for the node process (see above); False where that is not possible
    (another C library, no ctypes): the node works the same, only catch-up costs more CPU."""
    # glibc only, and found without ctypes.util.find_library: that runs `ldconfig -p` in a
    # child process, 0.1-0.4 s of every node's start (a replaced disk's recovery waits for it).
    if not sys.platform.startswith("linux"):
        return False
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):  # another C library (musl has no such name)
            return False
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError, ValueError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    mmap_ok: int = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_BYTES)
    trim_ok: int = mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD_BYTES)
    return mmap_ok == 1 and trim_ok == 1


async def serve_node(
    data_dir: str,
    listen: str,
    voters: dict[int, str],
    cfg: NodeConfig,
    advertise: str | None = None,
    stop: asyncio.Event | None = None,
    tls: NodeTls | None = None,
    kafka_listen: str | None = None,
    kafka_insecure: bool = False,
) -> None:
    """Run one node and its server until ``stop`` is set (default: SIGTERM / SIGINT). With
    ``tls``: https, mutual TLS to peers, and the authorization middleware."""
    cluster_id = load_meta(data_dir).cluster_id if tls is not None else ""
    http = (
        HttpTransport()
        if tls is None
        else HttpTransport(
            ssl_context=tls.peer_context(), server_hostname=NodeTls.server_hostname(cluster_id)
        )
    )
    # Peer streams (quorum.runtime.peerstream) unless turned off by name; a peer of an older
    # version is reached over per-request HTTP either way.
    transport: Transport = (
        http if os.environ.get("KRAFTKEEPER_PEER_STREAM", "on").lower() == "off" else StreamTransport(http)
    )
    node = Node(data_dir, listen, voters, cfg, transport, advertise=advertise)
    if tls is not None:
        node.metrics.set(
            "tls-certificate-expiry-timestamp-seconds",
            tls.not_after(),
            help="When the certificate this node serves expires (Unix seconds)",
        )
    try:
        # Tail latency: the KV map and the caches built at start-up are long-lived; freezing
        # them and collecting the young generation less often keeps full collections (which
        # stop the event loop for milliseconds with a large map) rare.
        gc.freeze()
        gc.set_threshold(50_000, 20, 100)
        if stop is None:
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, stop.set)
        app = build_app(
            node,
            max_body=kvmod.MAX_VALUE_BYTES + 64 * 1024,
            middlewares=[auth_middleware(cluster_id, tls.token_source())] if tls is not None else (),
            stream_auth=tls_stream_auth(cluster_id) if tls is not None else None,
        )
        runner = await start_server(app, listen, tls.server_context() if tls is not None else None)
        kafka = None
        try:
            if kafka_listen:  # Kafka's wire protocol too (quorum/kafka, checked in run_node)
                from quorum.kafka.listener import NodeKafkaListener

                kafka = await NodeKafkaListener.start(
                    kafka_listen,
                    advertise or listen,
                    list(voters.values()),
                    tls=tls is not None,
                    insecure=kafka_insecure,
                )
            await node.run(stop)
        finally:
            if kafka is not None:
                await kafka.close()
            await runner.cleanup()
    finally:
        await transport.close()
        node.close()


def run_node(
    data_dir: str,
    listen: str,
    voters: str,
    advertise: str | None = None,
    config_file: str | None = None,
    tls_options: dict[str, str | None] | None = None,
    insecure: bool = False,
    kafka_listen: str | None = None,
) -> int:
    voter_map = parse_voters(voters)
    cfg = load_config(config_file)
    host, colon, port = listen.rpartition(":")
    if not colon or not port.isdigit():
        raise KraftError(ErrorCode.INVALID_REQUEST, f"--listen {listen!r}: expected HOST:PORT")
    if advertise is None and host in ("0.0.0.0", "", "::"):
        raise KraftError(
            ErrorCode.INVALID_REQUEST, "--advertise is required when listening on a wildcard address"
        )
    tls = load_node_tls(data_dir, tls_options or {})
    if tls is None:
        check_plaintext_listen(listen, insecure)
    if kafka_listen:
        # kafka-python is optional (the operator extra): imported only for --kafka-listen.
        try:
            from quorum.kafka.listener import check_kafka_listen
        except ImportError as e:
            raise KraftError(
                ErrorCode.UNSUPPORTED,
                f"--kafka-listen needs kafka-python ({e}); install kraftkeeper[operator]",
            ) from None
        check_kafka_listen(kafka_listen, tls=tls is not None, insecure=insecure)
    _setup_logging(listen)
    if not keep_large_buffers():
        logging.getLogger(__name__).info(
            "malloc not tuned for large buffers (not glibc): catch-up costs more CPU"
        )

    async def main() -> None:
        await serve_node(
            data_dir,
            listen,
            voter_map,
            cfg,
            advertise,
            tls=tls,
            kafka_listen=kafka_listen,
            kafka_insecure=insecure,
        )

    try:
        import uvloop  # optional: a faster event loop for the HTTP paths

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
    return 0
