"""The one Java ``.properties`` reader (quorum.properties): Java's syntax, and the strict mode
that names a line that is not ``key=value``."""

from __future__ import annotations

import pytest

from quorum.properties import PropertiesError, parse_properties, parse_property_lines, property_line


def test_java_syntax() -> None:
    text = "# c\n! c2\n  a = 1\nb:2\nc 3\nd=x\\\n   y\ne=tab\\there\nf\\=g=h\n\\u0041=uni\nempty\n"
    assert parse_properties(text) == {
        "a": "1",
        "b": "2",
        "c": "3",
        "d": "xy",
        "e": "tab\there",
        "f=g": "h",
        "A": "uni",
        "empty": "",
    }
    # the line an entry starts on, continuation lines included
    assert [(p.key, p.line) for p in parse_property_lines(text)][3:5] == [("d", 6), ("e", 8)]


def test_a_repeated_key_keeps_the_last_value() -> None:
    assert parse_properties("a=1\na=2\n") == {"a": "2"}
    assert [p.value for p in parse_property_lines("a=1\na=2\n")] == ["1", "2"]


def test_strict_mode_accepts_java_separators() -> None:
    text = "a=1\nb: 2\nsecurity.protocol SSL\nempty=\n"
    want = {"a": "1", "b": "2", "security.protocol": "SSL", "empty": ""}
    assert parse_properties(text, require_values=True) == want


@pytest.mark.parametrize(
    ("text", "line", "why"),
    [
        ("a=1\nsecurity.protocol\n", 2, "not key=value"),
        ("a=1\n\n# c\nssl.truststore.location\n", 4, "not key=value"),
        ("=orphan\n", 1, "has no key"),
        ("a=1\n  : x\n", 2, "has no key"),
    ],
)
def test_strict_mode_names_the_line(text: str, line: int, why: str) -> None:
    assert parse_properties(text) is not None  # Java itself accepts every one of these
    with pytest.raises(PropertiesError, match=rf"^client\.properties line {line}: .*{why}"):
        parse_properties(text, source="client.properties", require_values=True)


@pytest.mark.parametrize("key", ["plain", "with space", "a=b", "c:d", "back\\slash", "tab\there", "#x", "!y"])
@pytest.mark.parametrize("value", ["", "v", " lead", "multi\nline", "x=y:z", "\\"])
def test_a_written_line_reads_back(key: str, value: str) -> None:
    assert parse_properties(property_line(key, value), require_values=True) == {key: value}
