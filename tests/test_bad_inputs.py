"""Bad checkpoints through the real command line, as a hostile or careless user makes them: config.json values of
the wrong type, zero, negative, absurd or not even JSON; indexes whose shards point anywhere; damaged or poisoned
weights; broken tokenizers; plus hypothesis-generated configs. Each must exit 2 with one line naming the problem,
leave nothing behind, open nothing outside the checkpoint and start no heavy work (tests/bad_input_world.py).
Prompts, flags, images, Seer configs and click usage: tests/test_bad_requests.py; exports and engines:
tests/test_bad_artifacts.py."""

from __future__ import annotations

import json
import os
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from bad_input_world import (
    Case,
    Setup,
    World,
    assert_one_line_error,
    check_case,
    edit_json,
    generate,
    params,
    run_cli,
    write_tiny_sources,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return write_tiny_sources(tmp_path_factory.mktemp("sources"))


def config(changes: dict[str, Any] | None = None, drop: tuple[str, ...] = (), raw: bytes | None = None) -> Setup:
    """A checkpoint whose config.json has `changes` (or is `raw` bytes)."""

    def setup(w: World) -> list[str]:
        ckpt = w.copy("ckpt")
        if raw is not None:
            (ckpt / "config.json").write_bytes(raw)
        else:
            edit_json(ckpt / "config.json", changes, drop)
        return generate(ckpt)

    return setup


def sharded(edit: Callable[[World, Path, dict[str, str]], object]) -> Setup:
    """A sharded checkpoint; edit(world, dir, weight_map) may change the shards and the map (written back after)."""

    def setup(w: World) -> list[str]:
        ckpt = w.copy("sharded")
        index = ckpt / "model.safetensors.index.json"
        data = json.loads(index.read_text())
        edit(w, ckpt, data["weight_map"])
        index.write_text(json.dumps(data))
        return generate(ckpt)

    return setup


def first_shard_to(target: Callable[[World, Path], str]) -> Setup:
    """Point the first weight of the index at target(world, checkpoint dir)."""
    return sharded(lambda w, ckpt, wm: wm.__setitem__(next(iter(wm)), target(w, ckpt)))


def link_to_canary(w: World, ckpt: Path) -> str:
    (ckpt / "model-link.safetensors").symlink_to(w.outside / "canary.safetensors")
    return "model-link.safetensors"


def index_file(text: bytes) -> Setup:
    def setup(w: World) -> list[str]:
        ckpt = w.copy("sharded")
        (ckpt / "model.safetensors.index.json").write_bytes(text)
        return generate(ckpt)

    return setup


def weights(edit: Callable[[Path], object]) -> Setup:
    def setup(w: World) -> list[str]:
        ckpt = w.copy("ckpt")
        edit(ckpt / "model.safetensors")
        return generate(ckpt)

    return setup


def retensor(change: Callable[[dict[str, Any]], object]) -> Callable[[Path], None]:
    """Rewrite a safetensors file's tensors through change(tensors)."""
    from safetensors.torch import load_file, save_file

    def edit(file: Path) -> None:
        tensors = load_file(file)
        change(tensors)
        save_file(tensors, file)

    return edit


def poison(value: float) -> Callable[[Path], None]:
    return retensor(lambda t: t["model.transformer.blocks.1.ff_out.weight"].view(-1).__setitem__(5, value))


def tokenizer(raw: bytes | None = None, directory: bool = False) -> Setup:
    def setup(w: World) -> list[str]:
        ckpt = w.copy("ckpt")
        tok = ckpt / "tokenizer.json"
        tok.unlink()
        if directory:
            tok.mkdir()
        elif raw is not None:
            tok.write_bytes(raw)
        return generate(ckpt)

    return setup


DEEP = b"[" * 100_000 + b"]" * 100_000

CONFIG_CASES = [
    Case("n_heads-0", config({"n_heads": 0}), "'n_heads' is 0; it must be an integer from 1"),
    Case("n_heads-fraction", config({"n_heads": 4.5}), "'n_heads' is 4.5; it must be an integer"),
    Case("n_heads-string", config({"n_heads": "4"}), "'n_heads' is '4'"),
    Case("n_heads-bool", config({"n_heads": True}), "'n_heads' is True"),
    Case("n_heads-not-dividing", config({"n_heads": 3}), "'n_heads' is 3; it must be a divisor of the width 32"),
    Case("n_kv_heads-not-dividing", config({"n_kv_heads": 3}), "'n_kv_heads' is 3; it must be a divisor of the 4"),
    Case("n_kv_heads-0", config({"n_kv_heads": 0}), "'n_kv_heads' is 0"),
    Case("head-size-odd", config({"n_heads": 32, "n_kv_heads": 32}), "head size .* is even"),
    Case("n_layers-1e9", config({"n_layers": 1e9}), "'n_layers' is 1000000000.0; it must be an integer from 1 to 1024"),
    Case("n_layers-huge-int", config({"n_layers": 10**12}), "'n_layers' is 1000000000000"),
    Case("n_layers-negative", config({"n_layers": -1}), "'n_layers' is -1"),
    Case("n_layers-0", config({"n_layers": 0}), "'n_layers' is 0"),
    Case("n_layers-3-weights-2", config({"n_layers": 3}), r"missing weights .*blocks\.2\."),
    Case("vocab-negative", config({"vocab_size": -5}), "'vocab_size' is -5"),
    Case("vocab-0", config({"vocab_size": 0}), "'vocab_size' is 0"),
    Case("vocab-float", config({"vocab_size": 1e30}), "'vocab_size' is 1e[+]30"),
    Case("d_model-0", config({"d_model": 0}), "'d_model' is 0"),
    Case("d_model-huge", config({"d_model": 2**40}), "'d_model' is 1099511627776"),
    Case("mlp-0", config({"mlp_hidden_size": 0}), "'mlp_hidden_size' is 0"),
    Case("mlp-null", config({"mlp_hidden_size": None}), "missing 'mlp_hidden_size'"),
    Case("positions-1", config({"max_sequence_length": 1}), "'max_sequence_length' is 1"),
    Case("positions-string", config({"max_sequence_length": "long"}), "'max_sequence_length' is 'long'"),
    Case("rms-eps-negative", config({"rms_norm_eps": -1}), "'rms_norm_eps' is -1; it must be a finite number above 0"),
    Case("rms-eps-0", config({"rms_norm_eps": 0}), "'rms_norm_eps' is 0"),
    Case("rms-eps-nan", config({"rms_norm_eps": float("nan")}), "not valid JSON .*NaN"),
    Case("rope-theta-negative", config({"rope_theta": -10000.0}), "'rope_theta' is -10000.0"),
    Case("rope-theta-infinity", config({"rope_theta": float("inf")}), "not valid JSON .*Infinity"),
    Case("weight-tying-string", config({"weight_tying": "false"}), "'weight_tying' is 'false'; it must be true or"),
    Case("eos-negative", config({"eos_token_id": -1}), "'eos_token_id' is -1; it must be a token id from 0 to 18"),
    Case("eos-at-vocab", config({"eos_token_id": 19}), "'eos_token_id' is 19"),
    Case("mask-beyond-vocab", config({"mask_token_id": 1000}), "'mask_token_id' is 1000"),
    Case("pad-fraction", config({"pad_token_id": 2.5}), "'pad_token_id' is 2.5"),
    Case("bos-string", config({"bos_token_id": "10"}), "'bos_token_id' is '10'"),
    Case("eos-list-of-string", config({"eos_token_id": ["x"]}), "'eos_token_id' is 'x'"),
    Case("embedding-below-vocab", config({"embedding_size": 5}), "'embedding_size' is 5"),
    Case("include-bias", config({"include_bias": True}), "include_bias=True is not supported"),
    Case("activation-gelu", config({"activation_type": "gelu"}), "activation_type 'gelu' is not supported"),
    Case("block-type", config({"block_type": "sequential"}), "block_type 'sequential' is not supported"),
    Case("missing-d_model", config(drop=("d_model",)), "neither LLaDA fields .* nor Llama-style"),
    Case("missing-n_layers", config(drop=("n_layers",)), "missing 'n_layers'"),
    Case("config-not-json", config(raw=b"{d_model: 32"), r"config.json is not valid JSON \(line 1 column 2"),
    Case("config-not-utf8", config(raw=b'{"d_model": "\xff"}'), r"config.json is not UTF-8 text \(byte 0xff"),
    Case("config-utf16", config(raw='{"d_model": 32}'.encode("utf-16")), "config.json is not UTF-8 text"),
    Case("config-array", config(raw=b"[1, 2]"), "config.json holds an array, not an object"),
    Case("config-null", config(raw=b"null"), "config.json holds null, not an object"),
    Case("config-empty", config(raw=b""), r"config.json is not valid JSON \(line 1 column 1"),
    Case("config-deep", config(raw=DEEP), "config.json is nested too deeply"),
    Case("config-family-unknown", config(raw=b'{"n_embd": 32}'), "unknown model family"),
]


def _config_dir(w: World) -> list[str]:
    ckpt = w.copy("ckpt")
    (ckpt / "config.json").unlink()
    (ckpt / "config.json").mkdir()
    return generate(ckpt)


def _config_device(w: World) -> list[str]:
    ckpt = w.copy("ckpt")
    (ckpt / "config.json").unlink()
    (ckpt / "config.json").symlink_to("/dev/zero")
    return generate(ckpt)


def _config_missing(w: World) -> list[str]:
    ckpt = w.copy("ckpt")
    (ckpt / "config.json").unlink()
    return generate(ckpt)


CONFIG_CASES += [
    Case("config-a-directory", _config_dir, "holds no engine.json .* or config.json"),
    Case("config-a-device", _config_device, "holds no engine.json .* or config.json"),
    Case("config-missing", _config_missing, "config.json"),
]

def _misplace(w: World, ckpt: Path, weight_map: dict[str, str]) -> None:
    name = "model.transformer.ln_f.weight"
    weight_map[name] = next(shard for shard in sorted(set(weight_map.values())) if shard != weight_map[name])


def _truncate(file: Path, n: int) -> None:
    file.write_bytes(file.read_bytes()[:-n])


def _header_only(file: Path, header: dict[str, Any]) -> None:
    text = json.dumps(header).encode()
    file.write_bytes(struct.pack("<Q", len(text)) + text)


WEIGHT_CASES = [
    Case("shard-parent", first_shard_to(lambda w, c: "../outside/canary.safetensors"), "resolves to .*, outside"),
    Case("shard-absolute", first_shard_to(lambda w, c: str(w.outside / "canary.safetensors")), "is an absolute path"),
    Case("shard-etc-passwd", first_shard_to(lambda w, c: "/etc/passwd"), "'/etc/passwd' is an absolute path"),
    Case("shard-home", first_shard_to(lambda w, c: "~/model.safetensors"), "is an absolute path"),
    Case("shard-symlink-out", first_shard_to(link_to_canary), "'model-link.safetensors' resolves to .*outside"),
    Case("shard-dot-dot-inside", first_shard_to(lambda w, c: "sub/../../outside/canary.safetensors"), "outside"),
    Case("shard-the-dir-itself", first_shard_to(lambda w, c: "."), "resolves to .*, outside"),
    Case("shard-empty-name", first_shard_to(lambda w, c: ""), "'' is not a file name"),
    Case("shard-number", sharded(lambda w, c, wm: wm.__setitem__(next(iter(wm)), 5)), "shard 5 is not a file name"),
    Case("shard-missing", sharded(lambda w, c, wm: next(c.glob("model-00002-*")).unlink()),
         "shard model-00002.* missing"),
    Case("shard-truncated", sharded(lambda w, c, wm: _truncate(next(c.glob("model-00002-*")), 4)),
         "model-00002.* not a readable safetensors file .*header describes"),
    Case("shard-misplaced-weight", sharded(_misplace), r"places weight model.transformer.ln_f.weight in model-\d+"),
    Case("index-no-weight-map", index_file(b'{"metadata": {}}'), "needs a non-empty 'weight_map'"),
    Case("index-empty-map", index_file(b'{"weight_map": {}}'), "needs a non-empty 'weight_map'"),
    Case("index-map-list", index_file(b'{"weight_map": ["a"]}'), "needs a non-empty 'weight_map'"),
    Case("index-not-utf8", index_file(b'{"weight_map": {"\xfe": "x"}}'), r"index.json is not UTF-8 text"),
    Case("index-not-json", index_file(b"weight_map"), r"index.json is not valid JSON"),
    Case("index-array", index_file(b"[]"), "index.json holds an array"),
    Case("weights-truncated", weights(lambda f: _truncate(f, 100)), "not a readable safetensors file"),
    Case("weights-empty", weights(lambda f: f.write_bytes(b"")), r"not a readable safetensors file \(0 bytes"),
    Case("weights-huge-header", weights(lambda f: f.write_bytes(struct.pack("<Q", 2**60) + b"{}")),
         "not a readable safetensors file .*header length 1152921504606846976"),
    Case("weights-header-not-json", weights(lambda f: f.write_bytes(struct.pack("<Q", 4) + b"abcd")),
         "its header is not JSON"),
    Case("weights-offsets-beyond", weights(lambda f: _header_only(f, {"x": {"dtype": "F32", "shape": [4],
                                                                            "data_offsets": [0, 16]}})),
         "header describes"),
    Case("weights-shape-mismatch", weights(lambda f: _header_only(f, {"x": {"dtype": "F32", "shape": [5],
                                                                            "data_offsets": [0, 0]}})),
         r"tensor 'x' \(F32 \[5\]\) does not fill its 0 bytes"),
    Case("weights-nan", weights(poison(float("nan"))), "ff_out.weight holds NaN or infinite values"),
    Case("weights-inf", weights(poison(float("inf"))), "holds NaN or infinite values"),
    Case("weights-missing-one", weights(retensor(lambda t: t.pop("model.transformer.blocks.0.q_proj.weight"))),
         r"missing weights .*blocks\.0\.q_proj"),
    Case("weights-unexpected", weights(retensor(lambda t: t.__setitem__("model.transformer.extra",
                                                                        t["model.transformer.ln_f.weight"].clone()))),
         "unexpected weights .*model.transformer.extra"),
    Case("weights-wrong-shape", weights(retensor(lambda t: t.__setitem__("model.transformer.ln_f.weight",
                                                                         t["model.transformer.ln_f.weight"][:3]))),
         r"ln_f.weight has shape \(3,\)"),
    Case("weights-none", weights(lambda f: f.unlink()), "no weights in"),
    Case("weights-pickle", weights(lambda f: (f.unlink(), f.with_name("pytorch_model.bin").write_bytes(b"x"))),
         "safe_serialization"),
    Case("tokenizer-not-utf8", tokenizer(b'{"model": "\xc3"}'), r"tokenizer.json is not UTF-8 text \(byte 0xc3"),
    Case("tokenizer-not-json", tokenizer(b"{version"), "tokenizer.json is not a readable tokenizer.json"),
    Case("tokenizer-empty-object", tokenizer(b"{}"), "is not a readable tokenizer.json"),
    Case("tokenizer-a-directory", tokenizer(directory=True), "tokenizer.json"),
    Case("tokenizer-missing", tokenizer(), "tokenizer.json"),
]


ALL_CASES = CONFIG_CASES + WEIGHT_CASES


@pytest.mark.parametrize("case", params(ALL_CASES))
def test_bad_input(case: Case, tmp_path: Path, sources: dict[str, Path], capsys: pytest.CaptureFixture[str],
                   monkeypatch: pytest.MonkeyPatch) -> None:
    check_case(case, World(tmp_path, sources), capsys, monkeypatch)


def test_the_table_is_large_enough() -> None:
    assert len(ALL_CASES) >= 80


JSON_VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**62), 2**62), st.integers(-3, 40),
    st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=4), st.lists(st.integers(-2, 20), max_size=2),
    st.dictionaries(st.text(max_size=3), st.integers(0, 3), max_size=2),
)
CONFIG_KEYS = ["d_model", "n_layers", "n_heads", "n_kv_heads", "mlp_hidden_size", "vocab_size", "embedding_size",
               "max_sequence_length", "rope_theta", "rms_norm_eps", "weight_tying", "mask_token_id", "eos_token_id",
               "pad_token_id", "bos_token_id", "activation_type", "include_bias", "block_type"]


@settings(max_examples=50, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.dictionaries(st.sampled_from(CONFIG_KEYS), JSON_VALUES, min_size=1, max_size=3),
       drops=st.sets(st.sampled_from(CONFIG_KEYS), max_size=2))
def test_generated_configs_load_or_fail_in_one_line(sources: dict[str, Path], capsys: pytest.CaptureFixture[str],
                                                    changes: dict[str, Any], drops: set[str]) -> None:
    os.environ.pop("SEER_DEPLOY_DEBUG", None)
    with tempfile.TemporaryDirectory() as tmp:
        world = World(Path(tmp), sources)
        ckpt = world.copy("ckpt")
        edit_json(ckpt / "config.json", changes, tuple(k for k in drops if k not in changes))
        code, _, err = run_cli(generate(ckpt), capsys)
    if code != 0:
        assert_one_line_error(code, err)
