"""QuorumClient's retry rule against real HTTP servers on loopback: a 421 NOT_LEADER hint is
followed and remembered, a 421 or 503 UNAVAILABLE moves on to the next address, any other error
is final at once, and a request that never finds a leader ends with the last error seen."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager

import pytest
from aiohttp import web

from quorum.client import QuorumClient
from quorum.localports import free_ports
from quorum.types import ErrorCode, KraftError

Answer = Callable[[str], web.Response]  # the node's answer, given the node's own address




def _err(status: int, code: ErrorCode, **extra: str) -> web.Response:
    body = {"error_code": code.value, "message": code.value.lower(), **extra}
    return web.json_response(body, status=status)


@asynccontextmanager
async def _nodes(answers: list[Answer]) -> AsyncIterator[tuple[list[str], list[str]]]:
    """One HTTP server per answer; yields their addresses and the log of which one was asked."""
    calls: list[str] = []
    runners = []
    eps = [f"127.0.0.1:{p}" for p in free_ports(len(answers))]
    try:
        for ep, answer in zip(eps, answers, strict=True):

            async def handler(request: web.Request, ep: str = ep, answer: Answer = answer) -> web.Response:
                calls.append(ep)
                return answer(ep)

            app = web.Application()
            app.router.add_route("*", "/v1/kv/{key}", handler)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            runners.append(runner)
            await web.TCPSite(runner, "127.0.0.1", int(ep.rpartition(":")[2]), reuse_address=True).start()
        yield eps, calls
    finally:
        for r in runners:
            await r.cleanup()


async def test_not_leader_hint_is_followed_and_remembered() -> None:
    leader: list[str] = []

    def follower(ep: str) -> web.Response:
        return _err(421, ErrorCode.NOT_LEADER, leader_endpoint=leader[0])

    async with _nodes([follower, lambda ep: web.json_response({"offset": 5}), follower]) as (eps, calls):
        leader.append(eps[1])
        async with QuorumClient([eps[0], eps[2], eps[1]], timeout=10) as c:
            assert await c.put("k", b"v") == 5
            assert calls == [eps[0], eps[1]]  # the hint, not the next bootstrap address
            assert await c.put("k", b"v") == 5
            assert calls == [eps[0], eps[1], eps[1]]  # straight to the remembered leader


async def test_unavailable_and_hintless_not_leader_move_on_to_the_next_address() -> None:
    answers: list[Answer] = [
        lambda ep: _err(503, ErrorCode.UNAVAILABLE),
        lambda ep: _err(421, ErrorCode.NOT_LEADER),
        lambda ep: web.json_response({"offset": 9}),
    ]
    async with _nodes(answers) as (eps, calls), QuorumClient(eps, timeout=10) as c:
        assert await c.put("k", b"v") == 9
        assert calls == eps


async def _failed_put(answer: Answer, client_timeout: float) -> tuple[KraftError, list[str], list[str]]:
    """A PUT to two nodes that both give ``answer``: the error raised, the addresses, the calls."""
    async with _nodes([answer, answer]) as (eps, calls), QuorumClient(eps, timeout=client_timeout) as c:
        with pytest.raises(KraftError) as e:
            await c.put("k", b"v")
        return e.value, eps, calls


async def test_other_errors_are_final_without_trying_other_addresses() -> None:
    err, eps, calls = await _failed_put(lambda ep: _err(409, ErrorCode.VOTER_CHANGE_IN_PROGRESS), 10)
    assert err.code is ErrorCode.VOTER_CHANGE_IN_PROGRESS
    assert calls == eps[:1]


async def test_no_leader_anywhere_ends_with_the_last_not_leader_error() -> None:
    err, eps, calls = await _failed_put(lambda ep: _err(421, ErrorCode.NOT_LEADER), 0.5)
    assert err.code is ErrorCode.NOT_LEADER
    assert set(calls) == set(eps) and len(calls) > len(eps)  # whole passes, repeated
