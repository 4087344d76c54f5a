"""The progress store in a file (core/progress.py's port): local mode's ``DIR/operator-state.json``
and the Kafka watcher's ``_watch-state.json``.

Each save replaces the file through ``quorum.storage.atomic.atomic_write`` (a temporary file
fsynced, renamed over the old one, the directory fsynced; mode 0600, since the records name
storage UUIDs): after a crash or a power loss the file holds the old progress or the new one,
and a save has returned only once the new one is durable. A file that does not parse is refused
with :class:`~.core.progress.ProgressDamaged` naming it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

from quorum.storage.atomic import atomic_write

from .core.progress import Known, Progress, decode_progress, encode_progress


class FileProgressStore:
    """``known`` is read at each save: what the run mode keeps beside the records."""

    def __init__(self, path: Path, known: Callable[[], Known] = Known) -> None:
        self.path = path
        self.known = known

    def read(self) -> Progress:
        """The saved progress (empty if the file does not exist); blocking."""
        try:
            text = self.path.read_text()
        except FileNotFoundError:
            return Progress()
        return decode_progress(text, str(self.path))

    def write(self, records: list[dict[str, Any]]) -> None:
        """Replace the file with ``records`` and what is known now; blocking, durable on return."""
        atomic_write(self.path, encode_progress(records, self.known()).encode())

    async def load(self) -> Progress:
        return await asyncio.to_thread(self.read)

    async def save(self, records: list[dict[str, Any]]) -> None:
        await asyncio.to_thread(self.write, records)
