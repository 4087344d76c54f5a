"""Configuration of the consensus core (:class:`CoreConfig`).

Defaults follow KRaft (KIP-595): election timeout 1000 ms, fetch timeout 2000 ms, request
timeout 2000 ms. All durations are milliseconds of the clock the driver passes in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from quorum.records import MAX_BATCH_BYTES

# The largest MaxBytes a Fetch / FetchSnapshot may carry (64 MiB, one batch; the wire decoder's
# bound, quorum.runtime.wire.MAX_BYTES, is this value): a replica configured to ask for more
# would send requests every leader refuses as INVALID_REQUEST, and never catch up.
MAX_FETCH_BYTES = MAX_BATCH_BYTES


@dataclass(frozen=True)
class CoreConfig:
    """Static settings of one replica's core.

    ``bootstrap_voters`` is the ``--voters`` map (id -> "HOST:PORT"): the initial voter set
    while no voter records are in the log (KIP-856 "Bootstrapping"). Until the first leader has
    written one AddVoter record per bootstrap voter, each bootstrap voter is the key
    ``(id, uuid=None)``, which matches any UUID for that id.
    """

    bootstrap_voters: dict[int, str] = field(default_factory=dict)
    local_endpoint: str | None = None  # this replica's HOST:PORT, sent in requests
    # True only for a directory formatted for a NEW cluster. A directory formatted to replace
    # a lost disk (a new storage UUID joining an existing cluster) must pass False: it must not
    # take the configured voters as its voter set (their uuid-None keys would match its new
    # UUID and two such replicas could elect each other on empty logs). With False the replica
    # knows no voters until it reads the voter records from the leader's log: it is an
    # observer that fetches and never becomes a candidate (cf. Kafka's format
    # --no-initial-controllers, KIP-853).
    initial_bootstrap: bool = True
    # KIP-595 timers
    election_timeout_ms: int = 1000  # base; the actual timeout is uniform in [base, 2*base)
    election_backoff_max_ms: int = 1000  # max exponential backoff after a lost election
    fetch_timeout_ms: int = 2000  # follower: no leader contact -> election; leader: zombie check
    request_timeout_ms: int = 2000  # outbound RPC deadline tracked by the core
    # Fetch
    fetch_max_wait_ms: int = 500  # long-poll time a leader may park a Fetch
    fetch_max_bytes: int = 8 * 1024 * 1024
    # FetchSnapshot chunk (KIP-630 MaxBytes; a leader serves at most its own value). As large as
    # a catch-up Fetch: a 1 GB snapshot in 31 round trips instead of 125; measured
    # with bench/recovery, 1 GB x3, replica 1.42 CPU s per GB against 1.5-1.8 with 8 MiB.
    snapshot_chunk_bytes: int = 32 * 1024 * 1024
    # Follower catch-up: while its log end is below the leader's high watermark, a
    # follower fsyncs once per this many fetched bytes instead of once per Fetch (0: every
    # Fetch); a fsync per 8 MiB cost 3-7x the disk throughput of one per 64 MiB here.
    catchup_flush_bytes: int = 64 * 1024 * 1024
    # ... and asks for (and a leader serves, below its high watermark) up to this many bytes
    # per Fetch instead of ``fetch_max_bytes`` (at most MAX_FETCH_BYTES, checked below).
    catchup_fetch_max_bytes: int = 32 * 1024 * 1024
    # KIP-856 AddVoter catch-up rule (step 1): fetch offset within this many records of the
    # leader's log end, and fetched within catch_up_recent_ms.
    catch_up_max_lag: int = 100
    catch_up_recent_ms: int = 2000
    add_voter_timeout_ms: int = 30000  # REPLICA_NOT_CAUGHT_UP / REQUEST_TIMED_OUT after this
    # KIP-996 idea: ask for pre-votes before bumping the epoch.
    pre_vote: bool = True
    # Group commit: max records in one leader batch (the rest go to the next batch).
    max_batch_records: int = 4096
    # Leader: an observer (non-voter) that has not fetched for this long is forgotten (Kafka
    # uses 5 minutes), and at most this many observers are tracked (the least recently
    # fetching one is dropped), so made-up replica ids cannot grow the leader's state.
    observer_expiry_ms: int = 300_000
    max_observers: int = 64

    def __post_init__(self) -> None:
        for name in (
            "election_timeout_ms",
            "fetch_timeout_ms",
            "request_timeout_ms",
            "fetch_max_bytes",
            "catchup_fetch_max_bytes",
            "snapshot_chunk_bytes",
            "max_batch_records",
            "observer_expiry_ms",
            "max_observers",
        ):
            if getattr(self, name) <= 0:
                raise ValueError(f"CoreConfig.{name} must be positive, got {getattr(self, name)}")
        for name in ("fetch_max_bytes", "catchup_fetch_max_bytes", "snapshot_chunk_bytes"):
            if getattr(self, name) > MAX_FETCH_BYTES:
                raise ValueError(
                    f"CoreConfig.{name} must be at most {MAX_FETCH_BYTES} (64 MiB, the largest MaxBytes "
                    f"a Fetch may carry), got {getattr(self, name)}"
                )
        non_negative = (
            "fetch_max_wait_ms",
            "catchup_flush_bytes",
            "catch_up_max_lag",
            "catch_up_recent_ms",
            "election_backoff_max_ms",
        )
        for name in non_negative:
            if getattr(self, name) < 0:
                raise ValueError(f"CoreConfig.{name} must not be negative, got {getattr(self, name)}")
        for vid in self.bootstrap_voters:
            if vid < 0:
                raise ValueError(f"CoreConfig.bootstrap_voters: replica id {vid} must not be negative")
