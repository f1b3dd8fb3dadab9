"""The verbs of `seer-deploy`: for each, the module that defines it and the line `seer-deploy --help` shows.

A verb's module is imported only when that verb is run or asked for its own help, so `seer-deploy --help` (and any
verb that needs neither) starts without loading torch or ONNX Runtime; each verb loads those inside its body.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import click


@dataclass(frozen=True)
class Verb:
    module: str  # defines `command`, a click.Command whose short_help is `summary`
    summary: str


VERBS: dict[str, Verb] = {
    "bench": Verb("seer_deploy.cli.bench", "Benchmark a target: reference, ONNX Runtime and the peers' recipes, "
                                           "with and without Seer."),
    "build": Verb("seer_deploy.cli.build", "Build an engine dir (ONNX Runtime or TensorRT) from an export."),
    "calibrate": Verb("seer_deploy.cli.calibrate", "Calibrate Seer for a target and write its config."),
    "demo": Verb("seer_deploy.cli.demo", "The whole path on the bundled demo model: export, build, answer, compare."),
    "doctor": Verb("seer_deploy.cli.doctor", "Show the loop core, the backends and their versions."),
    "eval": Verb("seer_deploy.cli.eval", "Score a target on lm-evaluation-harness tasks in every mode, side by side "
                                         "with full length."),
    "export": Verb("seer_deploy.cli.export", "Export a checkpoint to ONNX graphs, checked against torch."),
    "generate": Verb("seer_deploy.cli.generate", "Answer prompts with a checkpoint, an export or an engine."),
    "inspect": Verb("seer_deploy.cli.inspection", "Plot a prompt's per-position statistics and detected boundaries."),
    "serve": Verb("seer_deploy.cli.serve", "Serve a target over HTTP (OpenAI's completions and chat)."),
}


def summary(name: str) -> str:
    """The short help of verb `name`, for its `click.command(short_help=...)`: written once, here."""
    return VERBS[name].summary


class LazyGroup(click.Group):
    """A click group whose verbs are imported when resolved, not when the group is built or its help is shown."""

    def __init__(self, *args: Any, verbs: Mapping[str, Verb], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.verbs = dict(verbs)

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *self.verbs})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        command = super().get_command(ctx, cmd_name)  # one added with add_command (tests add some)
        if command is not None or cmd_name not in self.verbs:
            return command
        loaded = getattr(importlib.import_module(self.verbs[cmd_name].module), "command", None)
        if not isinstance(loaded, click.Command):
            raise TypeError(f"{self.verbs[cmd_name].module} defines no click command named 'command'")
        return loaded

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        """The verbs and their summaries, without importing any verb's module."""
        rows = []
        for name in self.list_commands(ctx):
            if name in self.commands:
                command = self.commands[name]
                if not command.hidden:
                    rows.append((name, command.get_short_help_str(formatter.width - 6 - len(name))))
            else:
                rows.append((name, self.verbs[name].summary))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)
