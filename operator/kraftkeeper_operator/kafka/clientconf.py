"""Kafka client settings from a Kubernetes Secret (``spec.kafka.clientSecretRef``, kube.py): the
Secret's key (default ``client.properties``) is a Kafka client properties file, as Kafka's tools
take with ``--command-config``; relative file names in it name other keys of the same Secret."""

from __future__ import annotations

import base64
import hashlib
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

from .wire import ClientConfigError, ClientSettings, parse_client_properties


def settings_from_secret(data: Mapping[str, str], key: str, where: str) -> ClientSettings:
    """Client settings from a Secret's ``data`` (base64 values). Relative file names in the
    properties name other keys of the Secret; they are written with mode 0600 into a private
    temporary directory that is removed once the TLS context has read them."""
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
