"""``QuorumClient``: the HTTP client of a KRaftKeeper quorum.

Used by the CLI, the operator and the benchmarks. It talks to any node listed in
``bootstrap`` and follows ``NOT_LEADER`` hints (HTTP 421 with ``leader_endpoint``) to the
leader, so callers never need to know who leads. Errors surface as
:class:`~quorum.types.KraftError` with the server's error code.

Retry rule: a 421 means the request was *not applied* (docs/reference.md), so it is always safe to
retry elsewhere; a 503 ``REQUEST_TIMED_OUT`` / ``LEADERSHIP_LOST`` write may or may not have
taken effect and is returned to the caller, never retried silently. With ``refused_grace``
(the CLI sets 1 s) a bootstrap list whose every address refuses connections for that long is
``UNAVAILABLE`` at once instead of after ``timeout``: nothing listens there. 401 / 403 and TLS
certificate failures are final too (retrying cannot fix a credential).

Per-address connect share: one address that never completes a TCP handshake (a pod being
rescheduled: its old IP drops the SYN) may hold a connect for at most ``timeout / addresses``
(never less than :data:`MIN_CONNECT_S`), then the next address is tried; an address whose connect
timed out is tried after the others until it answers again. So a status describe still answers
from a live node within the caller's timeout while one pod restarts. Only the connect
is shared: a request a node has accepted (a voter change waiting for its commit) keeps the whole
remaining time.

TLS and credentials: with a :class:`~quorum.security.clientconfig.ClientConfig` the
client speaks https (verifying nodes against the config's ``ca_file``) and sends its bearer
token or presents its client certificate on every request.
"""

from __future__ import annotations

import asyncio
import errno
import json
import ssl
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import quote

import aiohttp

from quorum.security.clientconfig import ClientConfig
from quorum.types import ErrorCode, KraftError

# The least connect time an address gets: a loopback or pod-network handshake takes well under a
# millisecond; this leaves room for a loaded machine.
MIN_CONNECT_S = 0.25


def parse_bootstrap(bootstrap: Sequence[str] | str) -> list[str]:
    """``"h:1,h:2"`` or a list of ``HOST:PORT`` into a clean list; raises INVALID_REQUEST."""
    items = bootstrap.split(",") if isinstance(bootstrap, str) else list(bootstrap)
    out = []
    for raw in items:
        ep = raw.strip()
        if not ep:
            continue
        host, sep, port = ep.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise KraftError(ErrorCode.INVALID_REQUEST, f"bad endpoint {ep!r}: expected HOST:PORT")
        out.append(ep)
    if not out:
        raise KraftError(ErrorCode.INVALID_REQUEST, "no bootstrap endpoint given")
    return out


def _error_from(status: int, body: bytes) -> KraftError:
    try:
        obj = json.loads(body)
    except ValueError:
        obj = None
    if isinstance(obj, dict) and isinstance(obj.get("error_code"), str):
        try:
            code = ErrorCode(obj["error_code"])
        except ValueError:
            code = ErrorCode.UNKNOWN_SERVER_ERROR
        msg = str(obj.get("message") or obj["error_code"])
        extra = {k: v for k, v in obj.items() if k not in ("error_code", "message")}
        return KraftError(code, msg, **extra)
    text = body[:200].decode("utf-8", "replace")
    return KraftError(ErrorCode.UNKNOWN_SERVER_ERROR, f"HTTP {status}: {text}")


@dataclass(frozen=True)
class _Call:
    """One request as the caller asked for it, the same on every address tried."""

    method: str
    path: str
    data: bytes | None
    is_json: bool
    ok: tuple[int, ...]
    allow_404: bool
    leader_only: bool


@dataclass
class _Tries:
    """What one request has learnt so far, across its passes over the addresses."""

    deadline: float
    last: KraftError | None = None
    unreachable: dict[str, str] = field(default_factory=dict)  # address -> its last transport error
    answered: bool = False  # some node answered (an HTTP status): not a connectivity failure
    hints: int = 0  # NOT_LEADER hints followed
    refused_since: float | None = None  # since when every address refuses connections
    candidates: int = 0  # addresses in the current pass
    refused: int = 0  # of them, how many refused the connection
    cut_short: bool = False  # the current pass ended early (a hint, or the deadline)


