"""The recovery event log's vocabulary: every event type the operator emits, with its fields.

The one place an event type is spelt. The operator (``kraftkeeper_operator``: the recovery
controller, the Kafka watcher, unclean recovery) names types by these constants; the report job
(``kraftkeeper_reports``) aggregates by them; the JSON Schema ``schemas/recovery-event.schema.json``
is generated from this module (``python -m kraftkeeper_reports.vocabulary > schemas/...``) and a
test checks that the committed file is what this module generates.

Standard library only: the operator's image has no Spark, and this module is imported there.

Three kinds of recovery share the log, each with its own ``recovery_id``:

* a disk-failure recovery (KIP-856 "Disk failure recovery"): ``disk_replacement_detected`` then
  the steps of :data:`STEP_TYPES`, ending with ``recovery_completed`` or ``recovery_failed``;
  ``replica_fell_behind`` and ``recovery_resumed`` may come in between;
* an unclean recovery (KIP-704 style, the last resort when a majority of voters is gone for
  good): ``unclean_recovery`` when the surviving replica is made the sole voter (records
  committed only on the lost replicas are lost: the one event that means data loss), then
  ``unclean_recovery_completed`` once the quorum serves again.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Any, Final

SCHEMA_VERSION: Final = 1
INT64_MAX: Final = 2**63 - 1


@dataclass(frozen=True)
class Field:
    """A field of ``detail``: its JSON types (JSON Schema names), whether the event must carry
    it, and what it means."""

    name: str
    types: tuple[str, ...]
    description: str
    required: bool = False


@dataclass(frozen=True)
class EventType:
    """One event type: its name (the ``type`` field), what it records, its ``detail`` fields,
    whether it may recur within one recovery (a replica may catch up, fall behind and catch up
    again), and whether it ends the recovery."""

    name: str
    description: str
    detail: tuple[Field, ...] = ()
    recurs: bool = False
    terminal: bool = False

    @property
    def required_detail(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.detail if f.required)


_ENGINE = Field("engine", ("string",), "The quorum engine recovered (e.g. kraftkeeper, kafka).")
_ORDER = Field("order", ("string",), "The voter-change order: AddThenRemove, RemoveThenAdd or auto-join.")
_OBSERVED = Field("observed", ("boolean",),
                  "True when the change was first seen in the quorum (e.g. made by a previous operator run).")
_LAG = Field("lag", ("integer", "null"), "Records the replica was behind the leader, null if not known.")
_REASON_LOSS = Field("reason", ("string",),
                     "Why the quorum was given up on (e.g. no live majority for 120s).", required=True)

DISK_REPLACEMENT_DETECTED: Final = "disk_replacement_detected"
REPLICA_CAUGHT_UP: Final = "replica_caught_up"
ADD_VOTER_STARTED: Final = "add_voter_started"
ADD_VOTER_COMMITTED: Final = "add_voter_committed"
REMOVE_VOTER_STARTED: Final = "remove_voter_started"
REMOVE_VOTER_COMMITTED: Final = "remove_voter_committed"
RECOVERY_COMPLETED: Final = "recovery_completed"
RECOVERY_FAILED: Final = "recovery_failed"
REPLICA_FELL_BEHIND: Final = "replica_fell_behind"
RECOVERY_RESUMED: Final = "recovery_resumed"
UNCLEAN_RECOVERY: Final = "unclean_recovery"
UNCLEAN_RECOVERY_COMPLETED: Final = "unclean_recovery_completed"

TYPES: Final = (
    EventType(DISK_REPLACEMENT_DETECTED,
              "A voter's id came back with a new storage UUID (an observer): its disk was replaced.",
              (Field("endpoint", ("string", "null"), "Where the new replica answers."), _ENGINE, _ORDER)),
    EventType(REPLICA_CAUGHT_UP,
              "The new replica stayed caught up for the stabilisation time (KIP-856: before AddVoter).",
              (_LAG, Field("stable_since_ms", ("integer",), "Epoch ms since which it stayed caught up."),
               _ENGINE, _ORDER), recurs=True),
    EventType(ADD_VOTER_STARTED, "AddVoter(id, new UUID) sent to the leader.", (_ENGINE, _ORDER)),
    EventType(ADD_VOTER_COMMITTED, "The new (id, UUID) is a voter (its record committed).",
              (_OBSERVED, _ENGINE, _ORDER)),
    EventType(REMOVE_VOTER_STARTED, "RemoveVoter(id, old UUID) sent to the leader.", (_ENGINE, _ORDER)),
    EventType(REMOVE_VOTER_COMMITTED, "The old (id, UUID) is no longer a voter (its record committed).",
              (_OBSERVED, _ENGINE, _ORDER)),
    EventType(RECOVERY_COMPLETED, "Both voter changes committed: the recovery is done.",
              (*[Field(n, ("number", "null"), f"Seconds of the {w}, as the operator timed it.")
                 for n, w in (("total_seconds", "whole recovery"), ("stabilization_seconds", "catch-up"),
                              ("add_seconds", "AddVoter round"), ("remove_seconds", "RemoveVoter round"))],
               _ENGINE, _ORDER), terminal=True),
    EventType(RECOVERY_FAILED, "The recovery gave up; detail.reason says why.",
              (Field("reason", ("string",), "Why it gave up (e.g. timeout, quorum_lost, replica_fell_behind, "
                     "a refused voter change).", required=True),
               Field("error", ("string",), "The engine's error code of a refused voter change."),
               _ENGINE, _ORDER), terminal=True),
    EventType(REPLICA_FELL_BEHIND,
              "The new replica lagged again (or the leader refused AddVoter: REPLICA_NOT_CAUGHT_UP); "
              "the stabilisation clock starts over.",
              (_LAG, Field("phase", ("string",), "The recovery's phase when it fell behind."),
               Field("error", ("string",), "The leader's error code, when it refused AddVoter."),
               _ENGINE, _ORDER), recurs=True),
    EventType(RECOVERY_RESUMED,
              "A restarted operator found a recovery under way in the quorum and follows it from there.",
              (Field("phase", ("string",), "The phase the quorum showed."), _ENGINE, _ORDER), recurs=True),
    EventType(UNCLEAN_RECOVERY,
              "DATA LOSS: no live majority for too long; the surviving replica (replica_id, new_uuid) "
              "was made the sole voter with the log it holds. Records committed only on the lost "
              "replicas are lost (KIP-704 style unclean recovery).",
              (_REASON_LOSS,
               Field("log_end_offset", ("integer",), "The survivor's log end offset: the log kept."),
               Field("last_epoch", ("integer",), "The survivor's last epoch."),
               Field("candidates", ("object",),
                     "Each replica that answered: id -> [last epoch, log end offset]."),
               Field("uuids", ("array",), "The survivor's storage UUID(s)."),
               Field("rule", ("string",), "How the survivor was chosen."),
               Field("exit_code", ("integer",), "Exit status of the offline recovery command (local mode)."),
               Field("output", ("string",), "Its last output (local mode)."),
               Field("warning", ("string",), "What is lost, in words.")),
              terminal=False),
    EventType(UNCLEAN_RECOVERY_COMPLETED, "The quorum serves again after an unclean recovery.",
              (Field("voters", ("array",), "The voter ids seen live again."),
               Field("seconds", ("number",), "Seconds from the unclean recovery to serving again.")),
              terminal=True),
)

BY_NAME: Final = {t.name: t for t in TYPES}
KNOWN_TYPES: Final = tuple(t.name for t in TYPES)
# The steps of a disk-failure recovery in KIP-856 order (AddThenRemove): the replacement catches
# up as an observer, is added with AddVoter, then the old (id, UUID) is removed with RemoveVoter.
STEP_TYPES: Final = (
    DISK_REPLACEMENT_DETECTED, REPLICA_CAUGHT_UP, ADD_VOTER_STARTED, ADD_VOTER_COMMITTED,
    REMOVE_VOTER_STARTED, REMOVE_VOTER_COMMITTED,
)
TERMINAL_TYPES: Final = (RECOVERY_COMPLETED, RECOVERY_FAILED)
UNCLEAN_TYPES: Final = (UNCLEAN_RECOVERY, UNCLEAN_RECOVERY_COMPLETED)
# Types that may be logged more than once in one recovery without it being a duplicate.
RECURRING_TYPES: Final = tuple(t.name for t in TYPES if t.recurs)
# The steps a disk-failure recovery logs at most once. The operator logs a step, then persists its
# progress: an operator stopped between the two, with a log it cannot read back (standard
# output), logs the step again when it sees it in the quorum (``detail.observed: true``). Such a
# line repeats the first one's :func:`step_key`; a reader keeps the first line of each key.
ONCE_TYPES: Final = (
    DISK_REPLACEMENT_DETECTED, ADD_VOTER_STARTED, ADD_VOTER_COMMITTED, REMOVE_VOTER_STARTED,
    REMOVE_VOTER_COMMITTED, RECOVERY_COMPLETED, RECOVERY_FAILED,
)


def step_key(record: dict[str, Any]) -> tuple[str, str, str] | None:
    """The idempotent key of an event-log record of a :data:`ONCE_TYPES` step: (``cluster``,
    ``recovery_id``, ``type``); None for the types that may recur (no key: every line counts)."""
    if record.get("type") not in ONCE_TYPES:
        return None
    return str(record.get("cluster")), str(record.get("recovery_id")), str(record["type"])

# Reasons a recovery_failed event gives in detail.reason (open set: readers accept any string).
# A replica that fell behind for good fails its recovery with the reason of the type's name.
REASON_TIMEOUT: Final = "timeout"
REASON_QUORUM_LOST: Final = "quorum_lost"
REASON_FELL_BEHIND: Final = REPLICA_FELL_BEHIND
FAILURE_REASONS: Final = (REASON_TIMEOUT, REASON_QUORUM_LOST, REASON_FELL_BEHIND)

# The fields every event has, in the order the writer emits them, as JSON Schema.
_NONEMPTY = {"type": "string", "minLength": 1, "pattern": "\\S"}
_ID = {"minimum": 0, "maximum": INT64_MAX}
COMMON_FIELDS: Final[dict[str, dict[str, Any]]] = {
    "schema_version": {"description": "Version of this format; readers refuse other values.",
                       "const": SCHEMA_VERSION},
    "ts": {"description": "When the step happened: RFC 3339 in UTC with a fractional second (the writer "
                          "emits milliseconds, e.g. 2026-11-22T00:44:53.123Z).",
           "type": "string", "format": "date-time",
           "pattern": ("^[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}"
                       "\\.[0-9]{1,9}(Z|z|\\+00:00)$")},
    "cluster": {"description": "The quorum: namespace/name of the KRaftKeeper resource, or the local "
                               "directory's name.", **_NONEMPTY},
    "recovery_id": {"description": "Shared by all events of one recovery (unique within its cluster).",
                    **_NONEMPTY},
    "type": {"description": "The step (see the list of known types); more may be added and readers skip "
                            "unknown ones.", **_NONEMPTY, "examples": list(KNOWN_TYPES)},
    "replica_id": {"description": "Id of the voter whose disk was replaced (for an unclean recovery: the "
                                  "surviving replica).", "type": "integer", **_ID},
    "old_uuid": {"description": "Storage (directory) UUID of the lost disk (KIP-856 ReplicaUuid), or null "
                                "if unknown.", "type": ["string", "null"]},
    "new_uuid": {"description": "Storage UUID of the replacement disk (of the survivor, for an unclean "
                                "recovery), or null if not formatted yet.", "type": ["string", "null"]},
    "leader_id": {"description": "The leader the operator talked to for this step, or null if none was "
                                 "known.", "type": ["integer", "null"], **_ID},
    "leader_epoch": {"description": "That leader's epoch, or null if no leader was known.",
                     "type": ["integer", "null"], **_ID},
    "detail": {"description": "Step-specific information: the fields of each type are listed with it "
                              "(more may be added).", "type": "object"},
}
REQUIRED_FIELDS: Final = tuple(COMMON_FIELDS)


def _detail_schema(t: EventType) -> dict[str, Any]:
    props: dict[str, Any] = {}
    for f in t.detail:
        one: dict[str, Any] = {"description": f.description,
                               "type": f.types[0] if len(f.types) == 1 else list(f.types)}
        if f.required and f.types == ("string",):
            one["minLength"] = 1
        props[f.name] = one
    out: dict[str, Any] = {"properties": props}
    if t.required_detail:
        out["required"] = list(t.required_detail)
    return out


def json_schema() -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one event-log line, from this module."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "urn:kraftkeeper:schema:recovery-event:1",
        "title": "KRaftKeeper recovery event",
        "description": (
            "One line of the recovery event log (JSON lines, UTF-8), appended by the operator for each "
            "step of a recovery. Readers skip events whose type they do not know and ignore extra fields "
            "(both are counted), so additionalProperties is allowed. A line is one RFC 8259 JSON value (no "
            "duplicate keys, no NaN), integers are 64-bit. Generated from kraftkeeper_reports.vocabulary; "
            "the same rules are implemented by kraftkeeper_reports.events.check_event and, in Spark, by "
            "kraftkeeper_reports.parse. Only detail.reason of recovery_failed and unclean_recovery is "
            "enforced by readers; the other detail fields are documentation."
        ),
        "type": "object",
        "required": list(REQUIRED_FIELDS),
        "properties": COMMON_FIELDS,
        "$defs": {t.name: {"description": t.description, **_detail_schema(t)} for t in TYPES},
        "allOf": [
            {"if": {"properties": {"type": {"const": t.name}}, "required": ["type"]},
             "then": {"properties": {"detail": {"$ref": f"#/$defs/{t.name}"}}}}
            for t in TYPES
        ],
    }


def schema_text() -> str:
    """The schema file's exact content."""
    return json.dumps(json_schema(), indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":
    sys.stdout.write(schema_text())
