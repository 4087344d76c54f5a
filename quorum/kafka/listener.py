"""A node's Kafka listener (``kraftkeeper start --kafka-listen HOST:PORT``): the option checked
before the node starts, and the :class:`~quorum.kafka.server.KafkaWireServer` started in front of
the node's own HTTP API. The protocol itself is :mod:`quorum.kafka.server`."""

from __future__ import annotations

from quorum.client import QuorumClient
from quorum.security.nodetls import is_loopback_host
from quorum.types import ErrorCode, KraftError

from .server import KafkaWireServer, QuorumBackend


def parse_listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"--kafka-listen {text!r}: expected HOST:PORT")
    return host.strip("[]"), int(port)


async def start_kafka_listener(
    listen: str, backend: QuorumBackend, *, insecure: bool = False
) -> KafkaWireServer:
    """Start the listener of ``kraftkeeper start --kafka-listen HOST:PORT`` (or the gateway)."""
    host, port = parse_listen(listen)
    server = KafkaWireServer(backend, host, port, insecure=insecure)
    await server.start()
    return server


def check_kafka_listen(kafka_listen: str, *, tls: bool, insecure: bool = False) -> None:
    """Refuse ``--kafka-listen`` before the node starts: bad HOST:PORT, a non-loopback address
    without ``--insecure``, or a TLS node (see :class:`NodeKafkaListener`)."""
    host, port = parse_listen(kafka_listen)
    if tls:
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            "--kafka-listen: not available with TLS on (the Kafka listener has no TLS or "
            "authentication yet); run `python -m quorum.kafka` on a trusted host instead",
        )
    if not insecure and not is_loopback_host(host):
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"--kafka-listen {host}:{port}: the Kafka listener has no TLS or authentication, so it binds "
            "to loopback only (127.0.0.1, ::1, localhost) unless --insecure is given",
        )


class NodeKafkaListener:
    """The listener of ``kraftkeeper start --kafka-listen HOST:PORT``: it asks the quorum through
    the node's own HTTP API (and its voters', to follow the leader), so it needs nothing of the
    node's internals. Refused on a TLS node: it has no TLS or authentication of its own, and would
    let anyone who reaches it change the voter set without the credentials the node requires."""

    def __init__(self, server: KafkaWireServer, client: QuorumClient) -> None:
        self.server, self.client = server, client

    @classmethod
    async def start(
        cls,
        kafka_listen: str,
        node_endpoint: str,
        voter_endpoints: list[str],
        *,
        tls: bool,
        insecure: bool = False,
    ) -> NodeKafkaListener:
        check_kafka_listen(kafka_listen, tls=tls, insecure=insecure)
        client = QuorumClient(
            [node_endpoint, *[e for e in voter_endpoints if e != node_endpoint]], timeout=10.0
        )
        try:
            server = await start_kafka_listener(kafka_listen, client, insecure=insecure)
        except BaseException:
            await client.close()
            raise
        return cls(server, client)

    async def close(self) -> None:
        await self.server.close()
        await self.client.close()