class QuorumClient:
    """Async client; one keep-alive connection pool shared by all calls."""

    def __init__(
        self,
        bootstrap: Sequence[str] | str,
        *,
        timeout: float = 10.0,
        client_config: ClientConfig | None = None,
        refused_grace: float | None = None,
    ) -> None:
        self.bootstrap = parse_bootstrap(bootstrap)
        self.timeout = timeout
        self.refused_grace = refused_grace
        self.config = client_config
        self.scheme = client_config.scheme if client_config is not None else "http"
        self._ssl = client_config.ssl_context() if client_config is not None else None
        self._headers = client_config.headers() if client_config is not None else {}
        self._leader: str | None = None
        self._slow: set[str] = set()  # addresses whose last connect timed out: tried last
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> QuorumClient:
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=min(self.timeout, 3.0)),
                connector=aiohttp.TCPConnector(limit=64, ssl=self._ssl if self._ssl is not None else True),
                headers=self._headers,
            )
        return self._session

    def url(self, endpoint: str, path: str) -> str:
        return f"{self.scheme}://{endpoint}{path}"

    async def request(
        self,
        method: str,
        path: str,
        *,
        body: bytes | None = None,
        json_body: Any = None,
        leader_only: bool = True,
        ok: tuple[int, ...] = (200, 202),
        allow_404: bool = False,
    ) -> tuple[int, bytes]:
        """Send to the leader (or any node when ``leader_only`` is False), following
        NOT_LEADER hints and trying every bootstrap node until ``timeout`` runs out."""
        data = json.dumps(json_body).encode() if json_body is not None else body
        call = _Call(method, path, data, json_body is not None, ok, allow_404, leader_only)
        tries = _Tries(time.monotonic() + self.timeout)
        while True:
            got = await self._pass(call, tries)
            if got is not None:
                return got
            if tries.cut_short:  # a hint to follow at once, or the deadline
                if time.monotonic() >= tries.deadline:
                    break
            elif not await self._between_passes(tries):
                break
        raise self._no_answer(tries.unreachable, tries.answered, tries.last)

    async def _pass(self, call: _Call, tries: _Tries) -> tuple[int, bytes] | None:
        """One pass over the candidates: the accepted answer, or None (``tries.cut_short`` when a
        fresh NOT_LEADER hint or the deadline ended the pass early)."""
        candidates = self._candidates()
        connect_share = max(MIN_CONNECT_S, self.timeout / len(candidates))
        tries.candidates, tries.refused, tries.cut_short = len(candidates), 0, False
        for ep in candidates:
            remaining = tries.deadline - time.monotonic()
            if remaining <= 0:
                tries.cut_short = True
                return None
            try:
                status, raw = await self._attempt(call, ep, remaining, connect_share)
                self._slow.discard(ep)
            except (TimeoutError, aiohttp.ClientError, OSError) as e:
                self._unreachable(tries, ep, e)
                continue
            tries.unreachable.pop(ep, None)
            tries.answered = True
            if status in call.ok or (call.allow_404 and status == 404):
                if call.leader_only:
                    self._leader = ep
                return status, raw
            if self._follow(tries, ep, _error_from(status, raw)):
                tries.cut_short = True
                return None
        return None

    def _unreachable(self, tries: _Tries, ep: str, e: BaseException) -> None:
        """Note a transport error of ``ep`` (refused, or a connect that timed out: tried last)."""
        if _refused(e):
            tries.refused += 1
        if isinstance(e, aiohttp.ConnectionTimeoutError):
            self._slow.add(ep)
        tries.unreachable[ep] = str(e) or type(e).__name__
        tries.last = KraftError(ErrorCode.UNAVAILABLE, f"cannot reach {ep}: {tries.unreachable[ep]}")
        if ep == self._leader:
            self._leader = None

    def _follow(self, tries: _Tries, ep: str, err: KraftError) -> bool:
        """An error answer from ``ep``: True to start a new pass at a fresh NOT_LEADER hint, False
        to go on with the next address; any other error than NOT_LEADER / UNAVAILABLE is final
        and raised (a 421 was not applied, so moving on is safe: module docstring)."""
        if err.code is ErrorCode.NOT_LEADER:
            hint = err.extra.get("leader_endpoint")
            tries.last = err
            if isinstance(hint, str) and hint and hint != ep and tries.hints < 8:
                tries.hints += 1
                self._leader = hint
                return True
            if ep == self._leader:
                self._leader = None
            return False
        if err.code is ErrorCode.UNAVAILABLE:
            tries.last = err
            return False
        raise err

    async def _between_passes(self, tries: _Tries) -> bool:
        """Every candidate failed without a fresh hint: wait a little for an election (False when
        the deadline has come), unless nothing listens on any address (connection refused
        everywhere for ``refused_grace``): UNAVAILABLE at once."""
        now = time.monotonic()
        if tries.refused and tries.refused == tries.candidates and self.refused_grace is not None:
            tries.refused_since = now if tries.refused_since is None else tries.refused_since
            if now - tries.refused_since >= self.refused_grace:
                raise KraftError(
                    ErrorCode.UNAVAILABLE,
                    f"connection refused by every address of {', '.join(self.bootstrap)}",
                )
        else:
            tries.refused_since = None
        if now >= tries.deadline:
            return False
        await asyncio.sleep(min(0.1, max(0.0, tries.deadline - now)))
        return True

    def _no_answer(self, unreachable: dict[str, str], answered: bool, last: KraftError | None) -> KraftError:
        """The error of a request that ran out of time."""
        if unreachable and not answered:
            # No node answered: name every address with its error (or that the deadline came
            # first), in bootstrap order, and keep the errors apart in ``extra["errors"]``: the
            # operator's status says only which addresses (how each failed, and which one the
            # deadline fell on, change from pass to pass, and a status that changes is a write).
            errors = {ep: unreachable.get(ep, "not tried before the deadline") for ep in self.bootstrap}
            each = "; ".join(f"{ep}: {why}" for ep, why in errors.items())
            return KraftError(ErrorCode.UNAVAILABLE, f"cannot reach any address ({each})", errors=errors)
        return last or KraftError(ErrorCode.REQUEST_TIMED_OUT, f"no answer from {', '.join(self.bootstrap)}")

    def _candidates(self) -> list[str]:
        """The known leader first, then the bootstrap addresses, those whose last connect timed
        out last (module docstring)."""
        rest = [b for b in self.bootstrap if b != self._leader]
        rest.sort(key=lambda b: b in self._slow)  # stable: bootstrap order otherwise
        return ([self._leader] if self._leader else []) + rest

    async def _attempt(
        self, call: _Call, ep: str, remaining: float, connect: float | None = None
    ) -> tuple[int, bytes]:
        """One request to one node. A TLS failure is final (KraftError UNAVAILABLE): retrying
        cannot fix a certificate or https to a plaintext node; other transport errors propagate
        for the caller's retry loop."""
        headers = {"Content-Type": "application/json"} if call.is_json else {}
        try:
            async with self._sess().request(
                call.method,
                self.url(ep, call.path),
                data=call.data,
                headers=headers,
                # sock_connect: the TCP handshake only; a TLS handshake on a loaded machine may
                # take longer than a share and must not make a live node look unreachable.
                timeout=aiohttp.ClientTimeout(
                    total=remaining, sock_connect=min(remaining, connect or remaining)
                ),
            ) as resp:
                return resp.status, await resp.read()
        except aiohttp.ClientConnectorCertificateError as e:
            raise KraftError(
                ErrorCode.UNAVAILABLE, f"TLS certificate of {ep} not accepted: {e.certificate_error}"
            ) from None
        except aiohttp.ClientSSLError as e:
            raise KraftError(ErrorCode.UNAVAILABLE, f"TLS handshake with {ep} failed: {e.os_error}") from None
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as e:
            # A TLS node drops a plaintext request unanswered ("Server disconnected"), which says
            # nothing to a user who just forgot the credentials: ask the node for a TLS handshake,
            # and if it speaks TLS say so (final: retrying in plaintext cannot succeed).
            if self.scheme == "http" and await speaks_tls(ep, min(remaining, 2.0)):
                raise KraftError(
                    ErrorCode.UNAVAILABLE,
                    f"{ep} speaks TLS (https) and this client has no TLS client config: pass "
                    "--client-config FILE or set KRAFTKEEPER_CLIENT_CONFIG (a file written by "
                    "`kraftkeeper tls issue-client`, or DIR/client.json of `operator local`)",
                ) from None
            raise e

    # ---- admin ---------------------------------------------------------------------------
    async def describe(self) -> dict[str, Any]:
        _, raw = await self.request("GET", "/v1/quorum/describe")
        obj: dict[str, Any] = json.loads(raw)
        return obj

    async def add_voter(self, id: int, uuid: str) -> dict[str, Any]:
        _, raw = await self.request("POST", "/v1/quorum/voters", json_body={"id": id, "uuid": uuid})
        obj: dict[str, Any] = json.loads(raw)
        return obj

    async def remove_voter(self, id: int, uuid: str) -> dict[str, Any]:
        _, raw = await self.request("DELETE", f"/v1/quorum/voters/{id}/{quote(uuid, safe='')}")
        obj: dict[str, Any] = json.loads(raw)
        return obj

    async def reassign(self, voters: list[int] | None) -> dict[str, Any]:
        body: dict[str, Any] = {"cancel": True} if voters is None else {"voters": voters}
        _, raw = await self.request("POST", "/v1/quorum/reassign", json_body=body)
        obj: dict[str, Any] = json.loads(raw)
        return obj

    # ---- key-value ------------------------------------------------------------------------
    async def put(self, key: str, value: bytes) -> int:
        _, raw = await self.request("PUT", f"/v1/kv/{quote(key, safe='')}", body=value)
        return int(json.loads(raw)["offset"])

    async def get(self, key: str) -> bytes | None:
        status, raw = await self.request("GET", f"/v1/kv/{quote(key, safe='')}", allow_404=True)
        return None if status == 404 else raw

    async def delete(self, key: str) -> None:
        await self.request("DELETE", f"/v1/kv/{quote(key, safe='')}")

    # ---- any node -------------------------------------------------------------------------
    async def node_get(self, endpoint: str, path: str) -> tuple[int, bytes]:
        """GET ``path`` from one specific node (``/metrics``, ``/readyz``, ...)."""
        async with self._sess().get(
            self.url(endpoint, path), timeout=aiohttp.ClientTimeout(total=self.timeout)
        ) as resp:
            return resp.status, await resp.read()


