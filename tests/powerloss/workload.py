"""A concurrent client workload that records its history (``tests.powerloss.history``).

``WRITERS`` tasks each own ``KEYS_PER_WRITER`` register keys and put ``<key>#<n>`` values into
them (n increasing), and sometimes put a fresh key of their own (``u<writer>-<n>``: never
written again, so it must read back at the end). ``READERS`` tasks, and the writers now and
then, get random register keys. One client (one connection pool, the read-write token) over
TLS; each operation has ``OP_TIMEOUT`` seconds, after which a put is indeterminate.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Awaitable, Callable

from quorum.client import QuorumClient
from tests.powerloss.history import Op

WRITERS = 4
READERS = 2
KEYS_PER_WRITER = 2
OP_TIMEOUT = 5.0


class Workload:
    """Runs in a thread of its own (its own event loop) between ``__enter__`` and ``__exit__``."""

    def __init__(self, client: Callable[[], QuorumClient], seed: int) -> None:
        self._client = client
        self._rng = random.Random(seed)
        self.ops: list[Op] = []
        self.acks = 0  # acknowledged puts
        self.failures = 0  # puts that failed or timed out (indeterminate)
        self.registers = [f"r{w}{chr(97 + k)}" for w in range(WRITERS) for k in range(KEYS_PER_WRITER)]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)
        self.error: BaseException | None = None

    def __enter__(self) -> Workload:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        if self.error is not None:
            raise AssertionError(f"the workload failed: {self.error!r}") from self.error

    async def _main(self) -> None:
        try:
            async with self._client() as c:
                tasks = [self._writer(c, w, random.Random(self._rng.random())) for w in range(WRITERS)]
                tasks += [self._reader(c, random.Random(self._rng.random())) for _ in range(READERS)]
                await asyncio.gather(*tasks)
        except BaseException as e:
            self.error = e

    async def _timed(self, call: Callable[[], Awaitable[object]]) -> tuple[object, float, float | None]:
        start = time.monotonic()
        try:
            result = await asyncio.wait_for(call(), OP_TIMEOUT + 2)
        except Exception:
            return None, start, None
        return result, start, time.monotonic()

    async def put(self, c: QuorumClient, key: str, value: str) -> bool:
        offset, start, end = await self._timed(lambda: c.put(key, value.encode()))
        self.ops.append(Op("put", key, value, start, end, offset if isinstance(offset, int) else None))
        if end is None:
            self.failures += 1
            await asyncio.sleep(0.05)  # the quorum is busy electing or restarting: do not spin
            return False
        self.acks += 1
        return True

    async def get(self, c: QuorumClient, key: str) -> None:
        got, start, end = await self._timed(lambda: c.get(key))
        if end is None:
            await asyncio.sleep(0.05)
            return
        value = got.decode() if isinstance(got, bytes) else None
        self.ops.append(Op("get", key, value, start, end))

    async def _writer(self, c: QuorumClient, w: int, rng: random.Random) -> None:
        seq = 0
        mine = self.registers[w * KEYS_PER_WRITER : (w + 1) * KEYS_PER_WRITER]
        while not self._stop.is_set():
            seq += 1  # one sequence per writer: values stay unique across its keys
            roll = rng.random()
            if roll < 0.6:
                key = rng.choice(mine)
                await self.put(c, key, f"{key}#{seq}")
            elif roll < 0.8:
                await self.put(c, f"u{w}-{seq}", f"u{w}-{seq}#{seq}")
            else:
                await self.get(c, rng.choice(self.registers))

    async def _reader(self, c: QuorumClient, rng: random.Random) -> None:
        while not self._stop.is_set():
            await self.get(c, rng.choice(self.registers))

    def acknowledged_fresh_keys(self) -> dict[str, str]:
        """The ``u`` keys whose put was acknowledged, with their values."""
        return {o.key: str(o.value) for o in self.ops if o.kind == "put" and o.key[0] == "u" and o.complete}
