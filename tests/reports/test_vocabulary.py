"""One event vocabulary: the schema file is generated from ``kraftkeeper_reports.vocabulary``,
every type there is one the readers know, and no product code spells a type as a string."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest
from kraftkeeper_reports import events as ev
from kraftkeeper_reports import vocabulary as vocab
from kraftkeeper_reports.tables import TS_COL

ROOT = Path(__file__).resolve().parents[2]
SCHEMA = ROOT / "schemas" / "recovery-event.schema.json"


def test_schema_file_is_the_generated_one() -> None:
    want = vocab.schema_text()
    assert SCHEMA.read_text(encoding="utf-8") == want, (
        "schemas/recovery-event.schema.json is stale: regenerate it with "
        "python -m kraftkeeper_reports.vocabulary > schemas/recovery-event.schema.json"
    )


def test_every_type_the_operator_emits_is_known_to_the_readers() -> None:
    # The four the report used to skip as unknown, among them the one that means data loss.
    for t in ("unclean_recovery", "unclean_recovery_completed", "replica_fell_behind", "recovery_resumed"):
        assert t in ev.KNOWN_TYPES and t in vocab.BY_NAME
    assert set(TS_COL) == set(ev.KNOWN_TYPES)
    assert len(set(ev.KNOWN_TYPES)) == len(ev.KNOWN_TYPES)


def _example(t: vocab.EventType) -> dict[str, object]:
    detail: dict[str, object] = {}
    for f in t.detail:
        detail[f.name] = {"string": "x", "integer": 3, "number": 1.5, "boolean": True, "array": [1],
                          "object": {"1": [4, 10]}, "null": None}[f.types[0]]
    return ev.RecoveryEvent(t.name, "r1", 2, "old", "new", 1, 4, detail).to_record("ns/q", 1_790_000_000_000)


@pytest.mark.parametrize("t", vocab.TYPES, ids=lambda t: t.name)
def test_each_type_with_its_fields_is_valid_for_the_writer_and_the_schema(t: vocab.EventType) -> None:
    rec = _example(t)
    assert ev.validate_event(rec) == []
    jsonschema.validate(rec, json.loads(SCHEMA.read_text()))
    if t.required_detail:
        bad = {**rec, "detail": {}}
        assert ev.validate_event(bad), f"{t.name} without {t.required_detail} must be refused"
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate(bad, json.loads(SCHEMA.read_text()))


def test_no_event_type_is_spelled_outside_the_vocabulary() -> None:
    """Product code names types by the vocabulary's constants: a renamed or new type is then
    one edit, and the readers cannot miss one the operator emits."""
    quoted = re.compile("[\"'](" + "|".join(map(re.escape, ev.KNOWN_TYPES)) + ")[\"']")
    found = []
    # The product packages and the report's bench (the operator benches parse logs of their own).
    files = [f for sub in ("operator", "reports", "demos", "quorum") for f in (ROOT / sub).rglob("*.py")]
    for f in [*files, ROOT / "bench" / "report.py"]:
        if f.name == "vocabulary.py" or ".venv" in f.parts:
            continue
        for i, line in enumerate(f.read_text(encoding="utf-8").splitlines(), 1):
            if quoted.search(line):
                found.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()}")
    assert found == []
