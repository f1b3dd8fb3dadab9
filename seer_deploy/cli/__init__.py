"""The `seer-deploy` command line: one module per verb, registered on one click group.

Exit codes: 0 success, 1 an internal error (a bug: rerun with SEER_DEPLOY_DEBUG=1 for the traceback),
2 bad input (arguments, checkpoints, artifacts), each reported as one line naming the problem and the fix.
"""

from __future__ import annotations

import os
import sys

import click

from seer_deploy import __version__
from seer_deploy.core.errors import SeerDeployError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="seer-deploy")
def cli() -> None:
    """Export LLaDA-family diffusion LMs to ONNX / TensorRT and run them fast with Seer.

    \b
    Typical path:
      seer-deploy demo                              # everything on the bundled demo model
      seer-deploy generate demo --prompt "sort 31415"
      seer-deploy export ./LLaDA-8B-Instruct --out ./llada-onnx

    A CHECKPOINT is a local directory (config.json, *.safetensors, tokenizer.json) or the name 'demo'.
    """


def _register() -> None:
    from seer_deploy.cli import bench, build, calibrate, demo, doctor, export, generate, inspection

    for module in (generate, demo, doctor, calibrate, inspection, build, export, bench):
        cli.add_command(module.command)


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors become one line and exit code 2, never a traceback."""
    _register()
    try:
        rc = cli.main(args=argv, prog_name="seer-deploy", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except SeerDeployError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:  # a bug, not bad input
        if os.environ.get("SEER_DEPLOY_DEBUG"):
            raise
        click.echo(f"internal error: {type(exc).__name__}: {exc} (rerun with SEER_DEPLOY_DEBUG=1 for details)", err=True)
        sys.exit(1)
    sys.exit(rc if isinstance(rc, int) else 0)
