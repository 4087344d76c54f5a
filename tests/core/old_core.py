"""The core as it behaved before the Fetch-offset durability fix, kept ONLY so that the tests can show they
detect the Fetch-offset durability hole (tests/core/test_durability.py, the simulation's
regression seeds). Never used outside tests.

Old behaviour: ``advance`` added whatever the core had queued since ``ready()`` (messages,
commit, results) to the Ready being carried out, unless a quorum-state write was pending; a
follower built its next Fetch from the log end at once, durable or not.
"""

from __future__ import annotations

from quorum.core.raft import RaftCore
from quorum.core.ready import Ready


class OldRaftCore(RaftCore):
    def advance(self, ready: Ready, persisted_end_offset: int) -> None:
        super().advance(ready, persisted_end_offset)
        if self._state_dirty:
            return
        ready.messages.extend(self._messages)
        self._messages = []
        if self._commit_dirty:
            ready.commit = self.hw
            self._commit_dirty = False
        ready.proposal_results.extend(self._proposal_results)
        self._proposal_results = []
        ready.reads.extend(self._reads)
        self._reads = []
        ready.admin_results.extend(self._admin_results)
        self._admin_results = []

    def tick_fetch(self) -> None:
        # Old rule: the next Fetch claims the whole log end, written or not.
        saved = self.meta.durable_end
        self.meta.durable_end = self.meta.end
        try:
            super().tick_fetch()
        finally:
            self.meta.durable_end = min(saved, self.meta.end)
