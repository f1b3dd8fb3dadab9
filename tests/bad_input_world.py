"""The bad-input harness (tests/test_bad_inputs.py, tests/test_bad_artifacts.py): each case writes its files into a
fresh world, runs the real command line in-process and checks the README's promise for bad input:

- exit code 2 and exactly one line on stderr, `error: ...`, matching what the case expects it to name;
- nothing left behind and nothing removed: every file and directory under the world is as before;
- nothing outside the input's directory opened: the world's `outside/` holds canaries (valid copies of what a
  path might point at), and an audit hook records every file Python opens;
- no heavy work started before the input was checked: ONNX export and ONNX Runtime sessions raise
  HeavyWorkStarted unless a case needs a session to find the problem (a damaged graph).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from seer_deploy.cli import main

OPENED: list[str] = []
_RECORDING = [False]


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if _RECORDING[0] and event == "open" and args and isinstance(args[0], str | bytes | os.PathLike):
        OPENED.append(os.path.realpath(os.fsdecode(args[0])))  # a symlink counts as the file it points at


sys.addaudithook(_audit)  # hooks cannot be removed; it records only while a case runs


class HeavyWorkStarted(Exception):
    """Raised by the guarded ONNX export and ONNX Runtime session: the input should have been refused first."""


def guard_heavy_work(monkeypatch: pytest.MonkeyPatch) -> None:
    import onnxruntime
    import torch

    def refuse(*args: object, **kwargs: object) -> None:
        raise HeavyWorkStarted("an ONNX export or ONNX Runtime session started before the input was checked")

    monkeypatch.setattr(torch.onnx, "export", refuse)
    monkeypatch.setattr(onnxruntime, "InferenceSession", refuse)


@dataclass
class World:
    """A fresh directory per case: pristine artifacts are copied in on demand; `outside` holds the canaries."""

    root: Path
    sources: dict[str, Path]  # name -> a pristine directory or file to copy ('ckpt', 'sharded', 'export', ...)
    outside: Path = field(init=False)

    def __post_init__(self) -> None:
        self.outside = self.root / "outside"
        self.outside.mkdir()
        for name, source in (("canary.safetensors", "ckpt/model.safetensors"), ("canary.onnx", "export/step.onnx"),
                             ("canary.bin", "export/weights.bin")):
            origin = self.sources.get(source.split("/")[0])
            if origin is not None:
                shutil.copyfile(origin / source.split("/", 1)[1], self.outside / name)

    def copy(self, source: str, name: str | None = None) -> Path:
        dest = self.root / (name or source)
        if not dest.exists():
            shutil.copytree(self.sources[source], dest, symlinks=True)
        return dest


def edit_json(file: Path, changes: dict[str, Any] | None = None, drop: tuple[str, ...] = ()) -> None:
    """Rewrite a JSON file with `changes` merged in (dotted keys reach nested objects) and `drop` keys removed."""
    data = json.loads(file.read_text())
    for key, value in (changes or {}).items():
        *parents, last = key.split(".")
        node = data
        for parent in parents:
            node = node[parent]
        node[last] = value
    for key in drop:
        data.pop(key, None)
    file.write_text(json.dumps(data))  # NaN and Infinity are written as such: not JSON, and meant to be refused


def snapshot(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under root (symlinks not followed) -> (mode, size, mtime_ns)."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            info = path.lstat()
            found[str(path.relative_to(root))] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return found


def write_tiny_sources(root: Path) -> dict[str, Path]:
    """Pristine inputs to copy into worlds: a tiny checkpoint, single-file and sharded, with the demo tokenizer."""
    from conftest import tiny_model

    from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
    from seer_deploy.models.demos.demo_tasks import write_tokenizer

    write_tokenizer(root / "tokenizer.json")
    save_checkpoint(tiny_model(), root / "ckpt", tokenizer_file=root / "tokenizer.json")
    save_checkpoint(tiny_model(), root / "sharded", tokenizer_file=root / "tokenizer.json", max_shard_bytes=20_000)
    return {"ckpt": root / "ckpt", "sharded": root / "sharded"}


def generate(target: str | Path, *flags: str, prompt: str = "reverse 1") -> list[str]:
    """`generate TARGET -p PROMPT --gen-length 4 FLAGS`."""
    return ["generate", str(target), "-p", prompt, "--gen-length", "4", *flags]


Setup = Callable[[World], list[str]]


def argv(*args: str) -> Setup:
    """A fixed command line; '{root}' stands for the world's directory."""
    return lambda w: [a.replace("{root}", str(w.root)) for a in args]


@dataclass(frozen=True)
class Case:
    """One bad input: `setup` writes its files into the world and returns the argv; `message` is a regex the one
    error line must match. `heavy_ok`: finding the problem needs an ONNX Runtime session (a damaged graph)."""

    id: str
    setup: Setup
    message: str
    wired_by: str | None = None  # not yet kept: the owner who will wire it (the case is a strict xfail until then)
    heavy_ok: bool = False


def params(cases: list[Case]) -> list[Any]:
    """pytest params; cases that wait for another file's owner are strict xfails, so they flip once wired."""
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), "case ids must be unique"
    return [
        pytest.param(c, id=c.id, marks=[pytest.mark.xfail(strict=True, reason=c.wired_by)] if c.wired_by else [])
        for c in cases
    ]


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """Run the command line in-process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out = capsys.readouterr()
    code = exit_info.value.code
    return (code if isinstance(code, int) else 0 if code is None else 1), out.out, out.err


def assert_one_line_error(code: int, err: str, message: str = "") -> str:
    lines = err.strip().splitlines()
    assert code == 2, f"exit {code}, stderr: {err!r}"
    assert len(lines) == 1 and lines[0].startswith("error: "), f"not one error line: {err!r}"
    assert re.search(message, lines[0]), f"{lines[0]!r} does not match {message!r}"
    return lines[0]


def check_case(case: Case, world: World, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Run one case and check every promise (see the module docstring)."""
    monkeypatch.delenv("SEER_DEPLOY_DEBUG", raising=False)
    argv = case.setup(world)
    if not case.heavy_ok:
        guard_heavy_work(monkeypatch)
    before = snapshot(world.root)
    OPENED.clear()
    _RECORDING[0] = True
    try:
        code, _, err = run_cli(argv, capsys)
    finally:
        _RECORDING[0] = False
    assert_one_line_error(code, err, case.message)
    assert snapshot(world.root) == before, "files were left behind, changed or removed"
    outside = str(world.outside.resolve())
    assert not [p for p in OPENED if p.startswith(outside)], "a file outside the input's directory was opened"
