"""The `seer-deploy` command line: one module per verb, on one click group that imports a verb only when it is
used (`cli.verbs`), so the group's help starts without torch or ONNX Runtime.

Exit codes: 0 success, 1 an internal error (a bug: rerun with SEER_DEPLOY_DEBUG=1 for the traceback),
2 bad input (arguments, checkpoints, artifacts, files the OS or a library could not read), each reported as one
line on stderr naming the problem and the fix; 130 aborted (Ctrl-C), 128 + N stopped by signal N (temporary
directories removed). Library warnings and logs stay off stderr unless SEER_DEPLOY_DEBUG=1.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import TracebackType

import click

from seer_deploy import __version__
from seer_deploy.cli.verbs import VERBS, LazyGroup
from seer_deploy.core.atomic import cleanup_on_signals
from seer_deploy.core.errors import SeerDeployError
from seer_deploy.core.files import os_error_fix

# Libraries whose exceptions come from what they were asked to read (a damaged graph, image or weights file), with
# what to do about it. Matched against the exception's module and the module of the innermost frame.
LIBRARY_FIXES: dict[str, tuple[str, str]] = {
    "onnxruntime": ("ONNX Runtime", "a graph or its weights may be damaged or incomplete: re-export (or rebuild) it"),
    "onnx": ("ONNX", "the .onnx file may be damaged: re-export it"),
    "google.protobuf": ("ONNX", "the .onnx file may be damaged: re-export it"),
    "PIL": ("Pillow", "the image may be damaged or of an unsupported kind: give a PNG or JPEG"),
    "safetensors": ("safetensors", "the weights file may be damaged: re-download or re-save it"),
}


@click.group(cls=LazyGroup, verbs=VERBS, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
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


def one_line(text: str) -> str:
    """A message on one line: line breaks (from a library's multi-line text) become spaces."""
    return re.sub(r"\s*\n\s*", " ", text).strip()


def _library(exc: BaseException) -> str | None:
    """The LIBRARY_FIXES key of the library that raised `exc`, if any: by the exception's module, else by the
    module of the innermost frame (libraries also raise builtin exceptions from their own code)."""
    tb: TracebackType | None = exc.__traceback__
    inner = None
    while tb is not None:
        inner, tb = tb.tb_frame, tb.tb_next
    modules = [type(exc).__module__, str(inner.f_globals.get("__name__", "")) if inner is not None else ""]
    for module in modules:
        for name in LIBRARY_FIXES:
            if module == name or module.startswith(name + "."):
                return name
    return None


def input_error(exc: Exception) -> str | None:
    """The one-line message for an exception that comes from the input or the environment, not from a bug: the
    OS refusing a file, a library refusing what it was given to read, a file that is not UTF-8, memory running
    out. None for anything else (a bug)."""
    if isinstance(exc, OSError) and exc.errno is not None:  # the OS refused, whoever asked it
        where = f" ({exc.filename})" if exc.filename else ""
        return f"{exc.strerror or exc}{where}; {os_error_fix(exc)}"
    library = _library(exc)
    if library is not None:
        name, fix = LIBRARY_FIXES[library]
        return f"{name} failed: {one_line(str(exc)) or type(exc).__name__}; {fix}"
    if isinstance(exc, UnicodeDecodeError):
        return f"a file is not UTF-8 text ({exc.reason} at byte {exc.start}); save it as UTF-8"
    if isinstance(exc, MemoryError):
        return "out of memory; lower sizes such as --gen-length or --batch-size, or check the model's config.json"
    return None


@contextmanager
def quiet_libraries(debug: bool) -> Iterator[None]:
    """Library warnings and log records (torch, transformers, onnxscript) off stderr for the block, unless debugging:
    a warning line before an error line would break the one-line error surface."""
    if debug:
        yield
        return
    previous = logging.root.manager.disable
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        logging.disable(logging.WARNING)
        try:
            yield
        finally:
            logging.disable(previous)


def _run(argv: list[str] | None, debug: bool) -> int:
    """Run the command line; every failure becomes one line on stderr and an exit code."""
    try:
        rc = cli.main(args=argv, prog_name="seer-deploy", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx is not None else "seer-deploy"
        click.echo(f"error: {one_line(exc.format_message())} (see '{command} --help')", err=True)
        return 2
    except click.ClickException as exc:  # click's file errors and the like: input, not bugs
        click.echo(f"error: {one_line(exc.format_message())}", err=True)
        return 2
    except SeerDeployError as exc:
        click.echo(f"error: {one_line(str(exc))}", err=True)
        return exc.exit_code
    except Exception as exc:
        if debug:
            raise
        message = input_error(exc)
        if message is not None:
            click.echo(f"error: {message}", err=True)
            return 2
        click.echo(f"internal error: {type(exc).__name__}: {one_line(str(exc))} (rerun with SEER_DEPLOY_DEBUG=1 for "
                   "details)", err=True)
        return 1
    return rc if isinstance(rc, int) else 0


def main(argv: list[str] | None = None) -> None:
    """Console entry point: user errors become one line and exit code 2, never a traceback. SIGTERM, SIGHUP and
    SIGINT stop a run through its cleanups, so no temporary directory is left beside an output."""
    debug = bool(os.environ.get("SEER_DEPLOY_DEBUG"))
    with quiet_libraries(debug), cleanup_on_signals():
        code = _run(argv, debug)
    sys.exit(code)
