"""The client config file (``--client-config FILE`` / ``KRAFTKEEPER_CLIENT_CONFIG``).

Contract (``docs/reference.md``, "Client config")::

    {"ca_file": "tls/ca.crt", "cert_file": "tls/admin.crt", "key_file": "tls/admin.key",
     "token_file": "tls/admin.token"}

The document's model is :class:`quorum.security.clientmodel.ClientConfigDoc` (strict: a JSON
object, only these keys, an unknown key refused by name, non-empty path strings; at least one of
``cert_file`` or ``token_file``; ``key_file`` goes with ``cert_file``), imported only when a
config is read. Relative paths are relative to the config file's folder. A client with a config always speaks
https (a bearer token or a client certificate is never sent over plaintext) and verifies the
nodes against ``ca_file``, or against the system's trust store when the config has none. Every
refusal is ``INVALID_REQUEST`` naming the config file and the key or file at fault.
"""

from __future__ import annotations

import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quorum.security.tlsctx import client_context
from quorum.security.tokens import MAX_TOKEN, valid_token_syntax
from quorum.strictjson import loads_strict
from quorum.types import ErrorCode, KraftError

__all__ = ["ENV_VAR", "KEYS", "ClientConfig", "load_client_config", "parse_client_config", "resolve"]

ENV_VAR = "KRAFTKEEPER_CLIENT_CONFIG"
KEYS = ("ca_file", "cert_file", "key_file", "token_file")  # the model's fields, in this order
MAX_CONFIG_BYTES = 64 * 1024


def _bad(where: str, msg: str) -> KraftError:
    return KraftError(ErrorCode.INVALID_REQUEST, f"client config {where}: {msg}")


@dataclass(frozen=True)
class ClientConfig:
    """Resolved absolute paths; ``None`` for what the file leaves out."""

    source: str
    ca_file: Path | None = None
    cert_file: Path | None = None
    key_file: Path | None = None
    token_file: Path | None = None

    @property
    def scheme(self) -> str:
        return "https"

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context: verifies nodes against ``ca_file`` (else the system trust store)
        and presents the client certificate when there is one."""
        return client_context(self.ca_file, self.cert_file, self.key_file)

    def headers(self) -> dict[str, str]:
        """``Authorization: Bearer ...`` when a token file is configured."""
        if self.token_file is None:
            return {}
        try:
            raw = self.token_file.read_bytes()
        except OSError as e:
            raise _bad(self.source, f"cannot read token_file {self.token_file}: {e.strerror}") from None
        token = raw[: MAX_TOKEN + 2].decode("ascii", "replace").strip()
        if len(raw) > MAX_TOKEN + 2 or not valid_token_syntax(token):
            raise _bad(self.source, f"token_file {self.token_file} does not hold a bearer token")
        return {"Authorization": f"Bearer {token}"}


def parse_client_config(raw: bytes, where: str, base_dir: str | os.PathLike[str]) -> ClientConfig:
    """Parse config bytes (no file checks): the strict model, then paths resolved."""
    if len(raw) > MAX_CONFIG_BYTES:
        raise _bad(where, f"larger than {MAX_CONFIG_BYTES} bytes")
    try:
        obj: Any = loads_strict(raw, f"client config {where}", max_depth=2)
    except KraftError as e:
        raise KraftError(ErrorCode.INVALID_REQUEST, e.message) from None
    from quorum.security.clientmodel import ClientConfigDocError, validate  # pydantic: only here

    try:
        doc = validate(obj)
    except ClientConfigDocError as e:
        raise _bad(where, str(e)) from None
    # an absolute path replaces base_dir
    paths = {k: Path(base_dir) / v for k, v in doc.paths().items()}
    return ClientConfig(where, **paths)


def load_client_config(path: str | os.PathLike[str]) -> ClientConfig:
    """Read and check a config file, and that every file it names can be read."""
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise _bad(str(p), f"cannot read it: {e.strerror}") from None
    cfg = parse_client_config(raw, str(p), p.parent)
    for k in KEYS:
        f = getattr(cfg, k)
        if f is not None and not os.access(f, os.R_OK):
            raise _bad(str(p), f"{k} {f} does not exist or cannot be read")
    return cfg


def resolve(arg: str | None) -> ClientConfig | None:
    """The config of ``--client-config`` or, when not given, of ``$KRAFTKEEPER_CLIENT_CONFIG``."""
    path = arg or os.environ.get(ENV_VAR) or None
    return load_client_config(path) if path else None
