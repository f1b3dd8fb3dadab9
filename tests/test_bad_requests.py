"""Bad requests through the real command line, as a hostile or careless user types them: prompts (empty, not text,
special-token text), prompts files, generation flags (NaN, zero, negative, absurd), images (missing, damaged,
decompression bombs), Seer configs and click usage. Each must exit 2 with one line naming the problem, leave nothing
behind and start no heavy work (tests/bad_input_world.py)."""

from __future__ import annotations

import errno
import logging
import re
import struct
import warnings
import zlib
from collections.abc import Callable
from pathlib import Path

import click
import pytest
from bad_input_world import Case, Setup, World, argv, check_case, generate, params, run_cli, write_tiny_sources
from PIL import Image

from seer_deploy.cli import cli
from seer_deploy.core.errors import ConfigError


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_tiny_sources(tmp_path_factory.mktemp("sources"))


def flags(*extra: str, prompt: str = "reverse 1") -> Setup:
    return lambda w: generate(w.copy("ckpt"), *extra, prompt=prompt)


def prompts_file(content: bytes) -> Setup:
    def setup(w: World) -> list[str]:
        (w.root / "prompts.jsonl").write_bytes(content)
        return ["generate", str(w.copy("ckpt")), "--prompts", str(w.root / "prompts.jsonl"), "--gen-length", "4"]

    return setup


def png(width: int, height: int, claim: tuple[int, int] | None = None, mode: str = "RGB") -> Callable[[Path], None]:
    """A PNG; `claim` rewrites its header to declare another size (a decompression bomb)."""

    def write(path: Path) -> None:
        Image.new(mode, (width, height)).save(path)
        if claim is not None:
            data = bytearray(path.read_bytes())
            data[16:24] = struct.pack(">II", *claim)
            data[29:33] = struct.pack(">I", zlib.crc32(bytes(data[12:29])))
            path.write_bytes(bytes(data))

    return write


def image(write: Callable[[Path], object], name: str = "picture.png") -> Setup:
    def setup(w: World) -> list[str]:
        write(w.root / name)
        return ["generate", "demo-vl", "--image", str(w.root / name), "-p", "<image> describe", "--gen-length", "8"]

    return setup


def truncated_png(path: Path) -> None:
    png(64, 64)(path)
    path.write_bytes(path.read_bytes()[:70])


def seer_config(text: bytes) -> Setup:
    def setup(w: World) -> list[str]:
        (w.root / "seer.json").write_bytes(text)
        return generate(w.copy("ckpt"), "--seer-config", str(w.root / "seer.json"))

    return setup



PROMPT_CASES = [
    Case("prompt-empty", flags(prompt=""), "the prompt is empty"),
    Case("prompt-whitespace", flags(prompt=" \t "), "the prompt is empty"),
    Case("prompt-mask-token", flags(prompt="reverse <|mdm_mask|>"), r"'<\|mdm_mask\|>', the model's mask token"),
    Case("prompt-eos-token", flags(prompt="<|endoftext|>"), "eos token"),
    Case("prompt-bos-token", flags(prompt="<|startoftext|>sort 1"), "bos token"),
    Case("prompt-eot-token", flags(prompt="count 1<|eot_id|>"), "eot token"),
    Case("prompt-header-token", flags(prompt="<|start_header_id|>x"), "chat-template header token"),
    Case("prompt-too-long", flags(prompt="reverse " + "1" * 200), "exceeds the model's 128 positions"),
    Case("prompts-null", prompts_file(b'{"prompt": null}\n'), r"prompts.jsonl:1 is null, not text"),
    Case("prompts-object", prompts_file(b'{"prompt": {"text": "x"}}\n'), r"prompts.jsonl:1 is an object, not text"),
    Case("prompts-number", prompts_file(b'{"prompt": 5}\n'), r"prompts.jsonl:1 is a number"),
    Case("prompts-empty-string", prompts_file(b'{"prompt": ""}\n'), r"prompts.jsonl:1 is empty"),
    Case("prompts-whitespace", prompts_file(b'{"prompt": "  "}\n'), "is empty"),
    Case("prompts-mask", prompts_file(b'{"prompt": "sort <|mdm_mask|>"}\n'), "mask token"),
    Case("prompts-mask-plain-line", prompts_file(b"reverse 1\nsort <|mdm_mask|>\n"), r"prompts.jsonl:2 contains"),
    Case("prompts-no-field", prompts_file(b'{"text": "x"}\n'), r"prompts.jsonl:1: expected"),
    Case("prompts-bad-json", prompts_file(b'{"prompt": \n'), r"prompts.jsonl:1: expected"),
    Case("prompts-json-array-object", prompts_file(b'{"prompt": ["a"]}\n'), "is a list, not text"),
    Case("prompts-not-utf8", prompts_file(b"reverse \xff1\n"), r"prompts.jsonl is not UTF-8 text"),
    Case("prompts-empty-file", prompts_file(b""), "no prompt"),
    Case("prompts-blank-lines", prompts_file(b"\n \n\t\n"), "no prompt"),
    Case("prompts-a-directory", argv("generate", "demo", "--prompts", "{root}"), "is a directory"),
    Case("prompts-missing", argv("generate", "demo", "--prompts", "{root}/nope.jsonl"), "does not exist"),
]

