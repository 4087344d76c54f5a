"""Kafka message classes built from Apache Kafka's own published JSON message schemas.

kafka-python generates its message classes from Kafka's JSON schemas (``kafka.protocol``), but
ships none for AddRaftVoter (API key 80) or RemoveRaftVoter (81), the KIP-853 membership calls.
Rather than hand-write a codec, we hand kafka-python's generator the schemas exactly as Kafka
publishes them: ``common/message/*.json`` inside the ``kafka-clients`` jar that scripts/kafka.sh
caches. The jar is read in place (a zip file), through a small package whose resource reader
serves ``zipfile.Path`` entries, so kafka-python's ``load_json`` finds them as it finds its own.

The jar is looked up, in order: ``KRAFTKEEPER_KAFKA_CLIENTS_JAR``; a ``kafka-clients-*.jar`` in
``KRAFTKEEPER_KAFKA_LIBS``, then in ``$KAFKA_HOME/libs`` (a Kafka installation, 3.9 or later);
the newest cached ``kafka-*/libs``. The product image carries a schemas-only jar
(:func:`write_schema_jar`, run by scripts/build-image.sh) under ``KRAFTKEEPER_KAFKA_LIBS``, so the
operator on Kubernetes needs nothing mounted. Without one the membership calls
fail with a clear error naming the missing jar and the script that fetches it; DescribeQuorum
(from kafka-python's own schemas) still works. Both sides use this module: the operator's Kafka
backend (client) and the node's Kafka-wire listener (server, ``quorum.kafka.server``).
"""

from __future__ import annotations

import functools
import importlib.machinery
import os
import sys
import types
import zipfile
from pathlib import Path
from typing import Any

from kafka.protocol.api_message import ApiMessage  # type: ignore[import-untyped]

_PACKAGE = "quorum.kafka._jar_schemas"


def cache_dir() -> Path:
    return Path(os.environ.get("KK_CACHE") or Path.home() / ".cache" / "kraftkeeper")


class SchemaJarMissing(RuntimeError):
    pass


def find_clients_jar() -> Path:
    env = os.environ.get("KRAFTKEEPER_KAFKA_CLIENTS_JAR")
    if env:
        if not Path(env).is_file():
            raise SchemaJarMissing(f"KRAFTKEEPER_KAFKA_CLIENTS_JAR={env}: no such file")
        return Path(env)
    dirs: list[Path] = []
    if os.environ.get("KRAFTKEEPER_KAFKA_LIBS"):
        dirs.append(Path(os.environ["KRAFTKEEPER_KAFKA_LIBS"]))
    if os.environ.get("KAFKA_HOME"):  # a Kafka installation's own jars
        dirs.append(Path(os.environ["KAFKA_HOME"]) / "libs")
    dirs += sorted(cache_dir().glob("kafka-*/libs"), reverse=True)
    for d in dirs:
        jars = sorted(d.glob("kafka-clients-*.jar"), reverse=True)
        if jars:
            return jars[0]
    raise SchemaJarMissing(
        "no kafka-clients jar found (it carries Kafka's message schemas for AddRaftVoter / "
        "RemoveRaftVoter): set KAFKA_HOME to a Kafka 3.9+ installation, or KRAFTKEEPER_KAFKA_CLIENTS_JAR, "
        "or run scripts/kafka.sh install"
    )


class _ZipReader:
    def __init__(self, root: zipfile.Path) -> None:
        self.root = root

    def files(self) -> zipfile.Path:
        return self.root


class _ZipLoader:
    """Just enough of a loader for ``importlib.resources`` to read files from a jar folder."""

    def __init__(self, root: zipfile.Path) -> None:
        self.root = root

    def get_resource_reader(self, name: str) -> _ZipReader:
        return _ZipReader(self.root)


def _install_package(jar: Path) -> str:
    root = zipfile.Path(str(jar), at="common/message/")
    if not (root / "AddRaftVoterRequest.json").exists():
        raise SchemaJarMissing(
            f"{jar} has no common/message/AddRaftVoterRequest.json (Kafka older than 3.9?)"
        )
    mod = types.ModuleType(_PACKAGE)
    mod.__spec__ = importlib.machinery.ModuleSpec(_PACKAGE, _ZipLoader(root), is_package=True)  # type: ignore[arg-type]
    mod.__path__ = []
    mod.__package__ = _PACKAGE
    sys.modules[_PACKAGE] = mod
    return _PACKAGE


def write_schema_jar(source: Path, dest: Path) -> int:
    """Copy only ``common/message/*.json`` of a kafka-clients jar into a small jar at ``dest``
    (about 0.5 MB instead of 11 MB; the image needs nothing else from it). Returns how many
    schemas were written; refuses a jar without the KIP-853 membership schemas."""
    with zipfile.ZipFile(source) as src:
        names = [n for n in src.namelist() if n.startswith("common/message/") and n.endswith(".json")]
        if "common/message/AddRaftVoterRequest.json" not in names:
            raise SchemaJarMissing(
                f"{source} has no common/message/AddRaftVoterRequest.json (Kafka older than 3.9?)"
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(dest.name + ".tmp")
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_DEFLATED) as out:
            for name in sorted(names):
                out.writestr(name, src.read(name))
    tmp.replace(dest)
    return len(names)


@functools.cache
def membership_messages() -> dict[str, Any]:
    """``{"AddRaftVoterRequest": cls, ...}``, generated once from the jar's schemas."""
    pkg = _install_package(find_clients_jar())
    out: dict[str, Any] = {}
    for name in (
        "AddRaftVoterRequest",
        "AddRaftVoterResponse",
        "RemoveRaftVoterRequest",
        "RemoveRaftVoterResponse",
    ):
        # The class name selects the schema file (kafka-python's convention).
        out[name] = types.new_class(name, (ApiMessage,), {"load_json": pkg})
    return out


def main(argv: list[str] | None = None) -> int:
    """``python -m quorum.kafka.schemas write-jar SOURCE DEST``: the image build's step."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 3 or args[0] != "write-jar":
        print("usage: python -m quorum.kafka.schemas write-jar SOURCE_JAR DEST_JAR", file=sys.stderr)
        return 2
    try:
        n = write_schema_jar(Path(args[1]), Path(args[2]))
    except (OSError, zipfile.BadZipFile, SchemaJarMissing) as e:
        print(f"schemas: {e}", file=sys.stderr)
        return 1
    print(f"wrote {n} Kafka message schemas to {args[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
