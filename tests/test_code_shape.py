"""The code's shape (issue 43's acceptance): no function outside the click commands takes more than 8 parameters, and
no click command declares an option that a shared option group (`cli.options`) already declares.

Each check is a function run on the real code and, to show it can fail, on a throwaway offender."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from seer_deploy.cli import cli
from seer_deploy.cli.options import GROUPS, GroupOption, generation_options, seer_options, target_options
from seer_deploy.cli.verbs import VERBS
from seer_deploy.runtime.targets import TargetOptions

PACKAGE = Path(__file__).resolve().parents[1] / "seer_deploy"
MAX_PARAMETERS = 8


def is_click_command(node: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Decorated by click as a command or group (`@click.command(...)`, `@click.group(...)`, `@cli.command()`)."""
    for decorator in node.decorator_list:
        target = decorator.func if isinstance(decorator, ast.Call) else decorator
        if isinstance(target, ast.Attribute) and target.attr in ("command", "group"):
            return True
    return False


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Every parameter a caller may give (positional, keyword-only, *args, **kwargs), self and cls not counted."""
    args = node.args
    names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return len([n for n in names if n not in ("self", "cls")])


def traced_forwards(tree: ast.AST) -> set[ast.AST]:
    """The `forward` of each module traced into an ONNX graph (a class whose docstring or bases name a graph: in
    export/graphs.py every module is one): it takes one parameter per graph input, the graph's declared interface
    (contracts.graphs), so its width is the graph's, not a design choice."""
    return {item for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
            for item in node.body if isinstance(item, ast.FunctionDef) and item.name == "forward"}


def wide_functions(source: str, where: str) -> list[str]:
    """'where:line name (N parameters)' for each function in `source` outside the click commands (and, in
    export/graphs.py, the traced modules' forwards) taking more than MAX_PARAMETERS."""
    tree = ast.parse(source)
    exempt = traced_forwards(tree) if where.endswith("export/graphs.py") else set()
    return [f"{where}:{node.lineno} {node.name} ({parameter_count(node)} parameters)"
            for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node not in exempt
            and not is_click_command(node) and parameter_count(node) > MAX_PARAMETERS]


def group_option_names() -> dict[str, str]:
    """Each flag a shared group declares -> the group's name."""
    return {name: group.name for group in GROUPS for name in group.option_names}


def redeclared_options(command: click.Command, path: str) -> list[str]:
    """'path: --flag (group)' for each option `command` (and its subcommands) declares itself although a shared
    group declares it."""
    declared = group_option_names()
    found = [f"{path}: {flag} (the {declared[flag]} group's)"
             for param in command.params if isinstance(param, click.Option) and not isinstance(param, GroupOption)
             for flag in (*param.opts, *param.secondary_opts) if flag in declared]
    if isinstance(command, click.Group):
        context = click.Context(command)
        for name in command.list_commands(context):
            sub = command.get_command(context, name)
            if sub is not None:
                found += redeclared_options(sub, f"{path} {name}")
    return found


def test_no_function_outside_the_click_commands_takes_more_than_8_parameters() -> None:
    offenders = [hit for file in sorted(PACKAGE.rglob("*.py"))
                 for hit in wide_functions(file.read_text(), str(file.relative_to(PACKAGE.parent)))]
    assert not offenders, "give these a few typed objects instead of many scalars:\n" + "\n".join(offenders)


def test_the_parameter_check_finds_a_wide_function_and_spares_click_commands() -> None:
    nine = ", ".join(f"a{i}" for i in range(9))
    source = (f"import click\n\ndef wide({nine}): ...\n\nclass K:\n    def method(self, {nine[:-4]}): ...\n\n"
              f"@click.command()\ndef command({nine}): ...\n\ndef narrow(*args, **kwargs): ...\n")
    assert wide_functions(source, "x.py") == ["x.py:3 wide (9 parameters)"]  # the method has 8 besides self


def test_no_click_command_declares_an_option_a_shared_group_declares() -> None:
    assert set(cli.list_commands(click.Context(cli))) >= set(VERBS)  # every verb is walked, imported lazily
    offenders = redeclared_options(cli, "seer-deploy")
    assert not offenders, "use the shared option group (cli/options.py) instead:\n" + "\n".join(offenders)


def test_the_option_check_finds_a_verb_declaring_a_groups_flag() -> None:
    @click.command()
    @target_options("backend")
    @click.option("--threads", type=int)
    @click.option("--no-seer", is_flag=True)  # one side of the Seer group's --seer/--no-seer
    def throwaway(target_options: TargetOptions, threads: int | None, no_seer: bool) -> None: ...

    group = click.Group("throwaway-cli", commands={"throwaway": throwaway})
    assert redeclared_options(group, "throwaway-cli") == [
        "throwaway-cli throwaway: --threads (the target_options group's)",
        "throwaway-cli throwaway: --no-seer (the seer group's)",
    ]


def test_a_group_hands_one_typed_object_with_a_verbs_own_defaults_and_help() -> None:
    """Flags a verb leaves out take the group's defaults; a verb's override changes only that verb's flag."""
    seen: list[object] = []

    @click.command()
    @target_options("threads", "device", threads={"default": 0, "help": "Only here."})
    @generation_options("gen_length", "steps")
    def throwaway(target_options: TargetOptions, generation: object) -> None:
        seen.extend([target_options, generation])

    runner = CliRunner()
    result = runner.invoke(throwaway, ["--device", "cpu", "--gen-length", "16"])
    assert result.exit_code == 0, result.output
    target, generation = seen
    assert target == TargetOptions(threads=0, device="cpu")
    assert (generation.gen_length, generation.steps, generation.threshold) == (16, 16, 0.9)  # type: ignore[attr-defined]
    shown = runner.invoke(throwaway, ["--help"]).output
    assert "Only here." in shown and "--backend" not in shown and "--decode" not in shown
    other = runner.invoke(click.command()(target_options("threads")(lambda target_options: None)), ["--help"])
    assert "Only here." not in other.output and "Intra-op threads" in other.output
    with pytest.raises(ValueError, match="has no flag 'thread'"):
        target_options("thread")
    bad = runner.invoke(throwaway, ["--device", "gpu"])
    assert bad.exit_code != 0 and "--device 'gpu' is not a device" in str(bad.exception)


def test_a_group_flag_means_the_same_in_every_verb() -> None:
    """The Seer and target flags every verb takes come from the groups: one declaration each."""
    context = click.Context(cli)
    for name in VERBS:
        command = cli.get_command(context, name)
        assert command is not None
        for param in command.params:
            if isinstance(param, GroupOption):
                assert param.group in {group.name for group in GROUPS}
    serve, generate = (cli.get_command(context, name) for name in ("serve", "generate"))
    assert serve is not None and generate is not None
    flags = {p.opts[0] for p in generate.params if isinstance(p, GroupOption) and p.group == seer_options.name}
    assert flags == {"--seer", "--seer-config", "--tail-context", "--first-canvas"}
    assert flags <= {p.opts[0] for p in serve.params if isinstance(p, GroupOption)}


def test_the_option_groups_load_no_library() -> None:
    """Every verb imports the groups to declare its options, so `--help` stays instant: no numpy, torch or ONNX
    Runtime behind them (the objects they build are imported when a command runs)."""
    probe = "import sys, seer_deploy.cli.options; print(sorted({'numpy', 'torch', 'onnxruntime'} & set(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "[]", done.stdout
