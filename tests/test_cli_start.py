"""The command line starts without torch or ONNX Runtime: the group's help, each verb's help and `doctor` run in a
fresh interpreter leave neither in sys.modules (a verb loads them in its body, when it runs), and the group's help
imports no verb at all."""

from __future__ import annotations

import json
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from seer_deploy.cli import cli
from seer_deploy.cli.verbs import VERBS

HEAVY = ("torch", "onnxruntime")

CLI_THEN_MODULES = """
import json, sys
from seer_deploy.cli import main
code = 0
try:
    main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps({"rc": code, "modules": sorted(sys.modules)}), file=sys.stderr)
"""


def modules_after(args: list[str]) -> tuple[int, str, set[str]]:
    """(exit code, stdout, every module loaded) of `seer-deploy ARGS` in a fresh interpreter."""
    done = subprocess.run([sys.executable, "-c", CLI_THEN_MODULES, *args], capture_output=True, text=True, timeout=300,
                          check=False)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stderr.strip().splitlines()[-1])
    return int(report["rc"] or 0), done.stdout, set(report["modules"])


def test_group_help_imports_no_verb_and_neither_library() -> None:
    code, stdout, modules = modules_after(["--help"])
    assert code == 0
    assert not modules & set(HEAVY)
    assert not {module for module in modules if module.startswith("seer_deploy.cli.")} - {"seer_deploy.cli.verbs"}
    for name, verb in VERBS.items():
        assert f"{name} " in stdout and verb.summary.split()[0] in stdout


@pytest.mark.parametrize("args", [[name, "--help"] for name in VERBS] + [["doctor"], ["doctor", "--json"]],
                         ids=lambda args: " ".join(args))
def test_a_verb_help_and_doctor_import_neither_library(args: list[str]) -> None:
    code, stdout, modules = modules_after(args)
    assert code == 0 and stdout
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))
    assert VERBS[args[0]].module in modules  # the verb itself was loaded to answer


def test_each_verb_shows_the_summary_listed_for_it() -> None:
    """The group lists a verb by the summary in `cli.verbs` without loading it: the verb's own short help must be
    that same line."""
    for name, verb in VERBS.items():
        command = cli.get_command(click.Context(cli), name)
        assert command is not None and command.name == name and command.short_help == verb.summary


def test_an_unknown_verb_is_a_usage_error() -> None:
    result = CliRunner().invoke(cli, ["frobnicate"])
    assert result.exit_code == 2 and "No such command 'frobnicate'" in result.output
