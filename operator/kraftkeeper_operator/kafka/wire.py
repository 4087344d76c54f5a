"""One asyncio connection to a Kafka controller (or broker) speaking Kafka's binary protocol.

Message bodies are encoded and decoded by kafka-python's schema-driven message classes
(``kafka.protocol``); this module only frames them (int32 size prefix, request header with a
correlation id), negotiates versions with ApiVersions, and authenticates with SASL through
kafka-python's mechanisms (the exchange of KIP-43 / KIP-152: SaslHandshake v1, then
SaslAuthenticate). Requests go one at a time per connection: Kafka answers a connection's requests
in order, and the operator never needs more than one in flight.

``ClientSettings.from_properties`` reads a Kafka client properties file (``--command-config`` of
Kafka's tools): ``security.protocol``, ``ssl.*`` (PEM files), ``sasl.mechanism`` and
``sasl.jaas.config`` for PLAIN / SCRAM. Anything it cannot honour is refused with the property's
name, never silently ignored: a tool that quietly dropped ``ssl.truststore.location`` would fall
back to an unverified or plaintext connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from dataclasses import dataclass, field
from pathlib import Path
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
from quorum.properties import PropertiesError, parse_properties

CLIENT_ID = "kraftkeeper-operator"


class KafkaWireError(Exception):
    """A connection-level failure (refused, closed, malformed frame, authentication)."""


class ClientConfigError(ValueError):
    """A Kafka client properties file we cannot honour; the message names the property."""


_SUPPORTED = {
    "security.protocol",
    "ssl.ca.location",  # librdkafka's name, accepted too
    "ssl.truststore.type",
    "ssl.truststore.location",
    "ssl.truststore.certificates",
    "ssl.keystore.type",
    "ssl.keystore.location",
    "ssl.keystore.certificate.chain",
    "ssl.keystore.key",
    "ssl.key.password",
    "ssl.endpoint.identification.algorithm",
    "sasl.mechanism",
    "sasl.jaas.config",
    "client.id",
    "request.timeout.ms",
    "default.api.timeout.ms",
}

# Our defaults for Kafka's two client timeouts (Kafka's own are 30 s and 60 s). One request to one
# controller, including the TCP connect, TLS and SASL handshakes, may take request.timeout.ms: a
# few round trips over a real network plus a loaded controller fit in 10 s with room. One
# operation (a describe that may try every bootstrap controller, or a voter change with the
# describes around it) gives up after default.api.timeout.ms, so a pass never waits on a hung
# controller for longer than that.
DEFAULT_REQUEST_TIMEOUT_MS = 10_000
DEFAULT_API_TIMEOUT_MS = 30_000


def parse_client_properties(text: str, source: str) -> dict[str, str]:
    """A Kafka client properties file (Java properties, read as Kafka reads it); values are
    trimmed as Kafka's config parser trims them. A line that is not ``key=value`` is refused
    naming ``source`` and the line: a hand-written client file with such a line is a mistake."""
    try:
        props = parse_properties(text, source=source, require_values=True)
    except PropertiesError as e:
        raise ClientConfigError(str(e)) from None
    return {k: v.strip() for k, v in props.items()}


def _jaas_options(jaas: str) -> tuple[str, dict[str, str]]:
    """``org.apache...PlainLoginModule required username="u" password="p";`` -> module, options."""
    m = re.match(r"\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\s*(.*?);?\s*$", jaas, re.S)
    if m is None:
        raise ClientConfigError(f"sasl.jaas.config: cannot parse {jaas[:60]!r}")
    opts = dict(re.findall(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"', m.group(3)))
    return m.group(1), opts


@dataclass
class ClientSettings:
    security_protocol: str = "PLAINTEXT"
    ssl_context: ssl.SSLContext | None = None
    server_hostname_check: bool = True
    sasl: dict[str, Any] = field(default_factory=dict)  # kafka-python mechanism config
    client_id: str = CLIENT_ID
    request_timeout_ms: int = DEFAULT_REQUEST_TIMEOUT_MS  # request.timeout.ms: one request
    api_timeout_ms: int = DEFAULT_API_TIMEOUT_MS  # default.api.timeout.ms: one whole operation

    @classmethod
    def from_properties(cls, path: str | Path) -> ClientSettings:
        p = Path(path)
        try:
            props = parse_client_properties(p.read_text(), f"--kafka-client-config {p}")
        except OSError as e:
            raise ClientConfigError(f"--kafka-client-config {p}: {e.strerror or e}") from None
        return cls.from_dict(props, base=p.parent)

    @classmethod
    def from_dict(cls, props: dict[str, str], base: Path = Path(".")) -> ClientSettings:
        unknown = sorted(k for k in props if k not in _SUPPORTED)
        if unknown:
            raise ClientConfigError(
                f"{unknown[0]}: not supported by kraftkeeper's Kafka client (supported: "
                f"{', '.join(sorted(_SUPPORTED))})"
            )
        s = cls()
        proto = props.get("security.protocol", "PLAINTEXT").upper()
        if proto not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
            raise ClientConfigError(
                f"security.protocol: {proto!r} is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL"
            )
        s.security_protocol = proto
        s.client_id = props.get("client.id", CLIENT_ID)
        s.request_timeout_ms = _millis(props, "request.timeout.ms", s.request_timeout_ms)
        # Not given: at least one request's worth (a longer request.timeout.ms alone raises both).
        s.api_timeout_ms = _millis(
            props, "default.api.timeout.ms", max(s.api_timeout_ms, s.request_timeout_ms)
        )
        if s.api_timeout_ms < s.request_timeout_ms:
            raise ClientConfigError(
                f"default.api.timeout.ms: {s.api_timeout_ms} is below request.timeout.ms "
                f"({s.request_timeout_ms}); one operation must allow at least one request"
            )
        if proto in ("SSL", "SASL_SSL"):
            s.ssl_context = _ssl_context(props, base)
            s.server_hostname_check = props.get("ssl.endpoint.identification.algorithm", "https") != ""
            if not s.server_hostname_check:
                s.ssl_context.check_hostname = False
        elif any(k.startswith("ssl.") for k in props):
            raise ClientConfigError(f"ssl.* settings given but security.protocol is {proto}")
        if proto.startswith("SASL_"):
            s.sasl = _sasl_config(props, proto)
        return s


def _millis(props: dict[str, str], key: str, default: int) -> int:
    """A positive timeout in milliseconds (at most a day), or the default when not given."""
    if key not in props:
        return default
    text = props[key].strip()
    if not text.isdigit() or not 0 < int(text) <= 86_400_000:
        raise ClientConfigError(f"{key}: {props[key]!r} is not a whole number of milliseconds in 1..86400000")
    return int(text)


def _resolve(base: Path, value: str) -> str:
    p = Path(value)
    return str(p if p.is_absolute() else base / p)


def _ssl_context(props: dict[str, str], base: Path) -> ssl.SSLContext:
    # As Kafka's Java client: a configured truststore is the only trust anchor; without one, the
    # system's CAs.
    own_trust = any(
        k in props for k in ("ssl.truststore.location", "ssl.ca.location", "ssl.truststore.certificates")
    )
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT) if own_trust else ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ttype = props.get("ssl.truststore.type", "PEM").upper()
    ktype = props.get("ssl.keystore.type", "PEM").upper()
    if "ssl.truststore.location" in props or "ssl.ca.location" in props:
        if ttype != "PEM":
            raise ClientConfigError(
                f"ssl.truststore.type: {ttype} stores cannot be read here; convert the truststore to PEM "
                "(ssl.truststore.type=PEM)"
            )
        ca = props.get("ssl.truststore.location") or props["ssl.ca.location"]
        try:
            ctx.load_verify_locations(cafile=_resolve(base, ca))
        except (OSError, ssl.SSLError) as e:
            raise ClientConfigError(f"ssl.truststore.location: {ca}: {e}") from None
    if "ssl.truststore.certificates" in props:
        ctx.load_verify_locations(cadata=props["ssl.truststore.certificates"].replace("\\n", "\n"))
    if "ssl.keystore.location" in props:
        if ktype != "PEM":
            raise ClientConfigError(
                f"ssl.keystore.type: {ktype} stores cannot be read here; use a PEM keystore "
                "(certificate chain and private key in one file, ssl.keystore.type=PEM)"
            )
        ks = _resolve(base, props["ssl.keystore.location"])
        try:
            ctx.load_cert_chain(ks, password=props.get("ssl.key.password"))
        except (OSError, ssl.SSLError) as e:
            raise ClientConfigError(f"ssl.keystore.location: {ks}: {e}") from None
    return ctx


def _sasl_config(props: dict[str, str], proto: str) -> dict[str, Any]:
    mech = props.get("sasl.mechanism", "GSSAPI").upper()
    if mech not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
        raise ClientConfigError(
            f"sasl.mechanism: {mech} is not supported here (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)"
        )
    if "sasl.jaas.config" not in props:
        raise ClientConfigError(f"sasl.jaas.config: required for sasl.mechanism={mech}")
    _, opts = _jaas_options(props["sasl.jaas.config"])
    if "username" not in opts or "password" not in opts:
        raise ClientConfigError("sasl.jaas.config: username and password are required")
    return {
        "security_protocol": proto,
        "sasl_mechanism": mech,
        "sasl_plain_username": opts["username"],
        "sasl_plain_password": opts["password"],
    }


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
