"""The one daemon of a KRaftQuorum (handlers.py, lifecycle.py) picks its membership backend by
``spec.kafka``, cannot end silently, and says a failed pass in status; the shared KubeApi's calls
(kube.py) cannot hang.

Without a cluster: the real daemon loop with its pass replaced by a stand-in that first raises a
CancelledError from inside (a cancellation leaking out of a library, which would end a kopf daemon
for good: kopf never restarts a daemon that returned), and the real KubeApi with its CoreV1 client
replaced by one whose requests never get an answer. The same code against a real kube-apiserver is
exercised in tests/k8s/test_operator*.py."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import kopf
import pytest
from kraftkeeper_operator.k8s import handlers, kube, lifecycle
from kraftkeeper_operator.k8s.context import OperatorContext
from kraftkeeper_operator.k8s.crdstatus import StatusWriter
from kraftkeeper_operator.k8s.kafkaquorums import KafkaMembership
from kraftkeeper_operator.k8s.kube import KubeApi
from kubernetes_asyncio import client as k8s

from tests.operator.helpers import Stopped

WITHIN_S = 60.0  # generous bound for conditions the tests poll for (never a timing assertion)


def _start(memo: dict[str, Any], stopped: Stopped) -> asyncio.Task[None]:
    body = {"metadata": {"namespace": "ns", "name": "q"}, "spec": {}}  # our engine's backend
    return asyncio.ensure_future(
        handlers.recovery_daemon(  # type: ignore[call-arg]
            body=body, memo=memo, stopped=stopped, logger=logging.getLogger("test")
        )
    )


def test_a_pass_cancelled_from_inside_is_a_failed_pass_and_the_daemon_keeps_running(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    passes: list[str] = []
    third = asyncio.Event()

    async def daemon_pass(ctx: OperatorContext, key: str) -> None:
        passes.append(key)
        if len(passes) == 1:
            raise asyncio.CancelledError()  # leaked out of a library, not kopf's stop
        if len(passes) >= 3:
            third.set()

    monkeypatch.setattr(lifecycle, "daemon_pass", daemon_pass)
    monkeypatch.setattr(lifecycle, "next_pass_in", lambda ctx, key: 0.01)

    async def main() -> None:
        ctx = OperatorContext(kube=None, interval=0.01)  # type: ignore[arg-type]
        stopped = Stopped()
        task = _start({handlers.MEMO_KEY: ctx}, stopped)
        waiter = asyncio.ensure_future(third.wait())
        await asyncio.wait({task, waiter}, timeout=WITHIN_S, return_when=asyncio.FIRST_COMPLETED)
        assert not task.done(), "the daemon ended: no pass of this resource would ever run again"
        assert waiter.done(), "no pass ran after the cancelled one"
        stopped.event.set()  # kopf's stop: the daemon returns by itself
        await asyncio.wait_for(task, WITHIN_S)
        assert task.exception() is None

    with caplog.at_level(logging.ERROR, logger="test"):
        asyncio.run(main())
    assert passes[:3] == ["ns/q"] * 3
    assert any("membership pass of ns/q failed" in r.getMessage() for r in caplog.records)


def test_kopf_cancelling_the_daemon_still_ends_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """kopf cancels a daemon that does not return after ``stopped``: that cancellation (of the
    daemon, not from inside its pass) ends it, and the running pass is cancelled with it."""
    started = asyncio.Event()
    pass_cancelled: list[bool] = []

    async def daemon_pass(ctx: OperatorContext, key: str) -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            pass_cancelled.append(True)
            raise

    monkeypatch.setattr(lifecycle, "daemon_pass", daemon_pass)

    async def main() -> None:
        ctx = OperatorContext(kube=None, interval=0.01)  # type: ignore[arg-type]
        stopped = Stopped()
        task = _start({handlers.MEMO_KEY: ctx}, stopped)
        await asyncio.wait_for(started.wait(), WITHIN_S)
        stopped.event.set()
        task.cancel()
        done, _ = await asyncio.wait({task}, timeout=WITHIN_S)
        assert task in done and task.cancelled()
        for _ in range(100):  # the pass's own task sees its cancellation within a few loop turns
            if pass_cancelled:
                break
            await asyncio.sleep(0)
        assert pass_cancelled == [True]

    asyncio.run(main())


class StatusKube:
    """The one API call a failed pass of our engine's backend makes: the stale-status patch."""

    def __init__(self) -> None:
        self.patches: list[dict[str, Any]] = []
        self.patched = asyncio.Event()

    async def patch_status(self, ns: str, name: str, status: dict[str, Any]) -> None:
        self.patches.append(status)
        self.patched.set()


