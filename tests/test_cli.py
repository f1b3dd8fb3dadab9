"""The command line: help, generation on a checkpoint, and one-line errors with exit code 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from seer_deploy.cli import main


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out = capsys.readouterr()
    return int(exit_info.value.code or 0), out.out, out.err


def test_help_lists_the_verbs(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(["--help"], capsys)
    assert code == 0
    for verb in ("generate", "demo"):
        assert verb in out


def test_generate_json_on_a_checkpoint(make_checkpoint, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_checkpoint("llama")
    code, out, err = run(["generate", str(path), "-p", "reverse 12", "-p", "sort 987", "--gen-length", "8", "--json"], capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines()]
    assert [r["prompt"] for r in rows] == ["reverse 12", "sort 987"]
    assert all(len(r["tokens"]) == 8 and 12 not in r["tokens"] for r in rows)


def test_prompts_file(make_checkpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = make_checkpoint("llada")
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "count 123"}\n\nreverse 4\n')
    code, out, _ = run(["generate", str(path), "--prompts", str(prompts), "--gen-length", "4"], capsys)
    assert code == 0 and out.count("->") == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (["--gen-length", "10", "--block-length", "4"], "not a multiple of block_length"),
        (["--gen-length", "8", "--steps", "3", "--block-length", "4"], "cannot be split evenly"),
        (["--gen-length", "200"], "exceeds the model's 128 positions"),
    ],
)
def test_bad_arguments_exit_2_with_one_line(make_checkpoint, capsys, args: list[str], message: str) -> None:
    path = make_checkpoint("llada")
    code, _, err = run(["generate", str(path), "-p", "reverse 1", *args], capsys)
    assert code == 2
    assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_unknown_checkpoint_and_missing_prompt(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(["generate", str(tmp_path / "nope"), "-p", "x"], capsys)
    assert code == 2 and "does not exist" in err
    code, _, err = run(["generate", str(tmp_path)], capsys)
    assert code == 2 and "no prompt given" in err
    code, _, err = run(["generate"], capsys)
    assert code == 2 and "Missing argument" in err
