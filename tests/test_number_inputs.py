"""Numbers in users' text end as one line and exit 2, never as an "internal error": NaN and infinity for every
numeric option of every verb (found by walking the verbs, so a new option is covered), and digits of other scripts
where an integer is expected ('²' passes str.isdigit() and then fails int(); '١٦' is read by int() as 16): the
digits 0-9 are the only ones taken."""

from __future__ import annotations

from pathlib import Path

import click
import pytest
from bad_input_world import assert_one_line_error, guard_heavy_work, run_cli

from seer_deploy.cli import cli
from seer_deploy.cli.verbs import VERBS
from seer_deploy.core.checks import ascii_int, ascii_ints
from seer_deploy.seer.config import parse_tail_context

PROMPTS = "PROMPTS"  # replaced by a prompts file in the test's directory
OUT = "OUT"  # replaced by a path in the test's directory
# The least each verb with a real-number option needs besides that option (a verb that gains one needs a line here).
BASE_ARGS: dict[str, list[str]] = {
    "generate": ["demo", "-p", "reverse 12"],
    "serve": ["demo"],
    "bench": ["demo", "--out", OUT],
    "calibrate": ["demo", "--prompts", PROMPTS, "--out", OUT],
    "inspect": ["demo", "-p", "reverse 12", "--out", OUT],
    "eval": ["demo", "--tasks", "demo"],
}


def float_options() -> list[tuple[str, str]]:
    """(verb, --option) for every option of every verb that takes a real number."""
    found = []
    for name in VERBS:
        command = cli.get_command(click.Context(cli), name)
        assert command is not None
        for param in command.params:
            if isinstance(param, click.Option) and isinstance(param.type, click.types.FloatParamType):
                found.append((name, max(param.opts, key=len)))
    return found


FLOAT_OPTIONS = float_options()


def test_every_verb_with_a_real_number_option_is_covered() -> None:
    assert {"generate", "serve", "bench", "calibrate"} <= {verb for verb, _ in FLOAT_OPTIONS} <= set(BASE_ARGS)


@pytest.mark.parametrize("value", ["nan", "-inf", "inf"])
@pytest.mark.parametrize(("verb", "option"), FLOAT_OPTIONS, ids=[f"{v} {o}" for v, o in FLOAT_OPTIONS])
def test_nan_and_infinity_are_refused_in_one_line(verb: str, option: str, value: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    guard_heavy_work(monkeypatch)
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("reverse 12\n")
    given = {PROMPTS: str(prompts), OUT: str(tmp_path / "out")}
    argv = [verb, *(given.get(a, a) for a in BASE_ARGS[verb]), option, value]
    code, _, err = run_cli(argv, capsys)
    assert value in assert_one_line_error(code, err).lower()  # refused for the number, not for a missing argument
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("argv", "message"), [
    (["generate", "demo", "-p", "x", "--device", "cuda:\u00b2"], "is not a device"),
    (["generate", "demo", "-p", "x", "--device", "cuda:\u0661"], "is not a device"),
    (["generate", "demo", "-p", "x", "--tail-context", "\u00b2"], "tail_context"),
    (["serve", "demo", "--gen-lengths", "16,\u0663\u0662"], "digits 0-9"),
    (["bench", "demo", "--gen-lengths", "\u00b9\u2076"], "digits 0-9"),
])
def test_digits_of_other_scripts_are_refused_in_one_line(argv: list[str], message: str,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    guard_heavy_work(monkeypatch)
    code, _, err = run_cli(argv, capsys)
    assert_one_line_error(code, err, message)


def test_ascii_int_takes_the_digits_0_to_9_only() -> None:
    assert [ascii_int(t) for t in ("16", " 16 ", "+3", "-2", "007")] == [16, 16, 3, -2, 7]
    assert [ascii_int(t) for t in ("", "+", "1_000", "1.0", "\u00b2", "\u0661\u0666", "1\u0660", "\uff11")] == [None] * 8
    assert ascii_ints("16, 32,,64") == [16, 32, 64] and ascii_ints("16,\u00b2") is None
    assert parse_tail_context(" 12 ") == 12 and parse_tail_context("ALL") == "all"
