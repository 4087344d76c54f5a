"""The Kafka client settings: a Kafka client properties file (``--command-config`` of Kafka's tools,
``--kafka-client-config FILE``, or a Secret's key for ``spec.kafka.clientSecretRef``) read into
the connection settings of :mod:`.wire`.

The file is a typed document: :class:`KafkaClientProps` is a strict pydantic model of the
properties this client honours, by Kafka's names (``security.protocol``, ``ssl.*`` with PEM
files, ``sasl.mechanism`` and ``sasl.jaas.config`` for PLAIN / SCRAM, ``client.id`` and the two
timeouts). Anything it cannot honour is refused with the property's name, never silently
ignored: a tool that quietly dropped ``ssl.truststore.location`` would fall back to an unverified
or plaintext connection. The files the settings name (trust store, key store) are read by
:meth:`ClientSettings.from_dict` after the model has accepted the document.
"""

from __future__ import annotations

import base64
import hashlib
import os
import re
import shutil
import ssl
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from quorum.properties import PropertiesError, parse_properties

CLIENT_ID = "kraftkeeper-operator"

# Our defaults for Kafka's two client timeouts (Kafka's own are 30 s and 60 s). One request to one
# controller, including the TCP connect, TLS and SASL handshakes, may take request.timeout.ms: a
# few round trips over a real network plus a loaded controller fit in 10 s with room. One
# operation (a describe that may try every bootstrap controller, or a voter change with the
# describes around it) gives up after default.api.timeout.ms, so a pass never waits on a hung
# controller for longer than that.
DEFAULT_REQUEST_TIMEOUT_MS = 10_000
DEFAULT_API_TIMEOUT_MS = 30_000
MAX_TIMEOUT_MS = 86_400_000  # a day


class ClientConfigError(ValueError):
    """A Kafka client properties file we cannot honour; the message names the property."""


def parse_client_properties(text: str, source: str) -> dict[str, str]:
    """A Kafka client properties file (Java properties, read as Kafka reads it); values are
    trimmed as Kafka's config parser trims them. A line that is not ``key=value`` is refused
    naming ``source`` and the line: a hand-written client file with such a line is a mistake."""
    try:
        props = parse_properties(text, source=source, require_values=True)
    except PropertiesError as e:
        raise ClientConfigError(str(e)) from None
    return {k: v.strip() for k, v in props.items()}


# ---- the document --------------------------------------------------------------------------
def _upper(value: Any) -> Any:
    # Kafka reads the protocol, mechanism and store type names case-insensitively.
    return value.upper() if isinstance(value, str) else value


def _protocol(value: Any) -> Any:
    value = _upper(value)
    if value not in ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"):
        raise ValueError(f"{value!r:.80} is not PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL")
    return value


def _millis(value: Any) -> Any:
    """A positive timeout in milliseconds, at most a day, written as a whole number."""
    if isinstance(value, str):
        text = value.strip()
        if text.isdigit() and 0 < int(text) <= MAX_TIMEOUT_MS:
            return int(text)
    raise ValueError(f"{value!r:.80} is not a whole number of milliseconds in 1..{MAX_TIMEOUT_MS}")


