"""``meta.properties``: the identity of a formatted data directory (KIP-856 "Storage UUID").

Format: Java properties, like Kafka's, one ``key=value`` per line::

    version=1
    cluster.id=<cluster id>
    node.id=<replica id>
    directory.id=<storage UUID, canonical 8-4-4-4-12 lower-case>

KIP-856 names the UUID property ``storage.id``; Apache Kafka shipped the same idea as
``directory.id`` (KIP-858 / KIP-853). We write ``directory.id`` and accept either when
reading (if both are present they must agree).

Rules (KIP-856 section "meta.properties"):

* a directory without ``meta.properties`` is not formatted: a node refuses to start
  (``NOT_FORMATTED``);
* a ``meta.properties`` without a storage UUID gets one generated and the file is replaced
  atomically (the upgrade path);
* ``format`` refuses an already formatted directory unless told to ignore it (``--ignore-formatted``
  keeps the existing identity, as ``kafka-storage format --ignore-formatted`` does: it never
  silently gives a directory a new UUID).
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field

from quorum.properties import parse_property_lines, property_line
from quorum.storage.atomic import atomic_write, ensure_dir, restrict_dir
from quorum.storage.dirlock import DataDirLock
from quorum.types import (
    ErrorCode,
    KraftError,
    ReplicaKey,
    canonical_uuid,
    is_cluster_id,
    new_storage_uuid,
    validate_cluster_id,
)

__all__ = [
    "META_FILE",
    "MetaProperties",
    "decode_meta",
    "format_dir",
    "load_meta",
    "render_properties",
    "validate_cluster_id",
    "validate_node_id",
]

log = logging.getLogger(__name__)

META_FILE = "meta.properties"
META_VERSION = 1
UUID_KEY = "directory.id"
INITIAL_KEY = "bootstrap.initial"  # "false": formatted to replace a disk (not a bootstrap voter)
UUID_KEY_KIP856 = "storage.id"
_MAX_NODE_ID = 2**31 - 1  # node ids are int32 on the wire (KIP-595 ReplicaId)


@dataclass(frozen=True)
class MetaProperties:
    """The identity of one data directory."""

    cluster_id: str
    node_id: int
    storage_uuid: str
    version: int = META_VERSION
    extra: dict[str, str] = field(default_factory=dict, compare=False)  # unknown keys, kept on rewrite

    @property
    def initial_bootstrap(self) -> bool:
        """False for a directory formatted to replace a lost disk of an existing cluster
        (``format --no-initial-controllers``, as Kafka's KIP-853 flag): such a node must learn
        the voter set from the leader and may never count itself a bootstrap voter."""
        return self.extra.get(INITIAL_KEY, "true").strip().lower() != "false"

    @property
    def replica_key(self) -> ReplicaKey:
        """The (replica id, storage UUID) pair KIP-856 uses to name voters."""
        return ReplicaKey(self.node_id, self.storage_uuid)

    def to_properties(self) -> dict[str, str]:
        props = dict(self.extra)
        props.update(
            {
                "version": str(self.version),
                "cluster.id": self.cluster_id,
                "node.id": str(self.node_id),
                UUID_KEY: self.storage_uuid,
            }
        )
        return props


def validate_node_id(node_id: object) -> int:
    """A node id is an int32 >= 0 (KIP-595 ReplicaId). Raises INVALID_REQUEST."""
    if isinstance(node_id, bool) or not isinstance(node_id, int) or not 0 <= node_id <= _MAX_NODE_ID:
        raise KraftError(
            ErrorCode.INVALID_REQUEST, f"invalid node id {node_id!r}: must be an integer 0..{_MAX_NODE_ID}"
        )
    return node_id


# -- the file's text (Java properties: quorum.properties) -------------------------------------


def render_properties(props: dict[str, str]) -> bytes:
    """Properties text in a stable order: known keys first, then the rest sorted."""
    order = ["version", "cluster.id", "node.id", UUID_KEY]
    keys = [k for k in order if k in props] + sorted(k for k in props if k not in order)
    stamp = time.strftime("%a %b %d %H:%M:%S UTC %Y", time.gmtime())
    lines = ["#", f"#{stamp}"] + [property_line(k, props[k]) for k in keys]
    return ("\n".join(lines) + "\n").encode("utf-8")


# -- format / load -----------------------------------------------------------------------------


def _meta_path(directory: str | os.PathLike[str]) -> str:
    return os.path.join(os.fspath(directory), META_FILE)


def format_dir(
    directory: str | os.PathLike[str],
    cluster_id: str,
    node_id: int,
    ignore_formatted: bool = False,
    *,
    storage_uuid: str | None = None,
    fsync: bool = True,
    initial_bootstrap: bool = True,
) -> MetaProperties:
    """Format ``directory`` (created if missing) for ``node_id`` of ``cluster_id`` with a new
    storage UUID (KIP-856 ``kafka-storage format``).

    An already formatted directory raises ALREADY_FORMATTED; with ``ignore_formatted`` its
    existing identity is returned unchanged (after checking it is for the same cluster and node,
    otherwise ALREADY_FORMATTED as well: silently re-identifying a disk is exactly what storage
    UUIDs exist to prevent). ``storage_uuid`` forces a UUID (tests, tooling)."""
    validate_cluster_id(cluster_id)
    validate_node_id(node_id)
    uuid = (
        canonical_storage_uuid(storage_uuid, "storage uuid")
        if storage_uuid is not None
        else new_storage_uuid()
    )
    path = _meta_path(directory)
    if os.path.exists(path):
        if not ignore_formatted:
            raise KraftError(
                ErrorCode.ALREADY_FORMATTED, f"{path} already exists; use --ignore-formatted to keep it"
            )
        existing = load_meta(directory, fsync=fsync)
        if existing.cluster_id != cluster_id or existing.node_id != node_id:
            raise KraftError(
                ErrorCode.ALREADY_FORMATTED,
                f"{path} is formatted for cluster {existing.cluster_id!r} node {existing.node_id}, "
                f"not cluster {cluster_id!r} node {node_id}",
            )
        return existing
    if os.path.exists(directory) and not os.path.isdir(directory):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"{os.fspath(directory)} exists and is not a directory")
    ensure_dir(directory, fsync=fsync)
    restrict_dir(directory)
    extra = {} if initial_bootstrap else {INITIAL_KEY: "false"}
    meta = MetaProperties(cluster_id=cluster_id, node_id=node_id, storage_uuid=uuid, extra=extra)
    lock = DataDirLock.acquire(directory, purpose="format")  # not while a node uses it
    try:
        if os.path.exists(path):  # formatted meanwhile by another process
            raise KraftError(ErrorCode.ALREADY_FORMATTED, f"{path} already exists")
        atomic_write(path, render_properties(meta.to_properties()), fsync=fsync)
    finally:
        lock.release()
    return meta


def canonical_storage_uuid(value: str, what: str) -> str:
    try:
        return canonical_uuid(value)
    except (ValueError, TypeError, AttributeError):
        raise KraftError(ErrorCode.INVALID_REQUEST, f"invalid {what} {value!r}: not a UUID") from None


def load_meta(directory: str | os.PathLike[str], *, fsync: bool = True) -> MetaProperties:
    """Read ``directory/meta.properties``.

    Missing file (or directory): NOT_FORMATTED. Malformed content: CORRUPT_LOG naming the file
    and the field. No storage UUID: one is generated and the file replaced atomically
    (KIP-856), other keys kept."""
    path = _meta_path(directory)
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise KraftError(
            ErrorCode.NOT_FORMATTED,
            f"{os.fspath(directory)} is not formatted (no {META_FILE}); run kraftkeeper format",
        ) from None
    except NotADirectoryError:
        raise KraftError(ErrorCode.NOT_FORMATTED, f"{os.fspath(directory)} is not a directory") from None

    cluster_id, node_id, uuid, extra = decode_meta(raw, path)
    if uuid is not None:
        return MetaProperties(cluster_id, node_id, uuid, extra=extra)
    # KIP-856: "If the meta.properties file exist but it doesn't contain this property a new one
    # will be generated and the meta.properties files will be atomically replaced."
    meta = MetaProperties(cluster_id, node_id, new_storage_uuid(), extra=extra)
    atomic_write(path, render_properties(meta.to_properties()), fsync=fsync)
    log.warning(
        "%s had no storage UUID; generated %s and replaced the file (KIP-856)", path, meta.storage_uuid
    )
    return meta


_DIGITS = re.compile(r"^[0-9]{1,10}$")
MAX_META_BYTES = 64 * 1024


def decode_meta(raw: bytes, path: str) -> tuple[str, int, str | None, dict[str, str]]:
    """Parse ``meta.properties`` bytes strictly: (cluster id, node id, storage UUID or None,
    other keys). Anything malformed raises CORRUPT_LOG naming ``path`` and the field; a known
    key given twice is refused (two readers could otherwise disagree on a node's identity)."""

    def bad(msg: str) -> KraftError:
        return KraftError(ErrorCode.CORRUPT_LOG, f"{path}: {msg}", file=path)

    if len(raw) > MAX_META_BYTES:
        raise bad(f"larger than {MAX_META_BYTES} bytes")
    try:
        pairs = [(p.key, p.value) for p in parse_property_lines(raw.decode("utf-8"))]
    except UnicodeDecodeError as e:
        raise bad(f"not UTF-8 text ({e})") from None
    props: dict[str, str] = {}
    for k, v in pairs:
        if k in props and k in _KNOWN:
            raise bad(f"field {k!r} is given twice")
        if not _encodable(k) or not _encodable(v):
            raise bad(f"field {k!r:.60} holds an invalid character escape")
        props[k] = v
    if "version" not in props:
        raise bad("missing field 'version'")
    if props["version"].strip() != str(META_VERSION):
        raise bad(f"unsupported field 'version'={props['version']!r:.60} (expected {META_VERSION})")
    if "cluster.id" not in props:
        raise bad("missing field 'cluster.id'")
    cluster_id = props["cluster.id"].strip()
    if not is_cluster_id(cluster_id):
        raise bad(f"invalid field 'cluster.id'={cluster_id!r:.60}")
    if "node.id" not in props:
        raise bad("missing field 'node.id'")
    text = props["node.id"].strip()
    if not _DIGITS.match(text) or int(text) > _MAX_NODE_ID:
        raise bad(f"invalid field 'node.id'={props['node.id']!r:.60} (expected an integer 0..{_MAX_NODE_ID})")
    node_id = int(text)
    uuids: dict[str, str] = {}
    for key in (UUID_KEY, UUID_KEY_KIP856):
        if key in props and props[key].strip():
            try:
                uuids[key] = canonical_uuid(props[key].strip())
            except ValueError:
                raise bad(f"invalid field {key!r}={props[key]!r:.60} (expected a UUID)") from None
    if len(set(uuids.values())) > 1:
        raise bad(
            f"fields {UUID_KEY!r} and {UUID_KEY_KIP856!r} disagree "
            f"({uuids[UUID_KEY]} vs {uuids[UUID_KEY_KIP856]})"
        )
    extra = {k: v for k, v in props.items() if k not in _KNOWN}
    return cluster_id, node_id, next(iter(uuids.values()), None), extra


_KNOWN = frozenset({"version", "cluster.id", "node.id", UUID_KEY, UUID_KEY_KIP856})


def _encodable(text: str) -> bool:
    """False for text holding lone surrogates (a ``\\uD800`` escape), which cannot be written back."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
