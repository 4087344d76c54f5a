"""Helpers of the report tests: run the job as the CLI does; where artefacts are kept."""

from __future__ import annotations

import contextlib
import io
import os
from pathlib import Path

import pytest


def run_job(events: Path, out: Path, top: int = 20) -> Path:
    """``kraftkeeper report`` through its ``main``, as the CLI runs it; the output directory."""
    from kraftkeeper_reports.job import main

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        rc = main(["--events", str(events), "--out", str(out), "--top", str(top)])
    assert rc == 0
    assert buf.getvalue().strip().splitlines()[-1] == str((out / "report.html").resolve())
    return out


def artefacts_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where tests keep what a person looks at (screenshots): $KK_ARTEFACTS, else a pytest
    temporary directory; printed so it can be found."""
    given = os.environ.get("KK_ARTEFACTS")
    d = Path(given) if given else tmp_path_factory.mktemp("artefacts")
    d.mkdir(parents=True, exist_ok=True)
    print(f"artefacts in {d}")
    return d