def test_one_daemon_picks_the_backend_by_spec_kafka() -> None:
    ctx = OperatorContext(kube=None, interval=0.01)  # type: ignore[arg-type]
    meta = {"namespace": "ns", "name": "q"}
    kafka = {"metadata": meta, "spec": {"kafka": {"bootstrapControllers": ["127.0.0.1:9"]}}}
    assert isinstance(lifecycle.membership_of(ctx, kafka, "ns/q"), KafkaMembership)  # type: ignore[arg-type]
    engine = lifecycle.membership_of(ctx, {"metadata": meta, "spec": {}}, "ns/q")  # type: ignore[arg-type]
    assert isinstance(engine, lifecycle.EngineMembership)


def test_a_failed_pass_of_our_engine_says_so_in_status(monkeypatch: pytest.MonkeyPatch) -> None:
    """As for a ``spec.kafka`` quorum: voters and phase as last written must not pass for
    current, so Degraded says ``StatusNotRefreshed`` and why; the daemon keeps running."""

    async def daemon_pass(ctx: OperatorContext, key: str) -> None:
        raise ValueError("bad answer")

    monkeypatch.setattr(lifecycle, "daemon_pass", daemon_pass)
    last = {
        "phase": "Running",
        "conditions": [
            {"type": "Available", "status": "True", "reason": "LeaderElected", "message": ""},
            {"type": "Degraded", "status": "False", "reason": "Healthy", "message": ""},
        ],
    }

    async def main() -> list[dict[str, Any]]:
        api = StatusKube()
        ctx = OperatorContext(kube=api, interval=0.01)  # type: ignore[arg-type]
        ctx.managed["ns/q"] = SimpleNamespace(status=StatusWriter(api, "ns", "q", last))  # type: ignore[assignment]
        stopped = Stopped()
        task = _start({handlers.MEMO_KEY: ctx}, stopped)
        await asyncio.wait_for(api.patched.wait(), WITHIN_S)
        assert not task.done()
        stopped.event.set()
        await asyncio.wait_for(task, WITHIN_S)
        return api.patches

    patches = asyncio.run(main())
    assert len(patches) == 1, patches  # said once, not on every failed pass
    degraded = next(c for c in patches[0]["conditions"] if c["type"] == "Degraded")
    assert patches[0]["phase"] == "Degraded" and degraded["reason"] == "StatusNotRefreshed"
    assert "ValueError: bad answer" in degraded["message"]


class SilentCore:
    """CoreV1Api whose requests are sent and never answered (a stuck API server connection)."""

    def __init__(self) -> None:
        self.calls = 0

    async def _never(self, *args: Any, **kwargs: Any) -> Any:
        self.calls += 1
        await asyncio.Event().wait()

    read_namespaced_config_map = _never
    create_namespaced_secret = _never


@pytest.mark.parametrize("call", ["configmap_data", "create_secret"])
def test_an_api_call_that_never_answers_is_bounded(call: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kube, "API_CALL_TIMEOUT_S", 0.2)

    async def main() -> None:
        api = KubeApi(k8s.ApiClient())
        core = SilentCore()
        api.core = core  # type: ignore[assignment]
        try:
            if call == "configmap_data":
                pending = api.configmap_data("ns", "q-bootstrap")
            else:
                secret = {"metadata": {"name": "q-ca", "namespace": "ns"}}
                pending = api.create_secret(secret)
            with pytest.raises(kopf.TemporaryError, match="no answer from the API server") as err:
                await asyncio.wait_for(pending, WITHIN_S)  # past WITHIN_S: unbounded, a TimeoutError
            assert "ns/q-" in str(err.value)
            assert core.calls == 1
        finally:
            await api.close()

    asyncio.run(main())
