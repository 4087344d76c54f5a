"""What the HTTP server needs from a node: the :class:`NodeApi` protocol.

``server.py`` depends on this protocol only, never on the ``Node`` class, so the two modules do
not import each other; ``run.py`` builds a node and hands it to ``server.build_app``. Every
method raises ``quorum.types.KraftError`` for a refusal (the server turns it into the JSON error
body and status of docs/design.md).
"""

from __future__ import annotations

from typing import Any, Protocol

from quorum.runtime.wire import Frame

__all__ = ["NodeApi"]


class NodeApi(Protocol):
    """The client, admin, RPC and observability entry points of one replica."""

    @property
    def node_id(self) -> int: ...

    # -- client API (docs/reference.md): writes return the committed offset ---------------------
    async def put(self, key: str, value: bytes) -> int: ...
    async def get(self, key: str) -> bytes | None: ...
    async def delete(self, key: str) -> int: ...

    # -- admin API (KIP-856 / KIP-642; leader only, NOT_LEADER with the hint elsewhere) -------
    def describe(self) -> dict[str, Any]: ...
    async def add_voter(self, vid: int, uuid: str) -> dict[str, Any]: ...
    async def remove_voter(self, vid: int, uuid: str) -> dict[str, Any]: ...
    async def reassign(self, ids: list[int] | None) -> dict[str, Any]: ...

    # -- node-to-node RPCs (transport.RpcHandler) -------------------------------------------
    async def handle_rpc(
        self, path: str, body: bytes, peer: object | None = None, decoded: object | None = None
    ) -> bytes | Frame:
        """``peer``: the caller's principal when the server authenticated it (TLS), else None;
        ``decoded``: the request the authorization middleware already decoded from ``body``."""
        ...

    # -- observability ----------------------------------------------------------------------
    def health(self) -> tuple[bool, dict[str, Any]]: ...
    def readiness(self) -> tuple[bool, dict[str, Any]]: ...
    def log_state(self) -> dict[str, Any]: ...
    def metrics_text(self) -> str: ...
