"""The benchmarks' child processes, always cleaned up: every process gets its own session, so a
SIGTERM/SIGKILL to the group also reaches its children, and :class:`ProcessSet` is torn down in a
``finally`` even on Ctrl-C; the ``kraftkeeper`` command to launch and the event loop to run on.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def kraftkeeper_command() -> list[str]:
    """The ``kraftkeeper`` command: the one beside this interpreter (the venv), else on PATH."""
    beside = Path(sys.executable).parent / "kraftkeeper"
    if beside.exists():
        return [str(beside)]
    found = shutil.which("kraftkeeper")
    if found:
        return [found]
    return [sys.executable, "-m", "quorum.cli"]


@dataclass
class Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path


class ProcessSet:
    """Child processes, each in its own session (= process group), all stopped on ``close()``.

    Invariant: after ``close()`` returns, no process group started here is alive (SIGTERM, a
    grace period, then SIGKILL to the whole group)."""

    def __init__(self, log_dir: Path) -> None:
        self.log_dir = log_dir
        self.procs: dict[str, Proc] = {}

    def __enter__(self) -> ProcessSet:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def spawn(
        self, name: str, argv: Sequence[str], env: dict[str, str] | None = None, cwd: Path | None = None
    ) -> Proc:
        if name in self.procs and self.procs[name].popen.poll() is None:
            raise RuntimeError(f"process {name!r} is already running")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / f"{name}.log"
        with open(log_path, "ab") as log:
            popen = subprocess.Popen(
                list(argv),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **(env or {})},
                cwd=str(cwd or REPO_ROOT),
                start_new_session=True,
            )
        proc = Proc(name, popen, log_path)
        self.procs[name] = proc
        return proc

    def alive(self, name: str) -> bool:
        p = self.procs.get(name)
        return p is not None and p.popen.poll() is None

    def check_alive(self, name: str) -> None:
        """Raise with the tail of the log if the process exited: a crashed node must not look
        like a slow one."""
        p = self.procs[name]
        if p.popen.poll() is not None:
            tail = self.tail(name)
            last = next((ln for ln in reversed(tail.splitlines()) if ln.strip()), "")
            raise RuntimeError(f"{name} exited with {p.popen.returncode}: {last}\nlog tail:\n{tail}")

    def tail(self, name: str, lines: int = 20) -> str:
        try:
            text = self.procs[name].log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, name: str, sig: int = signal.SIGTERM, grace: float = 10.0) -> None:
        p = self.procs.get(name)
        if p is None:
            return
        _signal_group(p.popen, sig)
        try:
            p.popen.wait(grace)
        except subprocess.TimeoutExpired:
            _signal_group(p.popen, signal.SIGKILL)
            p.popen.wait()
        # The group may hold children even after the leader exited.
        _signal_group(p.popen, signal.SIGKILL)

    def kill(self, name: str) -> None:
        self.stop(name, signal.SIGKILL)

    def close(self) -> None:
        for p in self.procs.values():
            _signal_group(p.popen, signal.SIGTERM)
        deadline = time.monotonic() + 10.0
        for p in self.procs.values():
            try:
                p.popen.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
            _signal_group(p.popen, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(5)
        self.procs.clear()


def _signal_group(popen: subprocess.Popen[bytes], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(popen.pid, sig)


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Turn SIGTERM into KeyboardInterrupt so ``finally`` blocks clean up on either signal."""

    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    old = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run_python_module(module: str, args: Sequence[str], timeout: float) -> str:
    """Run ``python -m module args`` from the repository root in its own process group; return
    stdout. Killed as a group on timeout or interrupt."""
    popen = subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        cwd=str(REPO_ROOT),
        start_new_session=True,
    )
    try:
        out, err = popen.communicate(timeout=timeout)
    finally:
        _signal_group(popen, signal.SIGKILL)
        if popen.poll() is None:
            popen.wait()
    if popen.returncode != 0:
        raise RuntimeError(f"{module} {' '.join(args)} failed ({popen.returncode}): {err.decode()[-2000:]}")
    return out.decode()


def use_uvloop() -> bool:
    """Use uvloop for this process's event loops when it is installed, as the engine does
    (quorum/runtime/run.py): the front ends and generators under comparison then share one
    event-loop implementation."""
    try:
        import uvloop
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
