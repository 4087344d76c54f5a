"""The pure consensus core (KIP-595 Raft with KIP-856 membership, KIP-642 reassignment and
KIP-704 style leader recovery). No I/O, no clock, no randomness of its own: see
``docs/design.md`` ("The core contract") and :mod:`quorum.core.raft`."""