FLAG_CASES = [
    Case("temperature-nan", flags("--temperature", "nan"), "temperature is nan; it must be a finite number"),
    Case("temperature-inf", flags("--temperature", "inf"), "temperature is inf"),
    Case("temperature-overflow", flags("--temperature", "1e400"), "temperature is inf"),
    Case("temperature-negative", flags("--temperature", "-1"), "temperature is -1.0"),
    Case("temperature-word", flags("--temperature", "warm"), "'warm' is not a valid float"),
    Case("cfg-nan", flags("--cfg-scale", "nan"), r"cfg_scale is nan; .*\(--cfg-scale\)"),
    Case("cfg-negative", flags("--cfg-scale", "-0.5"), "cfg_scale is -0.5"),
    Case("cfg-inf", flags("--cfg-scale", "inf"), "cfg_scale is inf"),
    Case("steps-0", flags("--steps", "0"), r"steps is 0; it must be an integer from 1 .*\(--steps\)"),
    Case("steps-negative", flags("--steps", "-4"), "steps is -4"),
    Case("steps-fraction", flags("--steps", "1.5"), "'1.5' is not a valid integer"),
    Case("block-0", flags("--block-length", "0"), r"block_length is 0; .*\(--block-length\)"),
    Case("block-negative", flags("--block-length", "-2"), "block_length is -2"),
    Case("gen-length-0", flags("--gen-length", "0"), r"gen_length is 0; .*\(--gen-length\)"),
    Case("gen-length-negative", flags("--gen-length", "-8"), "gen_length is -8"),
    Case("gen-length-absurd", flags("--gen-length", "99999999999"), "gen_length is 99999999999"),
    Case("gen-length-too-long", flags("--gen-length", "200"), "exceeds the model's 128 positions"),
    Case("block-not-dividing", flags("--gen-length", "6", "--block-length", "4"), "not a multiple of block_length 4"),
    Case("steps-uneven", flags("--gen-length", "8", "--block-length", "4", "--steps", "3"), "cannot be split evenly"),
    Case("seed-negative", flags("--seed", "-1"), r"'--seed': -1 is not in the range 0<=x"),
    Case("remasking-unknown", flags("--remasking", "greedy"), "'greedy' is not one of"),
    Case("batch-size-0", flags("--batch-size", "0"), "batch.size"),
    Case("tail-context-negative", flags("--tail-context", "-1"), "tail"),
    Case("tail-context-word", flags("--tail-context", "most"), "tail"),
    Case("threads-negative", flags("--threads", "-3"), "threads"),
    Case("backend-unknown", flags("--backend", "cuda"), "'cuda' is not one of"),
]

USAGE_CASES = [
    Case("usage-unknown-option", argv("generate", "demo", "--stepz", "3"), r"No such option '--stepz'.* --help"),
    Case("usage-missing-target", argv("generate"), r"Missing argument 'TARGET'. \(see 'seer-deploy generate --help'\)"),
    Case("usage-unknown-verb", argv("genrate", "demo"), r"No such command 'genrate'"),
    Case("usage-extra-argument", argv("generate", "demo", "extra", "-p", "x"), "unexpected extra argument"),
    Case("usage-option-without-value", argv("generate", "demo", "-p"), "'-p' requires an argument"),
    Case("usage-export-without-out", argv("export", "demo"), "Missing option '--out'"),
    Case("usage-build-without-export", argv("build", "--out", "{root}/engine"), "Missing argument"),
    Case("usage-dtype-unknown", argv("export", "demo", "--out", "{root}/x", "--dtype", "int4"), "'int4' is not one of"),
    Case("target-missing", argv("generate", "{root}/nowhere", "-p", "x"), "does not exist"),
    Case("target-empty-dir", argv("generate", "{root}", "-p", "x"), "no engine.json|holds no"),
    Case("no-prompt", lambda w: ["generate", str(w.copy("ckpt"))], "no prompt given"),
]

IMAGE_CASES = [
    Case("image-missing", argv("generate", "demo-vl", "--image", "{root}/no.png", "-p", "<image> describe"),
         "no.png' does not exist"),
    Case("image-a-directory", argv("generate", "demo-vl", "--image", "{root}", "-p", "<image> describe"),
         "is not a file"),
    Case("image-not-an-image", image(lambda p: p.write_text("a picture of a cat")), "not a readable image"),
    Case("image-truncated", image(truncated_png), "could not be read|not a readable image"),
    Case("image-bomb-past-pillow", image(png(8, 8, claim=(100_000, 100_000))), "larger than the 67108864 pixels"),
    Case("image-bomb-under-pillow", image(png(8, 8, claim=(9000, 9000))), r"\(9000 x 9000 pixels\)"),
    Case("image-16-bit", image(png(4, 4, mode="I;16")), "mode 'I;16'.*not supported"),
    Case("image-count-mismatch", argv("generate", "demo-vl", "-p", "<image> <image> describe", "--image",
                                      "{root}/outside/x.png"), "placeholder"),
    Case("image-for-a-text-model", lambda w: (png(8, 8)(w.root / "p.png"), generate(w.copy("ckpt"), "--image",
                                              str(w.root / "p.png"), prompt="<image> x"))[1], "text model|placeholder"),
]

