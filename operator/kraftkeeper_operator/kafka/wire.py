"""One asyncio connection to a Kafka controller (or broker) speaking Kafka's binary protocol.

Message bodies are encoded and decoded by kafka-python's schema-driven message classes
(``kafka.protocol``); this module only frames them (int32 size prefix, request header with a
correlation id), negotiates versions with ApiVersions, and authenticates with SASL through
kafka-python's mechanisms (the exchange of KIP-43 / KIP-152: SaslHandshake v1, then
SaslAuthenticate). Requests go one at a time per connection: Kafka answers a connection's requests
in order, and the operator never needs more than one in flight.

The connection's settings (TLS, SASL, timeouts) are a :class:`.clientconf.ClientSettings`, read
from a Kafka client properties file there.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from typing import Any

from kafka.net.sasl import get_sasl_mechanism  # type: ignore[import-untyped]
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse  # type: ignore[import-untyped]
from kafka.protocol.sasl import (  # type: ignore[import-untyped]
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)

from quorum.kafka.frames import MAX_RESPONSE_FRAME, FrameError, read_frame

# Re-exported: the reports' Kafka probe and demo take the settings type from here.
from .clientconf import ClientSettings as ClientSettings


class KafkaWireError(Exception):
    """A connection-level failure (refused, closed, malformed frame, authentication)."""


class KafkaConnection:
    """A connected, version-negotiated (and authenticated) connection to one Kafka node."""

    def __init__(self, host: str, port: int, settings: ClientSettings) -> None:
        self.host, self.port = host, port
        self.settings = settings
        self.api_versions: dict[int, tuple[int, int]] = {}
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._correlation = 0
        self._lock = asyncio.Lock()

    def __str__(self) -> str:
        return f"{self.host}:{self.port}"

    @classmethod
    async def open(
        cls, host: str, port: int, settings: ClientSettings, within: float = 10.0
    ) -> KafkaConnection:
        conn = cls(host, port, settings)
        try:
            await asyncio.wait_for(conn._connect(), within)
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _connect(self) -> None:
        ctx = self.settings.ssl_context
        try:
            self._reader, self._writer = await asyncio.open_connection(
                self.host, self.port, ssl=ctx, server_hostname=self.host if ctx else None
            )
        except ssl.SSLError as e:
            raise KafkaWireError(f"{self}: TLS handshake failed: {e}") from None
        resp = await self._request(
            ApiVersionsRequest(client_software_name="kraftkeeper", client_software_version="0.1.0"), 3
        )
        if resp.error_code != 0:
            # UNSUPPORTED_VERSION: the node lists its versions in a v0 body; ask again with v0.
            resp = await self._request(ApiVersionsRequest(), 0)
            if resp.error_code != 0:
                raise KafkaWireError(f"{self}: ApiVersions failed with Kafka error {resp.error_code}")
        self.api_versions = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        if self.settings.sasl:
            await self._authenticate()

    async def _authenticate(self) -> None:
        mech_name = self.settings.sasl["sasl_mechanism"]
        hs = await self._request(SaslHandshakeRequest(mechanism=mech_name), 1)
        if hs.error_code != 0:
            raise KafkaWireError(
                f"{self}: SASL mechanism {mech_name} refused (the listener offers {list(hs.mechanisms)})"
            )
        mech = get_sasl_mechanism(mech_name)(host=self.host, **self.settings.sasl)
        while not mech.is_done():
            resp = await self._request(SaslAuthenticateRequest(auth_bytes=mech.auth_bytes()), 1)
            if resp.error_code != 0:
                raise KafkaWireError(f"{self}: SASL authentication failed: {resp.error_message}")
            mech.receive(resp.auth_bytes)
        if not mech.is_authenticated():
            raise KafkaWireError(f"{self}: SASL {mech_name} authentication failed")

    def version_for(self, api_key: int, lo: int, hi: int) -> int:
        """The highest version of ``api_key`` both sides speak in [lo, hi]; KafkaWireError if none."""
        have = self.api_versions.get(api_key)
        if have is None:
            raise KafkaWireError(f"{self}: the node does not offer API key {api_key}")
        v = min(hi, have[1])
        if v < max(lo, have[0]):
            raise KafkaWireError(
                f"{self}: API key {api_key}: node speaks v{have[0]}-{have[1]}, we need v{lo}-{hi}"
            )
        return v

    async def request(self, msg: Any, version: int, within: float | None = None) -> Any:
        t = within if within is not None else self.settings.request_timeout_ms / 1000
        try:
            return await asyncio.wait_for(self._request(msg, version), t)
        except (TimeoutError, asyncio.CancelledError):
            # A response may still arrive (also after a cancellation by the caller's own deadline,
            # backend.py): this connection's framing can no longer be trusted.
            self._close_now()
            raise

    async def _request(self, msg: Any, version: int) -> Any:
        async with self._lock:
            if self._writer is None or self._reader is None:
                raise KafkaWireError(f"{self}: connection closed")
            self._correlation += 1
            cid = self._correlation
            msg.API_VERSION = version
            msg.with_header(correlation_id=cid, client_id=self.settings.client_id)
            frame = msg.encode(version=version, header=True, framed=True)
            try:
                self._writer.write(frame)
                await self._writer.drain()
                body = await read_frame(self._reader, min_size=1, max_size=MAX_RESPONSE_FRAME)
            except FrameError as e:
                self._close_now()
                raise KafkaWireError(f"{self}: bad response: {e}") from None
            except (asyncio.IncompleteReadError, ConnectionError) as e:
                self._close_now()
                raise KafkaWireError(f"{self}: connection closed by the node ({type(e).__name__})") from None
            resp_cls = _response_class(msg)
            resp = resp_cls.decode(body, version=version, header=True)
            got = resp.header.correlation_id if resp.header is not None else None
            if got != cid:
                self._close_now()
                raise KafkaWireError(f"{self}: response correlation id {got}, expected {cid}")
            return resp

    def _close_now(self) -> None:
        if self._writer is not None:
            self._writer.close()
        self._writer = self._reader = None

    @property
    def closed(self) -> bool:
        return self._writer is None

    async def close(self) -> None:
        w = self._writer
        self._close_now()
        if w is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(w.wait_closed(), 2)


_RESPONSES: dict[str, Any] = {
    "ApiVersionsRequest": ApiVersionsResponse,
    "SaslHandshakeRequest": SaslHandshakeResponse,
    "SaslAuthenticateRequest": SaslAuthenticateResponse,
}


def register_response(request_cls: Any, response_cls: Any) -> None:
    _RESPONSES[request_cls.__name__] = response_cls


def _response_class(msg: Any) -> Any:
    name = type(msg).__name__.split("_v")[0]
    try:
        return _RESPONSES[name]
    except KeyError:
        raise KafkaWireError(f"no response class registered for {name}") from None
