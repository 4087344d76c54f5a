"""The node process keeps large catch-up buffers in the malloc heap
(``quorum.runtime.run.keep_large_buffers``): on glibc the tuning is applied, elsewhere it is
skipped and reported, never an error. Run in a child process: it changes process-wide state."""

from __future__ import annotations

import platform
import subprocess
import sys


def test_keep_large_buffers_applies_on_glibc_and_never_fails() -> None:
    code = "from quorum.runtime.run import keep_large_buffers as k; print(k(), k())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    expect = "True" if sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc" else "False"
    assert out.stdout.split() == [expect, expect]  # and calling it twice is harmless
