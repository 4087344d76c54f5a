"""The product's long-running commands as subprocesses, the way the tests and the benchmarks start
and stop them: ``kraftkeeper operator local`` (a supervised loopback cluster) and ``kraftkeeper
operator run`` (the kopf operator against an API server), each in a session of its own with its
output in a log file, stopped with SIGTERM (their clean stop) and then SIGKILL to the whole group.

The callers add what only they need (the tests' ``LocalCluster`` and ``Operator`` wrappers, the
benches' timing); the command lines and the stop rule live here once.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from testkit.polling import wait_until

__all__ = [
    "kraftkeeper_argv", "reported_base_port", "spawn", "start_operator_local", "start_operator_run",
    "stop_process", "tail_of",
]


def kraftkeeper_argv(*args: str) -> list[str]:
    """The ``kraftkeeper`` command line run by this interpreter (the worktree's own code)."""
    return [sys.executable, "-m", "quorum.cli", *args]


def spawn(argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen[bytes]:
    """``argv`` in a new session (so :func:`stop_process` can kill its children too), stdout and
    stderr to ``log``."""
    with log.open("wb") as out:
        # The child keeps its own copy of the descriptor; ours is closed at once.
        return subprocess.Popen(
            list(argv),
            env=dict(env) if env is not None else None,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def start_operator_local(
    d: Path, nodes: int, base_port: int, extra: Sequence[str], log: Path
) -> subprocess.Popen[bytes]:
    """``kraftkeeper operator local --dir d --nodes N --base-port P [extra...]``. ``base_port`` 0:
    the operator chooses a free block and binds its port before it writes the block into
    ``d/cluster.json`` (:func:`reported_base_port` waits for it)."""
    argv = kraftkeeper_argv(
        "operator", "local", "--dir", str(d), "--nodes", str(nodes), "--base-port", str(base_port), *extra
    )
    return spawn(argv, log)


def reported_base_port(d: Path, proc: subprocess.Popen[Any], log: Path, timeout: float = 120) -> int:
    """The base port ``operator local`` (started with ``--base-port 0``) chose for ``d``, once it
    wrote it to ``d/cluster.json`` (its port is listening by then). Fails with the log's tail if
    the operator exits first."""

    def base() -> int | None:
        if proc.poll() is not None:
            raise AssertionError(f"operator local exited with {proc.returncode}:\n{tail_of(log)}")
        try:
            return int(json.loads((d / "cluster.json").read_text())["base_port"]) or None
        except (OSError, ValueError, KeyError):
            return None  # not written yet, or written by the caller with base_port 0

    return wait_until(f"operator local to report its ports in {d}/cluster.json", base, timeout, 0.05)


def start_operator_run(
    env: Mapping[str, str], namespace: str, log: Path, *, verbose: bool = False
) -> subprocess.Popen[bytes]:
    """``kraftkeeper operator run --standalone --namespace NS`` with ``env`` (the API server's
    kubeconfig and the operator's settings), ``--verbose`` for tests that print its log, else
    ``--quiet``."""
    argv = kraftkeeper_argv(
        "operator", "run", "--standalone", "--namespace", namespace, "--verbose" if verbose else "--quiet"
    )
    return spawn(argv, log, env)


def stop_process(proc: subprocess.Popen[Any], grace_s: float = 30) -> int:
    """SIGTERM, then after ``grace_s`` SIGKILL to the whole process group (it was started in a
    session of its own); the exit status."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return int(proc.returncode or 0)


def tail_of(log: Path, n: int = 40) -> str:
    """The last ``n`` lines of a process's log ("" before it exists)."""
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""
