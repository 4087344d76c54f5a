"""The text of ``kraftkeeper quorum describe``: the tables Kafka's ``kafka-metadata-quorum``
prints (KIP-595 ``--status`` / ``--replication``), with KIP-856's storage UUIDs. Pure functions of
the describe answer (docs/reference.md), so they are tested without a node."""

from __future__ import annotations

import json
from typing import Any


def format_describe_status(d: dict[str, Any]) -> str:
    """KIP-595 ``--describe status`` with KIP-856's UUIDs and ``CouldBeVoters`` row."""
    voters = d.get("voters", [])
    hw = d.get("high_watermark", -1)
    now_candidates = [v for v in voters if v.get("id") != d.get("leader_id")]
    max_lag = max((int(v.get("lag", 0)) for v in now_candidates), default=0)
    leader_fetch = [v for v in voters if v.get("id") == d.get("leader_id")]
    lead_ts = leader_fetch[0].get("last_caught_up_timestamp", -1) if leader_fetch else -1
    lag_times = [
        max(0, int(lead_ts) - int(v["last_caught_up_timestamp"]))
        for v in now_candidates
        if int(v.get("last_caught_up_timestamp", -1)) >= 0 and int(lead_ts) >= 0
    ]
    voter_ids = {v["id"] for v in voters}
    could = [
        o
        for o in d.get("observers", [])
        if o.get("uuid") and o.get("id") in voter_ids | set(d.get("target_voters") or [])
    ]

    def keys(xs: list[dict[str, Any]]) -> str:
        return json.dumps([{"id": x["id"], "uuid": x.get("uuid")} for x in xs])

    lines = [
        f"ClusterId:              {d.get('cluster_id')}",
        f"LeaderId:               {d.get('leader_id')}",
        f"LeaderEpoch:            {d.get('leader_epoch')}",
        f"HighWatermark:          {hw}",
        f"MaxFollowerLag:         {max_lag}",
        f"MaxFollowerLagTimeMs:   {max(lag_times, default=0)}",
        f"CurrentVoters:          {keys(voters)}",
        f"CouldBeVoters:          {keys(could)}",
        f"CurrentObservers:       {keys(d.get('observers', []))}",
        f"PendingVoterChange:     {json.dumps(d.get('pending_voter_change'))}",
        f"TargetVoters:           {json.dumps(d.get('target_voters'))}",
        f"LeaderRecoveryState:    {d.get('leader_recovery_state')}",
    ]
    return "\n".join(lines)


def format_describe_replication(d: dict[str, Any]) -> str:
    """KIP-595 ``--describe replication`` with KIP-856's ReplicaUuid column."""
    rows = [
        (
            "ReplicaId",
            "ReplicaUuid",
            "Endpoint",
            "LogEndOffset",
            "Lag",
            "LastFetchTimestamp",
            "LastCaughtUpTimestamp",
            "Status",
        )
    ]
    for kind, xs in (("voter", d.get("voters", [])), ("observer", d.get("observers", []))):
        for x in xs:
            status = (
                "Leader"
                if kind == "voter" and x["id"] == d.get("leader_id")
                else ("Follower" if kind == "voter" else "Observer")
            )
            rows.append(
                (
                    str(x["id"]),
                    str(x.get("uuid")),
                    str(x.get("endpoint")),
                    str(x.get("log_end_offset")),
                    str(x.get("lag")),
                    str(x.get("last_fetch_timestamp")),
                    str(x.get("last_caught_up_timestamp")),
                    status,
                )
            )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows)