SEER_CASES = [
    Case("seer-not-utf8", seer_config(b'{"detector": "\xff"}'), r"seer.json is not UTF-8 text"),
    Case("seer-not-json", seer_config(b"{detector"), "seer.json is not valid JSON"),
    Case("seer-nan", seer_config(b'{"margin": NaN}'), "seer.json is not valid JSON .*NaN"),
    Case("seer-detector", seer_config(b'{"detector": "magic"}'), "detector"),
    Case("seer-margin-negative", seer_config(b'{"margin": -4}'), "margin"),
    Case("seer-margin-fraction", seer_config(b'{"margin": 2.5}'), "margin"),
    Case("seer-threshold-negative", seer_config(b'{"abs_threshold": -1}'), "abs_threshold"),
    Case("seer-tail-context", seer_config(b'{"tail_context": "most"}'), "tail_context"),
    Case("seer-array", seer_config(b"[]"), "seer.json holds an array"),
]

ALL_CASES = PROMPT_CASES + FLAG_CASES + USAGE_CASES + IMAGE_CASES + SEER_CASES


@pytest.mark.parametrize("case", params(ALL_CASES))
def test_bad_request(case: Case, tmp_path: Path, sources: dict[str, Path],
                     capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    check_case(case, World(tmp_path, sources), capsys, monkeypatch)


def test_the_table_is_large_enough() -> None:
    assert len(ALL_CASES) >= 60


# --- the error surface: what the CLI makes of exceptions from the OS and libraries -------------------------------


def _raise_onnxruntime() -> None:
    import onnxruntime

    onnxruntime.InferenceSession(b"not a graph")


def _raise_safetensors(tmp: Path) -> None:
    from safetensors import safe_open

    (tmp / "w.safetensors").write_bytes(b"\x00" * 16)
    with safe_open(str(tmp / "w.safetensors"), framework="pt"):
        pass


@pytest.mark.parametrize(
    "fail, code, message",
    [
        (lambda tmp: (_ for _ in ()).throw(OSError(errno.EROFS, "Read-only file system", str(tmp / "out"))), 2,
         r"error: Read-only file system \(.*out\); the file system is read-only: choose a writable location"),
        (lambda tmp: (tmp / "missing" / "x").write_text("x"), 2, r"error: No such file or directory \(.*x\); check"),
        (lambda tmp: tmp.write_text("x"), 2, r"error: Is a directory \(.*\); give a file, not a directory"),
        (lambda tmp: _raise_onnxruntime(), 2, "error: ONNX Runtime failed: .*re-export"),
        (lambda tmp: _raise_safetensors(tmp), 2, "error: safetensors failed: .*re-download or re-save"),
        (lambda tmp: Image.open(tmp / "none.png"), 2, "error: No such file or directory"),
        (lambda tmp: b"\xff".decode(), 2, "error: a file is not UTF-8 text"),
        (lambda tmp: {}["key"], 1, r"internal error: KeyError: 'key' \(rerun with SEER_DEPLOY_DEBUG=1"),
        (lambda tmp: (_ for _ in ()).throw(ConfigError("first line\n  second line")), 2,
         "error: first line second line$"),
    ],
)
def test_exceptions_become_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                    monkeypatch: pytest.MonkeyPatch, fail: Callable[[Path], object], code: int,
                                    message: str) -> None:
    monkeypatch.delenv("SEER_DEPLOY_DEBUG", raising=False)
    monkeypatch.setitem(cli.commands, "boom", click.Command("boom", callback=lambda: fail(tmp_path)))
    got, _, err = run_cli(["boom"], capsys)
    assert got == code and len(err.strip().splitlines()) == 1 and re.search(message, err.strip()), err


def _noisy() -> None:
    warnings.warn("torch says something", UserWarning, stacklevel=1)
    logging.getLogger("transformers").warning("transformers says something")
    raise ConfigError("the real problem")


def test_library_warnings_stay_off_stderr_unless_debugging(capsys: pytest.CaptureFixture[str],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(cli.commands, "noisy", click.Command("noisy", callback=_noisy))
    monkeypatch.delenv("SEER_DEPLOY_DEBUG", raising=False)
    with warnings.catch_warnings(record=True) as shown:
        warnings.simplefilter("always")
        code, _, err = run_cli(["noisy"], capsys)
    assert code == 2 and err == "error: the real problem\n" and shown == []
    monkeypatch.setenv("SEER_DEPLOY_DEBUG", "1")
    with pytest.warns(UserWarning, match="torch says something"):
        code, _, err = run_cli(["noisy"], capsys)
    assert code == 2 and err.endswith("error: the real problem\n")
