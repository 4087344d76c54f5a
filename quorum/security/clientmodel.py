"""The client config file as a typed document: a strict pydantic model of its four keys.

Only :func:`quorum.security.clientconfig.parse_client_config` imports this module, and only when a
client reads a config file: pydantic costs a few hundred milliseconds to import, which neither a
node's start nor a client command without a config file pays (a test checks the node's start
imports no pydantic).

Strict: a JSON object with only these keys, each a non-empty path string (no ``null``, no number,
no NUL byte); at least one of ``cert_file`` or ``token_file``; ``key_file`` goes with
``cert_file``. :func:`validate` turns pydantic's report into one sentence naming the key.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from quorum.security.clientconfig import KEYS

MAX_PATH = 4096

PathText = Annotated[str, Field(min_length=1, max_length=MAX_PATH, pattern=r"^[^\x00]*$")]


class _Rule(ValueError):
    """A rule across keys: its message is the whole explanation."""


class ClientConfigDoc(BaseModel):
    """``{"ca_file": ..., "cert_file": ..., "key_file": ..., "token_file": ...}``, paths as written."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)

    ca_file: PathText | None = None
    cert_file: PathText | None = None
    key_file: PathText | None = None
    token_file: PathText | None = None

    @field_validator(*KEYS, mode="before")
    @classmethod
    def _given_means_a_path(cls, value: Any) -> Any:
        # A key that is present names a file: ``null`` is a mistake, not "left out".
        if value is None:
            raise ValueError("null")
        return value

    @model_validator(mode="after")
    def _credentials(self) -> ClientConfigDoc:
        if self.cert_file is None and self.token_file is None:
            raise _Rule("needs cert_file (with key_file) or token_file")
        if (self.cert_file is None) != (self.key_file is None):
            raise _Rule("cert_file and key_file go together")
        return self

    def paths(self) -> dict[str, str]:
        """The keys the file gives, with their paths as written."""
        return {k: v for k in KEYS if (v := getattr(self, k)) is not None}


class ClientConfigDocError(ValueError):
    """A config that does not fit the model; the message names the key and the problem."""


def validate(obj: Any) -> ClientConfigDoc:
    """``obj`` (decoded JSON) as the model, or :class:`ClientConfigDocError` in one sentence."""
    try:
        return ClientConfigDoc.model_validate(obj)
    except ValidationError as e:
        raise ClientConfigDocError(_describe(e)) from None


def _describe(err: ValidationError) -> str:
    errors = err.errors(include_url=False)
    unknown = sorted(str(e["loc"][0]) for e in errors if e["type"] == "extra_forbidden")
    if unknown:
        names = ", ".join(repr(k) for k in unknown)[:200]
        return f"unknown key(s) {names} (allowed: {', '.join(KEYS)})"
    e = errors[0]
    if not e["loc"]:
        cause = e.get("ctx", {}).get("error")
        if isinstance(cause, _Rule):
            return str(cause)
        return "must be a JSON object"
    return f"{e['loc'][0]} must be a non-empty file path string, got {e['input']!r:.80}"