Protocol = Annotated[Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"], BeforeValidator(_protocol)]
Millis = Annotated[int, BeforeValidator(_millis)]
StoreType = Annotated[str, BeforeValidator(_upper)]


class KafkaClientProps(BaseModel):
    """The Kafka client properties this client honours; values are strings, as in the file."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    security_protocol: Protocol = Field(default="PLAINTEXT", alias="security.protocol")
    ssl_ca_location: str | None = Field(default=None, alias="ssl.ca.location")  # librdkafka's name
    ssl_truststore_type: StoreType = Field(default="PEM", alias="ssl.truststore.type")
    ssl_truststore_location: str | None = Field(default=None, alias="ssl.truststore.location")
    ssl_truststore_certificates: str | None = Field(default=None, alias="ssl.truststore.certificates")
    ssl_keystore_type: StoreType = Field(default="PEM", alias="ssl.keystore.type")
    ssl_keystore_location: str | None = Field(default=None, alias="ssl.keystore.location")
    ssl_keystore_certificate_chain: str | None = Field(default=None, alias="ssl.keystore.certificate.chain")
    ssl_keystore_key: str | None = Field(default=None, alias="ssl.keystore.key")
    ssl_key_password: str | None = Field(default=None, alias="ssl.key.password")
    ssl_endpoint_identification_algorithm: str = Field(
        default="https", alias="ssl.endpoint.identification.algorithm"
    )
    sasl_mechanism: StoreType = Field(default="GSSAPI", alias="sasl.mechanism")  # Kafka's default
    sasl_jaas_config: str | None = Field(default=None, alias="sasl.jaas.config")
    client_id: str = Field(default=CLIENT_ID, alias="client.id")
    request_timeout_ms: Millis = Field(default=DEFAULT_REQUEST_TIMEOUT_MS, alias="request.timeout.ms")
    default_api_timeout_ms: Millis | None = Field(default=None, alias="default.api.timeout.ms")

    @model_validator(mode="after")
    def _consistent(self) -> KafkaClientProps:
        proto = self.security_protocol
        ssl_given = sorted(k for k in self.model_fields_set if k.startswith("ssl_"))
        if ssl_given and proto not in ("SSL", "SASL_SSL"):
            raise _Refusal(_alias(ssl_given[0]), f"ssl.* settings given but security.protocol is {proto}")
        if self.api_timeout_ms < self.request_timeout_ms:
            raise _Refusal(
                "default.api.timeout.ms",
                f"{self.api_timeout_ms} is below request.timeout.ms ({self.request_timeout_ms}); one "
                "operation must allow at least one request",
            )
        if proto.startswith("SASL_"):
            mech = self.sasl_mechanism
            if mech not in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
                raise _Refusal(
                    "sasl.mechanism", f"{mech} is not supported here (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512)"
                )
            if self.sasl_jaas_config is None:
                raise _Refusal("sasl.jaas.config", f"required for sasl.mechanism={mech}")
            _, opts = _jaas_options(self.sasl_jaas_config)
            if "username" not in opts or "password" not in opts:
                raise _Refusal("sasl.jaas.config", "username and password are required")
        return self

    @property
    def api_timeout_ms(self) -> int:
        # Not given: at least one request's worth (a longer request.timeout.ms alone raises both).
        if self.default_api_timeout_ms is not None:
            return self.default_api_timeout_ms
        return max(DEFAULT_API_TIMEOUT_MS, self.request_timeout_ms)


class _Refusal(ValueError):
    """A rule across properties, naming the property at fault."""

    def __init__(self, prop: str, problem: str) -> None:
        super().__init__(f"{prop}: {problem}")


def _alias(name: str) -> str:
    alias = KafkaClientProps.model_fields[name].alias
    return alias or name


SUPPORTED = tuple(sorted(_alias(n) for n in KafkaClientProps.model_fields))


def _describe(err: ValidationError) -> str:
    """The first problem as ``property: what is wrong``; unknown properties first."""
    errors = err.errors(include_url=False)
    extra = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if extra:
        return f"{extra[0]}: not supported by kraftkeeper's Kafka client (supported: {', '.join(SUPPORTED)})"
    e = errors[0]
    cause = e.get("ctx", {}).get("error")
    if isinstance(cause, _Refusal):
        return str(cause)
    prop = str(e["loc"][0]) if e["loc"] else "properties"
    if isinstance(cause, ValueError):
        return f"{prop}: {cause}"
    if e["type"] == "string_type":
        return f"{prop}: must be a string, got {e['input']!r:.80}"
    return f"{prop}: {e['msg'][:1].lower()}{e['msg'][1:]}, got {e['input']!r:.80}"


def _jaas_options(jaas: str) -> tuple[str, dict[str, str]]:
    """``org.apache...PlainLoginModule required username="u" password="p";`` -> module, options."""
    m = re.match(r"\s*([\w.$]+)\s+(required|requisite|sufficient|optional)\s*(.*?);?\s*$", jaas, re.S)
    if m is None:
        raise _Refusal("sasl.jaas.config", f"cannot parse {jaas[:60]!r}")
    opts = dict(re.findall(r'(\w+)\s*=\s*"((?:[^"\\]|\\.)*)"', m.group(3)))
    return m.group(1), opts


# ---- the connection settings ---------------------------------------------------------------
@dataclass
class ClientSettings:
    """What a :class:`.wire.KafkaConnection` needs, made from a checked :class:`KafkaClientProps`."""

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
    def from_dict(cls, props: Mapping[str, str], base: Path = Path(".")) -> ClientSettings:
        """Settings from parsed properties; relative file names are relative to ``base``."""
        try:
            doc = KafkaClientProps.model_validate(dict(props))
        except ValidationError as e:
            raise ClientConfigError(_describe(e)) from None
        s = cls(
            security_protocol=doc.security_protocol,
            client_id=doc.client_id,
            request_timeout_ms=doc.request_timeout_ms,
            api_timeout_ms=doc.api_timeout_ms,
        )
        if doc.security_protocol in ("SSL", "SASL_SSL"):
            s.ssl_context = _ssl_context(doc, base)
            s.server_hostname_check = doc.ssl_endpoint_identification_algorithm != ""
            if not s.server_hostname_check:
                s.ssl_context.check_hostname = False
        if doc.security_protocol.startswith("SASL_"):
            _, opts = _jaas_options(doc.sasl_jaas_config or "")
            s.sasl = {
                "security_protocol": doc.security_protocol,
                "sasl_mechanism": doc.sasl_mechanism,
                "sasl_plain_username": opts["username"],
                "sasl_plain_password": opts["password"],
            }
        return s


def _resolve(base: Path, value: str) -> str:
    p = Path(value)
    return str(p if p.is_absolute() else base / p)


def _ssl_context(doc: KafkaClientProps, base: Path) -> ssl.SSLContext:
    # As Kafka's Java client: a configured truststore is the only trust anchor; without one, the
    # system's CAs.
    ca = doc.ssl_truststore_location or doc.ssl_ca_location
    own_trust = ca is not None or doc.ssl_truststore_certificates is not None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT) if own_trust else ssl.create_default_context()
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    if ca is not None:
        if doc.ssl_truststore_type != "PEM":
            raise ClientConfigError(
                f"ssl.truststore.type: {doc.ssl_truststore_type} stores cannot be read here; convert the "
                "truststore to PEM (ssl.truststore.type=PEM)"
            )
        try:
            ctx.load_verify_locations(cafile=_resolve(base, ca))
        except (OSError, ssl.SSLError) as e:
            raise ClientConfigError(f"ssl.truststore.location: {ca}: {e}") from None
    if doc.ssl_truststore_certificates is not None:
        ctx.load_verify_locations(cadata=doc.ssl_truststore_certificates.replace("\\n", "\n"))
    if doc.ssl_keystore_location is not None:
        if doc.ssl_keystore_type != "PEM":
            raise ClientConfigError(
                f"ssl.keystore.type: {doc.ssl_keystore_type} stores cannot be read here; use a PEM keystore "
                "(certificate chain and private key in one file, ssl.keystore.type=PEM)"
            )
        ks = _resolve(base, doc.ssl_keystore_location)
        try:
            ctx.load_cert_chain(ks, password=doc.ssl_key_password)
        except (OSError, ssl.SSLError) as e:
            raise ClientConfigError(f"ssl.keystore.location: {ks}: {e}") from None
    return ctx


# ---- from a Kubernetes Secret ---------------------------------------------------------------
def settings_from_secret(data: Mapping[str, str], key: str, where: str) -> ClientSettings:
    """Client settings from a Secret's ``data`` (base64 values): the Secret's key (default
    ``client.properties``) is a Kafka client properties file, and relative file names in it name
    other keys of the same Secret. Those are written with mode 0600 into a private temporary
    directory that is removed once the TLS context has read them."""
    if key not in data:
        raise ClientConfigError(f"{where}: has no key {key!r} (keys: {', '.join(sorted(data)) or 'none'})")
    files: dict[str, bytes] = {}
    for name, value in data.items():
        try:
            files[name] = base64.b64decode(value, validate=True)
        except ValueError:
            raise ClientConfigError(f"{where}: key {name!r} is not valid base64") from None
    try:
        props = parse_client_properties(files[key].decode(), f"{where} key {key}")
    except UnicodeDecodeError:
        raise ClientConfigError(f"{where}: key {key!r} is not a UTF-8 properties file") from None
    tmp = Path(tempfile.mkdtemp(prefix="kk-kafka-client-"))
    try:
        for name, blob in files.items():
            if name in (".", "..") or "/" in name:  # the API server refuses such keys; be sure
                continue
            fd = os.open(tmp / name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(blob)
        try:
            return ClientSettings.from_dict(props, base=tmp)
        except ClientConfigError as e:
            raise ClientConfigError(f"{where} key {key}: {str(e).replace(str(tmp) + '/', '')}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def fingerprint(data: Mapping[str, str] | None) -> str:
    """A digest of a Secret's data: a changed Secret gives a new client."""
    return hashlib.sha256(repr(sorted((data or {}).items())).encode()).hexdigest()
