"""Java ``.properties`` text, read and written in one place: a node's ``meta.properties``
(:mod:`quorum.storage.meta`) and the Kafka client settings the operator reads
(``--kafka-client-config``, a Secret's ``client.properties``) are both this format, as
``java.util.Properties.load`` reads it. Standard library only.

Syntax (``java.util.Properties.load``): ``#``/``!`` comment lines; a key ends at the first
unescaped ``=``, ``:`` or whitespace; a line ending in an odd number of backslashes continues on
the next; ``\\t \\n \\r \\f \\uXXXX`` and ``\\<any>`` escapes. Java accepts any line (a line that is
only a key has the empty value); ``require_values`` refuses a key alone on its line (no ``=``, no
value) or an empty key, naming the line, for files people write by hand where that is a mistake.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["PropertiesError", "Property", "parse_properties", "parse_property_lines", "property_line"]

_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}
_BLANK = " \t\f"


@dataclass(frozen=True)
class Property:
    key: str
    value: str
    line: int  # 1-based number of the line the entry starts on
    separated: bool  # the key was followed by ``=`` or ``:`` (not only whitespace, or nothing)


class PropertiesError(ValueError):
    """A line the caller's rules refuse; the message names the source and the line number."""


def _unescape(s: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(s):
        c = s[i]
        if c == "\\" and i + 1 < len(s):
            nxt = s[i + 1]
            if nxt == "u" and i + 6 <= len(s):
                try:
                    out.append(chr(int(s[i + 2 : i + 6], 16)))
                    i += 6
                    continue
                except ValueError:
                    pass
            out.append(_ESCAPES.get(nxt, nxt))
            i += 2
            continue
        out.append(c)
        i += 1
    return "".join(out)


def _split_key(line: str) -> tuple[str, str, bool]:
    """Split a logical line at the first unescaped ``=``, ``:`` or whitespace: (key, raw value,
    whether an ``=``/``:`` separated them)."""
    i = 0
    while i < len(line):
        c = line[i]
        if c == "\\":
            i += 2
            continue
        if c in "=:" + _BLANK:
            key = line[:i]
            rest = line[i:].lstrip(_BLANK)
            if c in _BLANK and rest[:1] in ("=", ":"):
                return key, rest[1:].lstrip(_BLANK), True
            if c in "=:":
                return key, line[i + 1 :].lstrip(_BLANK), True
            return key, rest, False
        i += 1
    return line, "", False


def parse_property_lines(text: str) -> list[Property]:
    """Every entry in file order, repeats included (Java keeps the last)."""
    props: list[Property] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        start = i + 1
        line = lines[i].lstrip(_BLANK)
        i += 1
        if not line or line[0] in "#!":
            continue
        # a line ending in an odd number of backslashes continues on the next line
        while (len(line) - len(line.rstrip("\\"))) % 2 == 1 and i < len(lines):
            line = line[:-1] + lines[i].lstrip(_BLANK)
            i += 1
        key, value, separated = _split_key(line)
        props.append(Property(_unescape(key), _unescape(value), start, separated))
    return props


def parse_properties(
    text: str, *, source: str = "properties", require_values: bool = False
) -> dict[str, str]:
    """``text`` as a dict; a repeated key keeps its last value (Java's rule). With
    ``require_values``, a key alone on its line or an empty key raises :class:`PropertiesError`
    naming ``source`` and the line."""
    out: dict[str, str] = {}
    for p in parse_property_lines(text):
        if require_values and (not p.key or not (p.separated or p.value)):
            shown = text.splitlines()[p.line - 1].strip()
            what = "has no key" if not p.key else "is not key=value (a key alone, no '=')"
            raise PropertiesError(f"{source} line {p.line}: {shown[:80]!r} {what}")
        out[p.key] = p.value
    return out


def _escape(s: str, is_key: bool) -> str:
    out = s.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    if is_key:
        out = out.replace("=", "\\=").replace(":", "\\:").replace(" ", "\\ ")
        if out[:1] in ("#", "!"):  # would start a comment line
            out = "\\" + out
    elif out[:1] in (" ", "\f"):  # a value's leading blanks are dropped unless escaped
        out = "\\" + out
    return out


def property_line(key: str, value: str) -> str:
    """One ``key=value`` line that :func:`parse_properties` reads back as exactly (key, value)."""
    return f"{_escape(key, True)}={_escape(value, False)}"
