"""The Kafka controller image's entrypoint (images/kafka-controller/entrypoint.sh): how it formats.

Run with bash on this machine, with a stand-in ``java`` on PATH that records its arguments and, for
``kafka.tools.StorageTool format``, writes the meta.properties Kafka would; the real format and
start are tested on the kubelet (tests/kubelet/test_kafka_pods.py). What is checked here is the
decision that keeps a replaced disk from coming back under its old identity: bootstrap formats
with --initial-controllers, join with --no-initial-controllers, a formatted volume is never
formatted again, and a volume with foreign files or bad settings is refused with a clear message.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENTRYPOINT = REPO / "images" / "kafka-controller" / "entrypoint.sh"
INITIAL = "0@h0:9093:bXzq3nE7T2e8q1dN8c5X6A,1@h1:9093:Qm0kB6mWQ7yv3pXh2cL9sg"

STUB_JAVA = """#!/bin/bash
echo "$*" >> "$STUB_LOG"
if [[ " $* " == *" kafka.tools.StorageTool "* ]]; then
  cfg=""; prev=""
  for a in "$@"; do [ "$prev" = "--config" ] && cfg="$a"; prev="$a"; done
  dir="$(sed -n 's/^log.dirs=//p' "$cfg")"
  mkdir -p "$dir"
  printf 'version=1\\ncluster.id=c\\nnode.id=1\\ndirectory.id=%s\\n' "${STUB_DIR_ID:-NEWID}" \\
    > "$dir/meta.properties"
fi
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    java = bin_dir / "java"
    java.write_text(STUB_JAVA)
    java.chmod(0o755)
    template = tmp_path / "server.properties"
    template.write_text("process.roles=controller\n")
    (tmp_path / "vol").mkdir()
    jaas = tmp_path / "jaas"
    jaas.write_text('org.apache.kafka.common.security.plain.PlainLoginModule required username="u";\n')
    return {
        "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
        "STUB_LOG": str(tmp_path / "java.log"),
        "KAFKA_VOLUME": str(tmp_path / "vol"),
        "KAFKA_CONFIG_TEMPLATE": str(template),
        "KAFKA_CONFIG_OUT": str(tmp_path / "out.properties"),
        "KAFKA_JAAS_FILE": str(jaas),
        "POD_NAME": "kafka-controller-1",
        "KAFKA_ADVERTISED_HOST": "{pod}.kafka-controller.ns.svc.cluster.local",
        "KAFKA_CLUSTER_ID": "kKq9aS2fQ8a4Rr1q0yT3dw",
        "KAFKA_INITIAL_CONTROLLERS": INITIAL,
    }


def run(env: dict[str, str], **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(ENTRYPOINT)], env={**env, **extra}, capture_output=True, text=True,
                          timeout=30)


def java_calls(env: dict[str, str]) -> list[str]:
    log = Path(env["STUB_LOG"])
    return log.read_text().splitlines() if log.exists() else []


def test_bootstrap_formats_with_the_initial_voters_then_starts(env: dict[str, str]) -> None:
    p = run(env, KAFKA_FORMAT_MODE="bootstrap")
    assert p.returncode == 0, p.stderr
    fmt, start = java_calls(env)
    assert "kafka.tools.StorageTool format" in fmt and f"--initial-controllers {INITIAL}" in fmt
    assert "--cluster-id kKq9aS2fQ8a4Rr1q0yT3dw" in fmt
    assert start.endswith(f"kafka.Kafka {env['KAFKA_CONFIG_OUT']}")
    conf = Path(env["KAFKA_CONFIG_OUT"]).read_text()
    data = Path(env["KAFKA_VOLUME"]) / "data"
    assert "node.id=1\n" in conf and f"log.dirs={data}\n" in conf
    me = "kafka-controller-1.kafka-controller.ns.svc.cluster.local:9093"
    assert f"advertised.listeners=CONTROLLER://{me}" in conf
    assert "listener.name.controller.plain.sasl.jaas.config=org.apache.kafka" in conf
    assert (data / "meta.properties").exists() and not (Path(env["KAFKA_VOLUME"]) / ".formatting").exists()


def test_join_formats_a_new_directory_and_a_formatted_volume_is_never_formatted_again(
    env: dict[str, str],
) -> None:
    p = run(env, KAFKA_FORMAT_MODE="join")
    assert p.returncode == 0, p.stderr
    fmt = java_calls(env)[0]
    assert "--no-initial-controllers" in fmt
    assert "--initial-controllers" not in fmt.replace("--no-initial", "")
    # Started again on the same volume, even in bootstrap mode: no format, same directory id.
    meta = Path(env["KAFKA_VOLUME"]) / "data" / "meta.properties"
    before = meta.read_text()
    p = run(env, KAFKA_FORMAT_MODE="bootstrap", STUB_DIR_ID="OTHER")
    assert p.returncode == 0, p.stderr
    assert "is formatted (directory.id=NEWID)" in p.stdout
    assert len(java_calls(env)) == 3 and "StorageTool" not in java_calls(env)[2]
    assert meta.read_text() == before


def test_an_empty_volume_joins_once_the_quorum_formed_whatever_the_mode_says(env: dict[str, str]) -> None:
    # A manifest re-applied after the formation sets format-mode back to bootstrap; the marker
    # the formation left (not in the manifest) wins.
    p = run(env, KAFKA_FORMAT_MODE="bootstrap", KAFKA_QUORUM_FORMED="2026-11-29T04:00:00Z")
    assert p.returncode == 0, p.stderr
    assert "the quorum formed at 2026-11-29T04:00:00Z: joining" in p.stdout
    fmt = java_calls(env)[0]
    assert "--no-initial-controllers" in fmt and INITIAL not in fmt


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        ({"KAFKA_FORMAT_MODE": "rejoin"}, "KAFKA_FORMAT_MODE must be bootstrap or join, not rejoin"),
        ({"KAFKA_FORMAT_MODE": "bootstrap", "KAFKA_INITIAL_CONTROLLERS": ""},
         "needs KAFKA_INITIAL_CONTROLLERS"),
        ({"POD_NAME": "kafka-controller"}, "does not end in -<ordinal>"),
        ({"KAFKA_CLUSTER_ID": ""}, "KAFKA_CLUSTER_ID is not set"),
        ({"KAFKA_CONFIG_TEMPLATE": "/nonexistent/server.properties"}, "is missing"),
    ],
)
def test_bad_settings_are_refused_naming_what_is_wrong(env: dict[str, str], extra: dict[str, str],
                                                       needle: str) -> None:
    p = run(env, **extra)
    assert p.returncode == 2 and needle in p.stderr, (p.returncode, p.stderr)
    assert not (Path(env["KAFKA_VOLUME"]) / "data").exists()


def test_a_volume_with_foreign_files_is_not_formatted(env: dict[str, str]) -> None:
    data = Path(env["KAFKA_VOLUME"]) / "data"
    data.mkdir()
    (data / "something").write_text("not ours")
    p = run(env, KAFKA_FORMAT_MODE="join")
    assert p.returncode == 2 and "holds files but no meta.properties" in p.stderr, p.stderr
    assert java_calls(env) == [] and (data / "something").read_text() == "not ours"
