"""The pure consensus core: KIP-595 Raft with KIP-856 membership, KIP-642 reassignment and
KIP-704 style leader recovery. No I/O, no clock, no randomness of its own (docs/design.md,
"The core contract").

Module map:

* :mod:`.raft` — ``RaftCore``, the object the driver talks to (step / tick / propose /
  read_index / admin / ready / advance, snapshot handshake);
* :mod:`.messages` — RPC request / response dataclasses; :mod:`.ready` — ``Ready`` and its
  parts, the ``LogReader`` protocol; :mod:`.config` — ``CoreConfig``;
* :mod:`.roles` — one small class per role and the transition table;
* :mod:`.election` — Vote, pre-vote, BeginQuorumEpoch, EndQuorumEpoch, zombie leader;
* :mod:`.replication` — Fetch / FetchSnapshot on both sides, high watermark, long polling;
* :mod:`.membership` — AddVoter / RemoveVoter, bootstrapping, reassignment, recovery hand-off;
* :mod:`.progress` — leader-side replica progress; :mod:`.voters` — voter set history;
  :mod:`.logmeta` — log offsets and epoch cache; :mod:`.describe` — describe and metrics;
* :mod:`.recovery` — the offline unclean-recovery plan.

The driver that carries out the core's ``Ready`` is :mod:`quorum.driver`; the in-memory log
it runs on in tests and the simulation is ``quorum.storage.memory.MemoryLog``.
"""
