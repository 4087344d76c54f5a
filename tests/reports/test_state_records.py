"""A report state's own records (``location.json``, ``inputs.json``, ``landed.json``, a batch's
``batches/<N>.json``) damaged on disk: each is refused with an error naming the file, before
anything is ingested, and the record is left as it was for the user to look at (``--full``
rebuilds the state). No Spark is needed to read them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from kraftkeeper_reports import ingest as ing
from kraftkeeper_reports import landing, partials


@pytest.fixture
def state(tmp_path: Path) -> tuple[ing.Layout, list[str]]:
    events = tmp_path / "events"
    events.mkdir()
    (events / "a.jsonl").write_text('{"type": "recovery_started"}\n')
    lay = ing.Layout(tmp_path / "state")
    ing.check_inputs(lay, [str(events)])  # a good state first
    return lay, [str(events)]


@pytest.mark.parametrize("text", ["", "{not json", '{"a": 1}', "\xff\xfe"])
def test_a_damaged_location_or_inputs_record_is_refused_naming_it(
    state: tuple[ing.Layout, list[str]], text: str
) -> None:
    lay, inputs = state
    for record in (lay.location, lay.inputs):
        good = record.read_bytes()
        record.write_bytes(text.encode("latin-1"))
        with pytest.raises(ing.StateError, match=rf"{record.name} is damaged .*--full rebuilds"):
            ing.check_inputs(lay, inputs)
        assert record.read_bytes() == text.encode("latin-1")  # kept for the user to look at
        record.write_bytes(good)
    ing.check_inputs(lay, inputs)  # whole again: accepted


def test_a_damaged_landing_record_is_refused_before_anything_lands(
    state: tuple[ing.Layout, list[str]],
) -> None:
    lay, inputs = state
    lay.landed.write_text("[1, 2")
    with pytest.raises(ing.StateError, match=r"landed.json is damaged"):
        landing.land(lay, [Path(inputs[0])], 0.0)
    assert not any(lay.landing.iterdir())


@pytest.mark.parametrize("record", [{"batch": 0}, {"rows": {"events": "3"}}, {"rows": []}])
def test_a_batch_record_without_its_row_counts_is_refused(tmp_path: Path, record: object) -> None:
    lay = ing.Layout(tmp_path)
    lay.batches.mkdir(parents=True)
    (lay.batches / "0.json").write_text(json.dumps(record))
    with pytest.raises(ing.StateError, match=r"0.json is damaged \(no row counts\)"):
        partials.ledger(lay)
