"""The documents against the tree: every repository path and module a document names exists, the
module maps (``quorum/__init__.py``, docs/operator.md's "Code layout", docs/design.md's packages)
list every module there is, and nothing in the repository cites a tracker issue by number or a
file outside the repository. Pure file reading: no installs, well under a second."""

from __future__ import annotations

import os
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = [
    REPO / "README.md",
    REPO / "bench" / "README.md",
    REPO / "e2e" / "README.md",
    *sorted((REPO / "docs").glob("*.md")),
]
TOP = {p.name for p in REPO.iterdir() if not p.name.startswith(".")} - {"kraftkeeper.egg-info"}
SKIP_DIRS = {".git", ".venv", "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache", "node_modules"}
TEXT = {".py", ".md", ".sh", ".txt", ".yaml", ".yml", ".tpl", ".toml", ".mod", ".cfg", ".properties"}
# A document's placeholders: upper-case words (DIR, NAME, N) stand for the reader's values.
PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]*\b|<[^>]+>|\{[^}]*\}")


def _code_spans(text: str) -> list[str]:
    return re.findall(r"`([^`\n]+)`", text)


def _repo_path(token: str) -> str | None:
    """The repository path a code span names (its first word), or None if it names none."""
    word = token.split()[0] if token.split() else ""
    word = word.rstrip(",.;:)")
    first = word.split("/")[0]
    if "/" not in word and word not in {"dev.sh", "Dockerfile"}:
        return None
    if first not in TOP or PLACEHOLDER.search(word):
        return None
    return word


def test_every_path_named_in_the_docs_exists() -> None:
    missing = []
    for doc in DOCS:
        for span in _code_spans(doc.read_text()):
            path = _repo_path(span)
            if path is None:
                continue
            found = list(REPO.glob(path.rstrip("/"))) if "*" in path else [REPO / path.rstrip("/")]
            if not found or not all(p.exists() for p in found):
                missing.append(f"{doc.relative_to(REPO)}: `{span}`")
    assert not missing, "documents name paths that are not in the tree:\n" + "\n".join(missing)


def _module_exists(dotted: str) -> bool:
    """``a.b.c`` names a package or module (a trailing attribute is allowed: ``a.b.func``)."""
    roots = {
        "quorum": REPO,
        "kraftkeeper_operator": REPO / "operator",
        "kraftkeeper_reports": REPO / "reports",
        "kraftkeeper_demo": REPO / "demos",
        "testkit": REPO,
    }
    parts = dotted.split(".")
    base = roots[parts[0]]
    resolved = 0
    for i in range(1, len(parts) + 1):
        p = base.joinpath(*parts[:i])
        if p.is_dir() or p.with_suffix(".py").is_file():
            resolved = i
        else:
            break
    # package + module at least; at most one unresolved attribute chain after a module
    return resolved >= min(2, len(parts))


def test_every_module_named_in_the_docs_exists() -> None:
    # Not preceded by a dot: ``controller.quorum.voters`` is a Kafka setting, not our module.
    packages = "quorum|kraftkeeper_operator|kraftkeeper_reports|kraftkeeper_demo|testkit"
    rx = re.compile(rf"(?<![\w.])((?:{packages})(?:\.[a-z_][a-z0-9_]*)+)")
    missing = []
    for doc in [*DOCS, REPO / "quorum" / "__init__.py"]:
        for name in set(rx.findall(doc.read_text())):
            if not _module_exists(name):
                missing.append(f"{doc.relative_to(REPO)}: {name}")
    assert not missing, "documents name modules that do not exist:\n" + "\n".join(sorted(missing))


def _modules(package: Path) -> set[str]:
    return {
        p.name
        for p in package.iterdir()
        if p.name != "__init__.py" and (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").exists()))
    }


def test_quorum_package_map_is_complete() -> None:
    doc = (REPO / "quorum" / "__init__.py").read_text()
    listed = set(re.findall(r"^\s+quorum\.([a-z_]+)\s", doc, re.M))
    actual = {m.removesuffix(".py") for m in _modules(REPO / "quorum")}
    assert listed == actual, f"quorum/__init__.py's map: missing {actual - listed}, stale {listed - actual}"


def test_operator_code_layout_is_complete() -> None:
    text = (REPO / "docs" / "operator.md").read_text()
    section = text.split("## Code layout", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"`([a-z0-9_/]+\.py)`", section))
    pkg = REPO / "operator" / "kraftkeeper_operator"
    actual = {
        p.relative_to(pkg).as_posix()
        for p in pkg.rglob("*.py")
        if p.name not in ("__init__.py", "__main__.py") and "__pycache__" not in p.parts
    }
    assert not named - actual, f"docs/operator.md names modules that do not exist: {named - actual}"
    assert not actual - named, f"docs/operator.md's code layout omits {sorted(actual - named)}"


def test_design_doc_names_every_engine_package() -> None:
    text = (REPO / "docs" / "design.md").read_text()
    packages = {p.name for p in (REPO / "quorum").iterdir() if (p / "__init__.py").exists()}
    unnamed = {p for p in packages if f"quorum/{p}/" not in text}
    assert not unnamed, f"docs/design.md's engine modules omit quorum/{sorted(unnamed)}"


def _tracked_text_files() -> list[Path]:
    out = []
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d not in SKIP_DIRS and not d.endswith(".egg-info")]
        for name in files:
            p = Path(root, name)
            if p.suffix in TEXT or name in {"Dockerfile", "dev.sh"}:
                out.append(p)
    return out


# Spelled in pieces so that this file does not match itself.
_OUTSIDE = re.compile(
    "|".join([r"interfaces\." + "md", r"pitfalls\." + "md", r"shared/" + "spec", r"\.\./" + "shared"])
)
_ISSUE = re.compile(r"\b[Ii]ssues? " + r"#?\d+\b")
# Another project's tracker may be cited by number, naming the project on the same line.
_FOREIGN = re.compile(r"\b(Consul|Kafka|KAFKA-\d+|etcd|Kubernetes|kopf|aiohttp|Spark|CPython)\b")


def test_nothing_cites_an_issue_number_or_a_file_outside_the_repository() -> None:
    found = []
    for p in _tracked_text_files():
        for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1):
            if _OUTSIDE.search(line) or (_ISSUE.search(line) and not _FOREIGN.search(line)):
                found.append(f"{p.relative_to(REPO)}:{n}: {line.strip()[:120]}")
    assert not found, (
        "state the invariant or the reason instead of an issue number, and cite nothing outside the "
        "repository:\n" + "\n".join(found)
    )
