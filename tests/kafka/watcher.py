"""Runs ``kraftkeeper operator watch`` as a real subprocess for the Kafka tests, and reads what it
reports: ``/status`` on its metrics port and the JSON-lines event log."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from kraftkeeper_operator.kafka.cluster import KafkaControllers, free_port
from kraftkeeper_operator.kafka.wire import KafkaWireError

from quorum.types import KraftError
from testkit.polling import wait_until

T = TypeVar("T")


# What counts as "not yet" while waiting on a Kafka controller or the watcher: a connection that
# fails, a body that does not parse, a Kafka error answer. An AssertionError (the watcher exited)
# ends the wait at once.
NOT_YET: tuple[type[BaseException], ...] = (OSError, ValueError, KraftError, KafkaWireError)


def context_of(k: KafkaControllers, w: Watcher | None = None, lines: int = 15) -> Callable[[], str]:
    """What a failed wait prints beside its last value: each controller's state and crashes
    (the supervisor's), the watcher's /status and log tail, and each controller's out.log tail."""

    def text() -> str:
        parts = [k.status_lines()]
        if w is not None:
            try:
                parts.append(f"watcher /status: {json.dumps(w.status())[:2000]}")
            except (OSError, ValueError) as e:
                parts.append(f"watcher /status unavailable: {e}")
            if w.log.exists():
                tail = w.log.read_text(errors="replace").splitlines()[-lines:]
                parts.append("watcher log tail:\n" + "\n".join(tail))
        for i in k.controllers:
            parts.append(f"controller {i} out.log tail:\n{k.log_tail(i, lines)}")
        return "\n".join(parts)

    return text


class Watcher:
    def __init__(
        self, bootstrap: str, events: Path, *extra: str, flag: str = "--kafka-bootstrap-controllers"
    ) -> None:
        self.bootstrap = bootstrap
        self.flag = flag
        self.events = events
        self.extra = list(extra)
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = events.parent / "watch.log"
        self.env = dict(os.environ)

    def start(self) -> Watcher:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "quorum.cli",
                    "operator",
                    "watch",
                    self.flag,
                    self.bootstrap,
                    "--events",
                    str(self.events),
                    "--metrics-port",
                    str(self.port),
                    *self.extra,
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env,
            )
        wait_until("the watcher's first pass", lambda: self.status().get("passes", 0) > 0, 60, errors=NOT_YET)
        return self

    def status(self) -> dict[str, Any]:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(
                f"watcher exited with {self.proc.returncode}:\n{self.log.read_text()[-3000:]}"
            )
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/status", timeout=5) as r:
            body: dict[str, Any] = json.loads(r.read())
            return body

    def metrics(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=5) as r:
            return str(r.read().decode())

    def passes_after(self, n: int) -> int:
        """Wait until ``n`` more passes have run; returns the pass count."""
        start = self.status()["passes"]
        return wait_until(
            f"{n} watcher passes",
            lambda: (p := self.status()["passes"]) >= start + n and p,
            60,
            errors=NOT_YET,
        )

    def stop(self, kill: bool = False) -> None:
        p = self.proc
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(timeout=10)

    def events_list(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for f in sorted(self.events.rglob("*.jsonl")):
            for line in f.read_text().splitlines():
                if line.strip():
                    out.append(json.loads(line))
        return out

    def types(self, recovery_id: str | None = None) -> list[str]:
        return [
            e["type"] for e in self.events_list() if recovery_id is None or e["recovery_id"] == recovery_id
        ]
