"""``QuorumClient``: the HTTP client of a KRaftKeeper quorum.

Used by the CLI, the operator and the benchmarks. It talks to any node listed in
``bootstrap`` and follows ``NOT_LEADER`` hints (HTTP 421 with ``leader_endpoint``) to the
leader, so callers never need to know who leads. Errors surface as
:class:`~quorum.types.KraftError` with the server's error code.

Retry rule: a 421 means the request was *not applied* (interfaces.md), so it is always safe to
retry elsewhere; a 503 ``REQUEST_TIMED_OUT`` / ``LEADERSHIP_LOST`` write may or may not have
taken effect and is returned to the caller, never retried silently. With ``refused_grace``
(the CLI sets 1 s) a bootstrap list whose every address refuses connections for that long is
``UNAVAILABLE`` at once instead of after ``timeout``: nothing listens there. 401 / 403 and TLS
certificate failures are final too (retrying cannot fix a credential).

Per-address connect share: one address that never completes a TCP handshake (a pod being
rescheduled: its old IP drops the SYN) may hold a connect for at most ``timeout / addresses``
(never less than :data:`MIN_CONNECT_S`), then the next address is tried; an address whose connect
timed out is tried after the others until it answers again. So a status describe still answers
from a live node within the caller's timeout while one pod restarts (issue 11). Only the connect
is shared: a request a node has accepted (a voter change waiting for its commit) keeps the whole
remaining time.

TLS and credentials (issue 8): with a :class:`~quorum.security.clientconfig.ClientConfig` the
client speaks https (verifying nodes against the config's ``ca_file``) and sends its bearer
token or presents its client certificate on every request.
"""

from __future__ import annotations

import asyncio
import errno
import json
import time
from collections.abc import Sequence
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
        deadline = time.monotonic() + self.timeout
        last: KraftError | None = None
        unreachable: dict[str, str] = {}  # address -> its last transport error
        answered = False  # some node answered (an HTTP status): not a connectivity failure
        tried_hint = 0
        refused_since: float | None = None
        data = json.dumps(json_body).encode() if json_body is not None else body
        while True:
            candidates = self._candidates()
            connect_share = max(MIN_CONNECT_S, self.timeout / len(candidates))
            refused = 0
            for ep in candidates:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    status, raw = await self._attempt(
                        method, ep, path, data, json_body is not None, remaining, connect_share
                    )
                    self._slow.discard(ep)
                except (TimeoutError, aiohttp.ClientError, OSError) as e:
                    if _refused(e):
                        refused += 1
                    if isinstance(e, aiohttp.ConnectionTimeoutError):
                        self._slow.add(ep)
                    unreachable[ep] = str(e) or type(e).__name__
                    last = KraftError(ErrorCode.UNAVAILABLE, f"cannot reach {ep}: {unreachable[ep]}")
                    if ep == self._leader:
                        self._leader = None
                    continue
                unreachable.pop(ep, None)
                answered = True
                if status in ok or (allow_404 and status == 404):
                    if leader_only:
                        self._leader = ep
                    return status, raw
                err = _error_from(status, raw)
                if err.code is ErrorCode.NOT_LEADER:
                    hint = err.extra.get("leader_endpoint")
                    last = err
                    if isinstance(hint, str) and hint and hint != ep and tried_hint < 8:
                        tried_hint += 1
                        self._leader = hint
                        break  # restart the loop with the hinted leader first
                    if ep == self._leader:
                        self._leader = None
                    continue
                if err.code is ErrorCode.UNAVAILABLE:
                    last = err
                    continue
                raise err
            else:
                # every candidate failed without a fresh hint: wait for an election, unless
                # nothing listens on any address (connection refused everywhere for a while)
                now = time.monotonic()
                if refused and refused == len(candidates) and self.refused_grace is not None:
                    refused_since = now if refused_since is None else refused_since
                    if now - refused_since >= self.refused_grace:
                        raise KraftError(
                            ErrorCode.UNAVAILABLE,
                            f"connection refused by every address of {', '.join(self.bootstrap)}",
                        )
                else:
                    refused_since = None
                if now >= deadline:
                    break
                await asyncio.sleep(min(0.1, max(0.0, deadline - now)))
                continue
            if time.monotonic() >= deadline:
                break
        raise self._no_answer(unreachable, answered, last)

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
        self,
        method: str,
        ep: str,
        path: str,
        data: bytes | None,
        is_json: bool,
        remaining: float,
        connect: float | None = None,
    ) -> tuple[int, bytes]:
        """One request to one node. A TLS failure is final (KraftError UNAVAILABLE): retrying
        cannot fix a certificate or https to a plaintext node; other transport errors propagate
        for the caller's retry loop."""
        headers = {"Content-Type": "application/json"} if is_json else {}
        try:
            async with self._sess().request(
                method,
                self.url(ep, path),
                data=data,
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
