"""What a process pays to start: pydantic (a few hundred milliseconds to import) is for the
documents the operator and a client with a config file read, never for a node's start nor for a
client command without a config file. Each check runs a fresh interpreter, so the modules it sees
are the ones that start path imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

# A node pod's start: the command line, then what ``kraftkeeper start`` imports (the Kafka
# listener too, which ``--kafka-listen`` adds), and the init container's ``format`` and
# ``recover-unclean``.
NODE_START = """
import quorum.cli
import quorum.runtime.run
import quorum.kafka.listener
import quorum.storage.meta
import quorum.runtime.unclean
"""

# A client command with and without a config file, up to the client it makes (quorum.cli._client).
CLIENT = """
import sys
import quorum.cli
from quorum.client import QuorumClient
from quorum.security.clientconfig import resolve
cfg = resolve(sys.argv[1] or None)
"""

REPORT = """
import json, sys
print(json.dumps(sorted(m for m in sys.modules if m.split(".")[0] == "pydantic")))
"""


def _pydantic_modules(code: str, *args: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", code + REPORT, *args], capture_output=True, text=True, timeout=120, check=True
    )
    found: list[str] = json.loads(out.stdout.splitlines()[-1])
    return found


# Fresh interpreters (a module imported once stays imported): not for the in-process fast lane.
@pytest.mark.slow
def test_pydantic_is_imported_only_to_read_a_client_config_file(tmp_path: Path) -> None:
    # One interpreter for both paths that must not import it (each start costs a second or two).
    assert _pydantic_modules(NODE_START + CLIENT, "") == []
    cfg = tmp_path / "client.json"
    cfg.write_text('{"token_file": "t"}')
    (tmp_path / "t").write_text("a" * 32)
    # The model is what reads the file: with one, pydantic is loaded (so the check above is real).
    assert "pydantic" in _pydantic_modules(CLIENT, str(cfg))
