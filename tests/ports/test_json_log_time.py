"""The node's JSON log lines (``KRAFTKEEPER_LOG_FORMAT=json``) stamp UTC, as their ``Z`` says,
whatever the machine's time zone."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator

import pytest

from quorum.runtime.run import JsonFormatter
from quorum.timefmt import parse_rfc3339


@pytest.fixture
def far_from_utc() -> Iterator[None]:
    old = os.environ.get("TZ")
    os.environ["TZ"] = "XST-5:30"  # UTC+05:30, a POSIX rule: no time zone database needed
    time.tzset()
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TZ", None)
        else:
            os.environ["TZ"] = old
        time.tzset()


def test_json_log_time_is_utc(far_from_utc: None) -> None:
    record = logging.LogRecord("kraftkeeper", logging.INFO, __file__, 1, "hello", None, None)
    line = json.loads(JsonFormatter("node-1").format(record))
    assert line["ts"].endswith("Z")
    assert parse_rfc3339(line["ts"]) == int(record.created * 1000)
