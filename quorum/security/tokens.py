"""Bearer tokens (``Authorization: Bearer TOKEN``) for clients that do not hold a certificate.

A token is 32 random bytes from :mod:`secrets` (``kk_`` + URL-safe base64). The server keeps
only its SHA-256 in ``tokens.json`` (mode 0600) with the client's name and role::

    {"version": 1, "tokens": [{"name": "app", "role": "readwrite", "sha256": "<64 hex>"}]}

A stolen tokens file therefore reveals no usable token. Lookup hashes the presented token and
compares it with *every* entry using :func:`hmac.compare_digest`, so the time taken does not
depend on which entry (if any) matched or on how much of a hash agreed.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quorum.security.pki import ROLES, check_client_name, write_private
from quorum.strictjson import get_int, get_str, loads_strict
from quorum.types import ErrorCode, KraftError

__all__ = ["TOKENS_FILE", "TokenEntry", "TokenStore", "new_token"]

TOKENS_FILE = "tokens.json"
MAX_TOKEN = 256
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_TOKEN = re.compile(r"^[A-Za-z0-9._~+/=_-]{16,256}$")


def new_token() -> str:
    """A fresh random bearer token."""
    return "kk_" + secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def valid_token_syntax(token: str) -> bool:
    """RFC 6750 b64token characters, 16-256 long: anything else is refused before hashing."""
    return bool(_TOKEN.match(token))


@dataclass(frozen=True)
class TokenEntry:
    name: str
    role: str
    sha256: str


class TokenStore:
    """The hashed tokens of one cluster (``tokens.json``)."""

    def __init__(self, entries: list[TokenEntry] | None = None, path: Path | None = None) -> None:
        self.entries = list(entries or [])
        self.path = path

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> TokenStore:
        """Read a tokens file (a missing file is an empty store); INVALID_REQUEST naming the file
        and the entry when malformed."""
        p = Path(path)
        try:
            raw = p.read_bytes()
        except FileNotFoundError:
            return cls([], p)
        return cls(cls.parse(raw, str(p)), p)

    @staticmethod
    def parse(raw: bytes, where: str) -> list[TokenEntry]:
        d: Any = loads_strict(raw, where)
        if not isinstance(d, dict) or set(d) != {"version", "tokens"}:
            raise KraftError(
                ErrorCode.INVALID_REQUEST, f'{where}: expected {{"version": 1, "tokens": [...]}}'
            )
        if get_int(d, "version", where, (1, 1)) != 1 or not isinstance(d["tokens"], list):
            raise KraftError(ErrorCode.INVALID_REQUEST, f"{where}: field tokens must be a list")
        out = []
        for i, item in enumerate(d["tokens"]):
            w = f"{where}: tokens[{i}]"
            if not isinstance(item, dict) or set(item) != {"name", "role", "sha256"}:
                raise KraftError(ErrorCode.INVALID_REQUEST, f"{w} must have exactly name, role, sha256")
            name = str(get_str(item, "name", w, max_len=64))
            role = str(get_str(item, "role", w, max_len=16))
            digest = str(get_str(item, "sha256", w, max_len=64, pattern=_HEX64))
            if role not in ROLES:
                raise KraftError(ErrorCode.INVALID_REQUEST, f"{w}: field role={role!r} is not one of {ROLES}")
            out.append(TokenEntry(name, role, digest))
        return out

    def save(self) -> None:
        if self.path is None:
            raise ValueError("token store has no file")
        body = {"version": 1, "tokens": [e.__dict__ for e in self.entries]}
        write_private(self.path, (json.dumps(body, indent=1) + "\n").encode())

    def add(self, name: str, role: str) -> str:
        """Create a token for ``name`` with ``role``, replacing that name's earlier token;
        returns the token (the only time it exists in clear)."""
        check_client_name(name)
        if role not in ROLES:
            raise KraftError(
                ErrorCode.INVALID_REQUEST, f"invalid role {role!r:.40}: use one of {', '.join(ROLES)}"
            )
        token = new_token()
        self.entries = [e for e in self.entries if e.name != name] + [
            TokenEntry(name, role, token_hash(token))
        ]
        return token

    def lookup(self, token: str) -> TokenEntry | None:
        """The entry of ``token``, or None; constant-time over the entries."""
        if not valid_token_syntax(token):
            return None
        digest = token_hash(token).encode()
        found: TokenEntry | None = None
        for e in self.entries:
            if hmac.compare_digest(digest, e.sha256.encode()):
                found = e
        return found
