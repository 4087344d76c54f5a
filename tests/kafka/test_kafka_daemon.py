"""The ``spec.kafka`` daemon never freezes (the defect: a second KRaftQuorum's status froze at
its first pass and its daemon never refreshed it), and the Kafka client's timeouts.

Without a cluster: the real daemon loop and pass (lifecycle.py, kafkaquorums.py) against a stand-in for the
Kubernetes API whose first call hangs, or raises a cancellation that leaked out of a library; the
real KafkaQuorum against loopback listeners that accept connections and never answer. The real
Kafka end-to-end check is tests/kafka/test_k8s_kafka.py (the late-Secret resource)."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Iterator
from typing import Any

import pytest
from kraftkeeper_operator.k8s.context import OperatorContext
from kraftkeeper_operator.k8s.crdstatus import stale_conditions
from kraftkeeper_operator.k8s.handlers import MEMO_KEY, recovery_daemon
from kraftkeeper_operator.k8s.kafkaquorums import KafkaMembership
from kraftkeeper_operator.k8s.kafkaspec import parse_kafka_spec
from kraftkeeper_operator.k8s.watchdog import CallTimedOut, within
from kraftkeeper_operator.kafka.backend import KafkaQuorum
from kraftkeeper_operator.kafka.clientconf import (
    DEFAULT_API_TIMEOUT_MS,
    DEFAULT_REQUEST_TIMEOUT_MS,
    ClientConfigError,
    ClientSettings,
)

from quorum.types import ErrorCode, KraftError
from tests.operator.helpers import Notices, Stopped

WITHIN_S = 60.0  # generous bound for conditions the tests poll for (never a timing assertion)


class Kube(Notices):
    """The API calls a pass of a resource whose Secret is missing makes (the Secret read, the
    status write, the Warning Event, which ``seen`` records). ``first`` says
    what the first Secret read does: "hang" (an API request with no timeout that never ends) or
    "cancelled" (a CancelledError leaking out of the HTTP client)."""

    def __init__(self, first: str) -> None:
        super().__init__()
        self.first = first
        self.reads = 0
        self.patches: list[dict[str, Any]] = []
        self.patched = asyncio.Event()

    async def secret_data(self, ns: str, name: str) -> dict[str, str] | None:
        self.reads += 1
        if self.reads == 1 and self.first == "hang":
            await asyncio.Event().wait()
        if self.reads == 1 and self.first == "cancelled":
            raise asyncio.CancelledError()
        return None

    async def patch_status(self, ns: str, name: str, status: dict[str, Any]) -> None:
        self.patches.append(status)
        self.patched.set()


def body() -> dict[str, Any]:
    return {
        "metadata": {"name": "late", "namespace": "ns", "uid": "u1", "generation": 1},
        "spec": {
            "kafka": {"bootstrapControllers": ["127.0.0.1:25999"], "clientSecretRef": {"name": "absent"}}
        },
    }


async def run_daemon(kube: Kube) -> tuple[asyncio.Task[None], Stopped]:
    ctx = OperatorContext(kube=kube, interval=0.05)  # type: ignore[arg-type]
    stopped = Stopped()
    task = asyncio.ensure_future(
        recovery_daemon(  # type: ignore[call-arg]
            body=body(), memo={MEMO_KEY: ctx}, stopped=stopped, logger=logging.getLogger("test")
        )
    )
    return task, stopped


@pytest.mark.parametrize("first", ["hang", "cancelled"])
def test_the_daemon_survives_a_pass_that_hangs_or_is_cancelled_from_inside(
    first: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first pass hangs for good in an API call (no timeout of its own), or a cancellation
    leaks out of it (which would end a kopf daemon for good: kopf never restarts a daemon that
    exited by itself). Either way the next pass runs and reports the missing Secret."""
    monkeypatch.setattr(KafkaMembership, "pass_budget", lambda self: 0.5)

    async def main() -> None:
        kube = Kube(first)
        task, stopped = await run_daemon(kube)
        waiter = asyncio.ensure_future(kube.patched.wait())
        await asyncio.wait({task, waiter}, timeout=WITHIN_S, return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), "the daemon ended: its status would never be refreshed again"
        assert waiter.done(), "no pass after the first one wrote the status"
        assert kube.reads >= 2
        assert kube.patches[-1]["phase"] == "Pending"
        assert kube.patches[-1]["conditions"][0]["reason"] == "ClientSecretMissing"
        assert kube.seen == [("Warning", "ClientSecretMissing")]
        stopped.event.set()
        await asyncio.wait_for(task, WITHIN_S)

    asyncio.run(main())


def test_an_api_call_that_never_answers_is_bounded() -> None:
    """The Kubernetes client has no timeout of its own: each call of the daemon gets one."""

    async def main() -> None:
        with pytest.raises(CallTimedOut, match="Secret ns/absent: no answer"):
            await within("Secret ns/absent", asyncio.Event().wait(), 0.1)
        async def answers() -> str:
            return "data"

        assert await within("Secret ns/absent", answers(), 10) == "data"

    asyncio.run(main())