async def speaks_tls(ep: str, within: float) -> bool:
    """Whether ``ep`` (HOST:PORT) answers a TLS handshake. Nothing is verified and nothing is sent
    after the handshake: a TLS alert from the peer (a node requiring a client certificate) counts
    as TLS, a plaintext answer to the ClientHello (an HTTP 400, "wrong version number") does not."""
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    host, _, port = ep.rpartition(":")
    host = host.strip("[]")
    try:
        async with asyncio.timeout(within):
            _, writer = await asyncio.open_connection(host, int(port), ssl=ctx)
    except ssl.SSLError as e:
        return "ALERT" in str(e).upper()
    except (OSError, TimeoutError, ValueError):
        return False
    writer.close()
    try:
        await writer.wait_closed()
    except (OSError, ssl.SSLError):
        pass
    return True


def _refused(e: BaseException) -> bool:
    """True when nothing listens at the address (ECONNREFUSED), as opposed to a timeout."""
    err: BaseException = e.os_error if isinstance(e, aiohttp.ClientConnectorError) else e
    if isinstance(err, ConnectionRefusedError) or getattr(err, "errno", None) == errno.ECONNREFUSED:
        return True
    # several addresses for one name (localhost: ::1 and 127.0.0.1): refused only if all were
    text = str(err)
    return text.startswith("Multiple exceptions") and text.count("[Errno") == text.count(
        f"[Errno {errno.ECONNREFUSED}]"
    )
