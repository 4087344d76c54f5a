"""powerfs mounts for tests: one FUSE file system (tools/powerfs) per simulated disk, whose
``clear_cache`` is a power loss of that disk (every byte not fsynced is gone).

The binary comes from ``scripts/powerfs.sh install`` (built once per source version, cached under
KK_CACHE). Each mount runs ``powerfs -f`` as a child of the test, so the test owns the process:
:meth:`PowerFs.unmount` unmounts with ``fusermount3 -u`` and reaps it, killing it by its id only
if it does not leave on its own.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from testkit.polling import wait_until

REPO = Path(__file__).resolve().parents[2]
POWERFS_SH = REPO / "scripts" / "powerfs.sh"


def build_powerfs() -> Path:
    """The powerfs binary for these sources (``scripts/powerfs.sh install``: quick when built)."""
    out = subprocess.run([str(POWERFS_SH), "install"], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, f"scripts/powerfs.sh install failed:\n{out.stdout}\n{out.stderr}"
    return Path(out.stdout.strip().splitlines()[-1])


def fuse_missing() -> str | None:
    """Why FUSE cannot be mounted here, or None."""
    if not os.path.exists("/dev/fuse"):
        return "no /dev/fuse on this machine (the container was started without the FUSE device)"
    if os.geteuid() != 0 and shutil.which("fusermount3") is None:
        return "not root and no fusermount3 to mount FUSE file systems with"
    return None


class PowerFs:
    """A powerfs mount: ``backing`` (a plain directory) seen at ``mountpoint``."""

    def __init__(self, binary: Path, root: Path, name: str) -> None:
        self.binary = binary
        self.name = name
        self.backing = root / f"{name}.backing"
        self.mountpoint = root / name
        self.log_path = root / f"{name}.powerfs.log"
        # A Unix socket path must stay under 108 bytes: a short directory of its own.
        self._sockdir = Path(tempfile.mkdtemp(prefix="powerfs-"))
        self.socket = self._sockdir / "control"
        self.proc: subprocess.Popen[bytes] | None = None

    def mount(self) -> PowerFs:
        self.backing.mkdir(parents=True, exist_ok=True)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [str(self.binary), "--control", str(self.socket), str(self.backing), str(self.mountpoint),
                 "-f"],
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        wait_until(f"powerfs mounted at {self.mountpoint}", self._ready, 30, 0.02, context=self._log)
        return self

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"powerfs exited with {self.proc.returncode}: {self._log()}")
        return os.path.ismount(self.mountpoint) and self.socket.exists()

    def _log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def command(self, cmd: str) -> str:
        """One control command; its answer (``ok ...``) once it took effect."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(30)
            s.connect(str(self.socket))
            s.sendall(cmd.encode() + b"\n")
            reply = s.makefile("rb").readline().decode().strip()
        if not reply.startswith("ok"):
            raise AssertionError(f"powerfs {self.name}: {cmd!r} answered {reply!r}")
        return reply

    def clear_cache(self) -> None:
        """Power loss of this disk: every byte not fsynced is dropped."""
        self.command("clear-cache")

    def stats(self) -> dict[str, int]:
        return {k: int(v) for k, v in (w.split("=") for w in self.command("stats").split()[1:])}

    def unmount(self) -> None:
        if self.proc is None:
            return
        proc, self.proc = self.proc, None
        if proc.poll() is None:
            run = subprocess.run(["fusermount3", "-u", str(self.mountpoint)], capture_output=True, text=True)
            if run.returncode != 0:  # busy: detach now, the daemon leaves when the last user does
                subprocess.run(["fusermount3", "-u", "-z", str(self.mountpoint)], capture_output=True)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)
        shutil.rmtree(self._sockdir, ignore_errors=True)

    def __enter__(self) -> PowerFs:
        return self.mount()

    def __exit__(self, *exc: object) -> None:
        self.unmount()