def test_stale_status_says_so_in_degraded() -> None:
    """A pass that failed (or hung) leaves voters and phase as last written; Degraded says that
    they are stale and why, and keeps its transition time while it stays True."""
    last = {
        "phase": "Recovering",
        "conditions": [
            {"type": "Available", "status": "True", "reason": "LeaderElected", "lastTransitionTime": "t0"},
            {"type": "Degraded", "status": "False", "reason": "Healthy", "lastTransitionTime": "t0"},
        ],
    }
    conds = stale_conditions(last, "the last membership pass failed: ValueError: bad frame")
    assert conds[0] == last["conditions"][0]
    d = conds[1]
    assert (d["status"], d["reason"]) == ("True", "StatusNotRefreshed")
    assert "ValueError: bad frame" in d["message"] and d["lastTransitionTime"] != "t0"
    again = stale_conditions({"conditions": conds}, "other")
    assert again[1]["lastTransitionTime"] == d["lastTransitionTime"]


@pytest.fixture
def blackholes() -> Iterator[list[tuple[str, int]]]:
    """Three loopback listeners that accept connections (the kernel does) and never answer."""
    socks = []
    for _ in range(3):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(16)
        socks.append(s)
    try:
        yield [("127.0.0.1", s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


def test_controllers_that_never_answer_cost_one_operation_timeout(blackholes: list[tuple[str, int]]) -> None:
    """Each controller alone would take request.timeout.ms; together they would take three
    times that. default.api.timeout.ms bounds the whole describe: the outcome is
    REQUEST_TIMED_OUT naming that setting, and no connection is left open."""

    async def main() -> None:
        q = KafkaQuorum(blackholes, timeout=0.4, api_timeout=0.5)
        with pytest.raises(KraftError) as e:
            await q.describe()
        assert e.value.code is ErrorCode.REQUEST_TIMED_OUT, e.value
        assert "default.api.timeout.ms" in e.value.message
        assert q._conns == {}
        # The per-request bound alone (operation bound above all three): each controller is
        # tried and named.
        q = KafkaQuorum(blackholes, timeout=0.2, api_timeout=30)
        with pytest.raises(KraftError) as e:
            await q.describe()
        assert e.value.code is ErrorCode.UNAVAILABLE
        assert all(f"{h}:{p}" in e.value.message for h, p in blackholes)

    asyncio.run(main())


def test_kafka_client_timeouts_come_from_the_client_properties() -> None:
    s = ClientSettings.from_dict({})
    assert (s.request_timeout_ms, s.api_timeout_ms) == (DEFAULT_REQUEST_TIMEOUT_MS, DEFAULT_API_TIMEOUT_MS)
    q = KafkaQuorum("127.0.0.1:9093", s)
    assert (q.timeout, q.api_timeout) == (DEFAULT_REQUEST_TIMEOUT_MS / 1000, DEFAULT_API_TIMEOUT_MS / 1000)
    s = ClientSettings.from_dict({"request.timeout.ms": "20000", "default.api.timeout.ms": "90000"})
    q = KafkaQuorum("127.0.0.1:9093", s)
    assert (q.timeout, q.api_timeout) == (20.0, 90.0)
    # A longer request timeout alone raises the operation's bound with it.
    s = ClientSettings.from_dict({"request.timeout.ms": "45000"})
    assert s.api_timeout_ms == 45000
    for props, needle in [
        ({"request.timeout.ms": "soon"}, "request.timeout.ms"),
        ({"request.timeout.ms": "0"}, "request.timeout.ms"),
        ({"default.api.timeout.ms": "-5"}, "default.api.timeout.ms"),
        ({"request.timeout.ms": "20000", "default.api.timeout.ms": "10000"}, "below request.timeout.ms"),
    ]:
        with pytest.raises(ClientConfigError, match=needle):
            ClientSettings.from_dict(props)


def test_the_operator_client_uses_kafka_timeouts_not_the_pod_timeout() -> None:
    """The operator's KRAFTKEEPER_QUORUM_TIMEOUT (3 s) is for its own pods in the cluster; a
    spec.kafka client takes Kafka's settings from the client properties."""

    async def main() -> None:
        ctx = OperatorContext(kube=Kube("none"), interval=0.05, quorum_timeout=3.0)  # type: ignore[arg-type]
        d = KafkaMembership(ctx, body())
        settings = ClientSettings.from_dict({"default.api.timeout.ms": "40000"})
        await d._configure(parse_kafka_spec(body()), settings, "fingerprint")
        assert d.m is not None
        assert (d.m.api.timeout, d.m.api.api_timeout) == (DEFAULT_REQUEST_TIMEOUT_MS / 1000, 40.0)
        await d.close()

    asyncio.run(main())
