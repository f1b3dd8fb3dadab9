"""Atomic writes: readers see the old file or the new one; a failed write leaves the old file and no temp file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from seer_deploy.core.atomic import install_dir, write_atomic, write_text_atomic


def test_write_replaces_the_file_and_honours_the_umask(tmp_path: Path) -> None:
    dest = tmp_path / "sub" / "config.json"
    old = os.umask(0o022)
    try:
        write_text_atomic(dest, "one")
        write_text_atomic(dest, "two")
    finally:
        os.umask(old)
    assert dest.read_text() == "two"
    assert dest.stat().st_mode & 0o777 == 0o644  # mkstemp would give 0600: unreadable to other users
    assert sorted(p.name for p in dest.parent.iterdir()) == ["config.json"]


def test_a_failing_writer_keeps_the_old_file_and_leaves_no_temp(tmp_path: Path) -> None:
    dest = tmp_path / "engine.json"
    dest.write_text("old")

    def half_then_fail(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(dest, half_then_fail)
    assert dest.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["engine.json"]


def test_install_dir_swaps_a_directory_and_removes_the_old_one(tmp_path: Path) -> None:
    out = tmp_path / "export"
    for content in ("first", "second"):
        tmp = tmp_path / f".export.{content}"
        tmp.mkdir()
        (tmp / "manifest.json").write_text(content)
        install_dir(tmp, out)
    assert (out / "manifest.json").read_text() == "second"
    assert [p.name for p in tmp_path.iterdir()] == ["export"]
