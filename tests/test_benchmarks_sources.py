"""Every table in BENCHMARKS.md names where its figures come from: a committed raw JSON / CSV file under
benchmarks/results*/ (`<!-- source: PATH[, PATH] -->`), or says that they cannot be reproduced from one (`<!-- not
reproducible from a raw file: WHY -->`); the marker sits after the heading the table is under and holds until the
next heading. BENCHMARKS.md is what scripts/render_benchmarks.py renders from the committed files."""

from __future__ import annotations

import csv
import importlib.util
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MARKER = re.compile(r"<!-- (source: (?P<paths>[^>]+?)|not reproducible from a raw file: (?P<why>[^>]+?)) -->")


def tables(text: str) -> list[tuple[int, str | None]]:
    """(line number, the marker in force) for each table's first line."""
    found: list[tuple[int, str | None]] = []
    marker: str | None = None
    previous = ""
    for number, line in enumerate(text.splitlines(), 1):
        if line.startswith("#"):
            marker = None
        elif match := MARKER.fullmatch(line.strip()):
            marker = match.group(0)
        elif line.startswith("|") and not previous.startswith("|"):
            found.append((number, marker))
        previous = line
    return found


def sources(marker: str) -> list[Path]:
    match = MARKER.fullmatch(marker)
    assert match is not None
    paths = match.group("paths")
    return [ROOT / p.strip() for p in paths.split(",")] if paths else []


def readable(path: Path) -> bool:
    """A raw result: JSON that parses, or CSV with a header row."""
    if path.suffix == ".json":
        json.loads(path.read_text())
        return True
    if path.suffix == ".csv":
        return bool(next(csv.reader(path.open()), None))
    return False


def test_every_table_names_a_committed_raw_source_or_says_it_has_none() -> None:
    text = (ROOT / "BENCHMARKS.md").read_text()
    found = tables(text)
    assert len(found) > 20, "the walk found too few tables: the format changed?"
    problems = []
    for number, marker in found:
        if marker is None:
            problems.append(f"line {number}: a table with no source marker")
            continue
        for path in sources(marker):
            if not path.is_file():
                problems.append(f"line {number}: {path.relative_to(ROOT)} is missing")
            elif not path.relative_to(ROOT).parts[1].startswith("results") or not readable(path):
                problems.append(f"line {number}: {path.relative_to(ROOT)} is not a JSON / CSV under benchmarks/results*/")
    assert not problems, "\n".join(problems)


def test_the_walk_refuses_a_table_whose_source_is_missing_or_unnamed() -> None:
    text = "# a\n<!-- source: benchmarks/results/nothing-here.json -->\n\n| x |\n|---|\n| 1 |\n\n## b\n\n| y |\n"
    (first, marker), (second, none) = tables(text)
    assert marker is not None and not sources(marker)[0].is_file()
    assert (first, second, none) == (4, 10, None)  # a heading ends a marker's reach


def test_benchmarks_md_is_what_the_renderer_writes_from_the_committed_files() -> None:
    spec = importlib.util.spec_from_file_location("render_benchmarks", ROOT / "scripts" / "render_benchmarks.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    if (ROOT / "BENCHMARKS.md").read_text() != module.render():
        pytest.fail("BENCHMARKS.md differs from `python scripts/render_benchmarks.py`'s output: re-render it")
