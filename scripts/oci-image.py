#!/usr/bin/env python3
"""Packs a few local files into an OCI image archive that `ctr images import` accepts.

Used by scripts/k8s-node.sh to make the pod sandbox (`pause`) image of the single-node test
cluster from a static binary: no registry is reachable there, and the image needs nothing but
that one file. Only the standard library is used, so it runs before any virtualenv exists.

    scripts/oci-image.py --name kraftkeeper.local/pause:1 --out pause.tar \
        --file /path/to/pause:/pause:0755 --entrypoint /pause

The archive is an OCI image layout (oci-layout, index.json, blobs/sha256/...) with one
uncompressed layer; its index names the image both as `io.containerd.image.name` (which ctr
uses as the reference) and `org.opencontainers.image.ref.name`.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import tarfile
from pathlib import Path


def _layer(files: list[tuple[Path, str, int]]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for src, dest, mode in files:
            data = src.read_bytes()
            info = tarfile.TarInfo(dest.lstrip("/"))
            info.size, info.mode, info.mtime = len(data), mode, 0
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _blob(tar: tarfile.TarFile, data: bytes) -> str:
    digest = hashlib.sha256(data).hexdigest()
    info = tarfile.TarInfo(f"blobs/sha256/{digest}")
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}"


def build(name: str, out: Path, files: list[tuple[Path, str, int]], entrypoint: list[str]) -> None:
    layer = _layer(files)
    config = json.dumps({
        "architecture": "amd64", "os": "linux",
        "config": {"Entrypoint": entrypoint, "User": "65535:65535"},
        "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(layer).hexdigest()]},
    }, sort_keys=True).encode()
    tmp = out.with_suffix(out.suffix + ".tmp")
    with tarfile.open(tmp, mode="w") as tar:
        layer_digest = _blob(tar, layer)
        config_digest = _blob(tar, config)
        manifest = json.dumps({
            "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                       "digest": config_digest, "size": len(config)},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar",
                        "digest": layer_digest, "size": len(layer)}],
        }, sort_keys=True).encode()
        manifest_digest = _blob(tar, manifest)
        index = json.dumps({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": manifest_digest, "size": len(manifest),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {"io.containerd.image.name": name,
                                "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1]},
            }],
        }, sort_keys=True).encode()
        for fname, data in (("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'), ("index.json", index)):
            info = tarfile.TarInfo(fname)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))
    tmp.replace(out)


def _file_spec(spec: str) -> tuple[Path, str, int]:
    parts = spec.split(":")
    if len(parts) != 3 or not parts[1].startswith("/"):
        raise argparse.ArgumentTypeError(f"--file {spec!r}: expected SRC:/ABS/DEST:OCTAL_MODE")
    src = Path(parts[0])
    if not src.is_file():
        raise argparse.ArgumentTypeError(f"--file {spec!r}: {src} is not a file")
    try:
        mode = int(parts[2], 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--file {spec!r}: mode {parts[2]!r} is not octal") from None
    return src, parts[1], mode


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", required=True, help="image reference, e.g. kraftkeeper.local/pause:1")
    p.add_argument("--out", required=True, type=Path, help="archive to write")
    p.add_argument("--file", action="append", required=True, type=_file_spec,
                   help="SRC:/DEST:MODE, repeatable")
    p.add_argument("--entrypoint", required=True, help="absolute path of the program to run")
    args = p.parse_args(argv)
    if ":" not in args.name.rsplit("/", 1)[-1]:
        p.error(f"--name {args.name!r}: needs a tag (NAME:TAG)")
    build(args.name, args.out, args.file, [args.entrypoint])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
