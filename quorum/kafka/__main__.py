"""``python -m quorum.kafka --listen HOST:PORT --bootstrap HOST:PORT[,...]``: a stand-alone Kafka-wire
gateway in front of a running KRaftKeeper quorum (the same listener ``kraftkeeper start
--kafka-listen`` runs inside a node), until SIGTERM / SIGINT."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
import sys

from quorum.client import QuorumClient
from quorum.cliparse import ArgumentParser
from quorum.types import KraftError

from .server import KafkaWireServer


def _hostport(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise argparse.ArgumentTypeError(f"{text!r} is not HOST:PORT")
    return host.strip("[]"), int(port)


def main(argv: list[str] | None = None) -> int:
    p = ArgumentParser(prog="python -m quorum.kafka", description=__doc__.split("\n\n")[0])
    p.add_argument("--listen", required=True, type=_hostport, help="HOST:PORT to answer Kafka's protocol on")
    p.add_argument("--bootstrap", required=True, help="the quorum's nodes, HOST:PORT[,...]")
    p.add_argument("--insecure", action="store_true", help="allow a non-loopback --listen (no TLS, no auth)")
    p.add_argument(
        "--advertise", type=_hostport, default=None, help="HOST:PORT clients reach this listener at"
    )
    a = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        client = QuorumClient(a.bootstrap, timeout=10.0)
        server = KafkaWireServer(
            client, a.listen[0], a.listen[1], advertised=a.advertise, insecure=a.insecure
        )
        try:
            await server.start()
            print(f"Kafka listener on {a.listen[0]}:{server.port}", flush=True)
            await stop.wait()
        finally:
            await server.close()
            with contextlib.suppress(Exception):
                await client.close()

    try:
        asyncio.run(run())
    except KraftError as e:
        sys.stderr.write(f"{e}\n")
        return 2
    except OSError as e:
        sys.stderr.write(f"UNAVAILABLE: --listen {a.listen[0]}:{a.listen[1]}: {e.strerror or e}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
