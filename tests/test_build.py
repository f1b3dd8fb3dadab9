"""`seer-deploy build` / `build_engines` on a small export dir made here (onnx.helper graphs + a real manifest), and
on one real export with the KV cache graphs (an ORT engine dir runs them as its export does)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from conftest import tiny_config, tiny_model
from onnx import TensorProto, helper

from seer_deploy.cli import main
from seer_deploy.contracts import sampling
from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.graph_calls import scoring_feed
from seer_deploy.contracts.manifest_sections import GraphRecord, ModelSpec, TensorSpec, WeightsSpec
from seer_deploy.core.atomic import claim
from seer_deploy.core.backend import StepInput, WindowInput, supports_cache
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.engines import tensorrt_library
from seer_deploy.engines.buckets import power_of_two_buckets
from seer_deploy.engines.build import BuildOptions, build_engines, file_sha256, parse_size
from seer_deploy.engines.manifest import MANIFEST_FILE, EngineManifest, RuntimeFacts, check_engine_compatible
from seer_deploy.engines.ort import OrtBackend
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
from seer_deploy.models.demos.demo_tasks import write_tokenizer
from seer_deploy.runtime.loop import run_generation
from seer_deploy.runtime.openers import open_target

MAX_SEQ_LEN = 96
BS = ["batch", "seq"]
CFG = tiny_config(max_seq_len=MAX_SEQ_LEN)
KV_SHAPE: list[int | str] = [CFG.n_layers, 2, "batch", CFG.n_kv_heads, "seq", CFG.head_dim]


def _io(name: str, elem: int, shape: list[int | str]) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, elem, shape)


def _const(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, TensorProto.INT64, [len(values)],
                                                                            values))


def step_model(kv_cache: bool = False) -> onnx.ModelProto:
    """The step graph's interface (contracts.graphs.step_graph): token_ids = input_ids, confidence = sample_uniform *
    float(mask), eos_prob = float(mask), sparsity = eos_prob[:, None, :] repeated (K = 4: one layer's statistics); with kv_cache also
    kv[l, k, b, h, s, d] = float(mask[b, s]) + sample_uniform[b, s]. temperature, candidates and with_stats are taken,
    unused, as are score_rule and score_temperature (score = confidence)."""
    nodes = [
        helper.make_node("Identity", ["input_ids"], ["token_ids"]),
        helper.make_node("Cast", ["attention_mask"], ["eos_prob"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["sample_uniform", "eos_prob"], ["confidence"]),
        _const("axes", [1]),
        helper.make_node("Unsqueeze", ["eos_prob", "axes"], ["one_row"]),
        helper.make_node("Concat", ["one_row"] * 4, ["sparsity"], axis=1),
        helper.make_node("Identity", ["confidence"], ["score"]),
    ]
    outputs = [_io("token_ids", TensorProto.INT64, BS), _io("confidence", TensorProto.FLOAT, BS),
               _io("eos_prob", TensorProto.FLOAT, BS), _io("sparsity", TensorProto.FLOAT, ["batch", 4, "seq"]),
               _io("score", TensorProto.FLOAT, BS)]
    if kv_cache:
        nodes += [
            helper.make_node("Add", ["sample_uniform", "eos_prob"], ["per_column"]),
            _const("kv_axes", [0, 1, 3, 5]),
            helper.make_node("Unsqueeze", ["per_column", "kv_axes"], ["column"]),  # [1, 1, B, 1, S, 1]
            _const("tile", [CFG.n_layers, 2, 1, CFG.n_kv_heads, 1, CFG.head_dim]),
            helper.make_node("Expand", ["column", "tile"], ["kv"]),
        ]
        outputs.append(_io("kv", TensorProto.FLOAT, KV_SHAPE))
    graph = helper.make_graph(
        nodes, "step",
        [_io("input_ids", TensorProto.INT64, BS), _io("attention_mask", TensorProto.INT64, BS),
         _io("temperature", TensorProto.FLOAT, ["batch"]), _io("sample_uniform", TensorProto.FLOAT, BS),
         _io("candidates", TensorProto.INT64, ["batch", "candidates"]), _io("with_stats", TensorProto.INT64, ["batch"]),
         _io("score_rule", TensorProto.INT64, ["batch"]), _io("score_temperature", TensorProto.FLOAT, ["batch"])],
        outputs,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def window_step_model() -> onnx.ModelProto:
    """token_ids = window_ids; confidence = sample_uniform * (window_start + temperature + sum(mask) + sum(kv)) per
    row: every input reaches an output (TensorRT keeps only the inputs something reads)."""
    bw = ["batch", "window"]
    nodes = [
        helper.make_node("Identity", ["window_ids"], ["token_ids"]),
        helper.make_node("Cast", ["window_start"], ["startf"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["attention_mask"], ["maskf"], to=TensorProto.FLOAT),
        _const("seq_axis", [1]),
        helper.make_node("ReduceSum", ["maskf", "seq_axis"], ["mask_sum"], keepdims=0),
        _const("kv_axes", [0, 1, 3, 4, 5]),
        helper.make_node("ReduceSum", ["kv", "kv_axes"], ["kv_sum"], keepdims=0),
        helper.make_node("Add", ["startf", "temperature"], ["a"]),
        helper.make_node("Add", ["a", "mask_sum"], ["b"]),
        helper.make_node("Add", ["b", "kv_sum"], ["row"]),
        helper.make_node("Unsqueeze", ["row", "seq_axis"], ["row_column"]),  # [B, 1]
        helper.make_node("Mul", ["sample_uniform", "row_column"], ["confidence"]),
    ]
    graph = helper.make_graph(
        nodes, "window_step",
        [_io("window_ids", TensorProto.INT64, bw), _io("attention_mask", TensorProto.INT64, BS),
         _io("window_start", TensorProto.INT64, ["batch"]), _io("kv", TensorProto.FLOAT, KV_SHAPE),
         _io("temperature", TensorProto.FLOAT, ["batch"]), _io("sample_uniform", TensorProto.FLOAT, bw)],
        [_io("token_ids", TensorProto.INT64, bw), _io("confidence", TensorProto.FLOAT, bw)],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)])


def _specs(values: list[onnx.ValueInfoProto]) -> dict[str, TensorSpec]:
    out = {}
    for v in values:
        dims: list[int | str] = [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
        out[v.name] = TensorSpec(helper.tensor_dtype_to_np_dtype(v.type.tensor_type.elem_type).name, dims)
    return out


def make_export(root: Path, fingerprint: str = "1" * 64, kv_cache: bool = False) -> Path:
    """An export dir that ExportManifest.load and OrtBackend accept; kv_cache: its step graph returns kv, and the
    window_step graph."""
    root.mkdir(parents=True, exist_ok=True)
    graphs = {}
    models = [("step", step_model(kv_cache))]
    if kv_cache:
        models.append(("window_step", window_step_model()))
    for name, model in models:
        onnx.checker.check_model(model)
        onnx.save(model, root / f"{name}.onnx")
        graphs[name] = GraphRecord(f"{name}.onnx", file_sha256(root / f"{name}.onnx"),
                                 _specs(list(model.graph.input)), _specs(list(model.graph.output)))
    (root / "weights.bin").write_bytes(b"\0" * 64)
    cfg = CFG
    ExportManifest(
        model=ModelSpec("test", "llada", fingerprint, cfg.to_dict()),
        special_ids={"mask": cfg.mask_id, "eos": cfg.eos_id, "pad": cfg.pad_id, "bos": cfg.bos_id, "eot": None},
        dtype="fp32",
        opset=20,
        max_seq_len=MAX_SEQ_LEN,
        graphs=graphs,
        seer=StatsSpec((1,)),
        sampling=sampling.manifest_entry(),
        versions={"onnx": onnx.__version__},
        weights=WeightsSpec("weights.bin", "0" * 64, 64),
    ).save(root)
    claim(root, "export", fingerprint)  # as seer-deploy export marks what it wrote
    return root


@pytest.fixture
def export_dir(tmp_path: Path) -> Path:
    return make_export(tmp_path / "export")


def cpu_options(**kw: object) -> BuildOptions:
    from seer_deploy.engines.ort import OrtSessionOptions

    return BuildOptions(ort_session=OrtSessionOptions(providers=("CPUExecutionProvider",), intra_op_threads=1),
                        **kw)  # type: ignore[arg-type]


# ---------------------------------------------------------------- ORT builds


def test_ort_build_writes_a_manifest_that_matches_the_export(export_dir: Path, tmp_path: Path) -> None:
    stages: list[str] = []
    result = build_engines(export_dir, tmp_path / "engine", cpu_options(buckets=(16, 32, 48)), stages.append)
    out = tmp_path / "engine"
    assert result.out == out and sorted(p.name for p in out.iterdir()) == [".seer-deploy.json", "engine.json",
                                                                             "export.json"]
    m = EngineManifest.load(out)
    marker = json.loads((out / ".seer-deploy.json").read_text())
    assert marker == {"format": "seer-deploy-owner", "kind": "engine", "fingerprint": m.model_fingerprint,
                      "files": ["engine.json", "export.json"]}
    export = ExportManifest.load(export_dir)
    assert m.backend == "ort" and m.buckets == (16, 32, 48) and m.max_batch == 8
    assert m.max_prompt == MAX_SEQ_LEN - 48  # default: the positions the last bucket leaves
    assert m.model_fingerprint == export.model.fingerprint
    assert m.graph_hashes == {name: g.sha256 for name, g in export.graphs.items()}
    assert m.ort_session is not None and m.ort_session["providers"] == ["CPUExecutionProvider"]
    assert m.versions["onnxruntime"] == ort.__version__
    assert json.loads((out / "export.json").read_text()) == export.to_dict()
    assert any("buckets" in s for s in stages) and any("installing" in s for s in stages)
    check_engine_compatible(m, RuntimeFacts(model_fingerprint=export.model.fingerprint,
                                            graph_hashes={k: g.sha256 for k, g in export.graphs.items()}))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temp dir left


def test_engine_dir_honours_the_umask(export_dir: Path, tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        build_engines(export_dir, tmp_path / "engine", cpu_options(buckets=(32,)))
    finally:
        os.umask(old)
    assert (tmp_path / "engine").stat().st_mode & 0o777 == 0o755
    assert (tmp_path / "engine" / MANIFEST_FILE).stat().st_mode & 0o777 == 0o644


def test_default_buckets_are_powers_of_two(export_dir: Path, tmp_path: Path) -> None:
    m = build_engines(export_dir, tmp_path / "e", cpu_options()).manifest
    assert m.max_prompt == MAX_SEQ_LEN // 2
    assert list(m.buckets) == power_of_two_buckets(MAX_SEQ_LEN - MAX_SEQ_LEN // 2)


def test_kept_lengths_plan_the_buckets(export_dir: Path, tmp_path: Path) -> None:
    lengths = [20] * 30 + [37] * 10 + [48]
    m = build_engines(export_dir, tmp_path / "e", cpu_options(max_gen_length=48, kept_lengths=lengths,
                                                              max_buckets=3)).manifest
    assert m.buckets == (20, 37, 48)


def test_an_engine_for_another_model_is_refused(tmp_path: Path) -> None:
    export_a = make_export(tmp_path / "a", fingerprint="a" * 64)
    export_b = make_export(tmp_path / "b", fingerprint="b" * 64)
    engine = build_engines(export_a, tmp_path / "engine", cpu_options(buckets=(32,))).manifest
    other = ExportManifest.load(export_b)
    with pytest.raises(ArtifactError, match="built for model aaaaaaaaaaaa, the export is model bbbbbbbbbbbb"):
        check_engine_compatible(engine, RuntimeFacts(model_fingerprint=other.model.fingerprint))


def test_saved_optimised_graphs_run_like_the_originals(export_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "engine"
    m = build_engines(export_dir, out, cpu_options(buckets=(32,), ort_save_optimized=True)).manifest
    assert m.files == {"step": "step.opt.onnx"}
    ids = np.arange(12, dtype=np.int64).reshape(2, 6)
    mask = np.ones_like(ids)
    mask[0, :2] = 0
    want = OrtBackend(export_dir).step0(StepInput(ids, mask))
    sess = ort.InferenceSession(str(out / m.files["step"]), providers=["CPUExecutionProvider"])
    feed = {"input_ids": ids, "attention_mask": mask, "temperature": np.zeros(2, np.float32),
            "sample_uniform": np.zeros(ids.shape, np.float32),
            "candidates": np.broadcast_to(np.arange(6), ids.shape).copy(), "with_stats": np.ones(2, np.int64),
            **scoring_feed(2, None)}
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feed), strict=True))
    np.testing.assert_array_equal(got["token_ids"], want.token_ids)
    np.testing.assert_array_equal(got["sparsity"], want.sparsity)


def test_a_modified_graph_is_refused(export_dir: Path, tmp_path: Path) -> None:
    with open(export_dir / "step.onnx", "ab") as fh:
        fh.write(b"\0")
    with pytest.raises(ArtifactError, match="modified after export"):
        build_engines(export_dir, tmp_path / "e", cpu_options())
    assert not (tmp_path / "e").exists()


def test_destination_rules(export_dir: Path, tmp_path: Path) -> None:
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    for force in (False, True):  # never delete a directory seer-deploy did not write
        with pytest.raises(ArtifactError, match=r"did not write \(notes.txt\); refusing to replace it, with or without"):
            build_engines(export_dir, precious, cpu_options(force=force))
    assert [p.name for p in precious.iterdir()] == ["notes.txt"] and (precious / "notes.txt").read_text() == "mine"
    with pytest.raises(ArtifactError, match="'export' artifact, not an 'engine' one"):
        build_engines(export_dir, export_dir, cpu_options())  # the export itself is never replaced by its engine
    out = tmp_path / "engine"
    build_engines(export_dir, out, cpu_options(buckets=(16, 48)))
    build_engines(export_dir, out, cpu_options(buckets=(32, 48)))  # a rebuild replaces the old engine dir
    assert EngineManifest.load(out).buckets == (32, 48)
    (out / "mine.txt").write_text("mine")  # a user's file inside our engine dir: refused, forced or not
    for force in (False, True):
        with pytest.raises(ArtifactError, match=r"did not write there \(mine.txt\)"):
            build_engines(export_dir, out, cpu_options(force=force))
    assert (out / "mine.txt").read_text() == "mine"


def test_our_engine_of_another_model_is_replaced_only_with_force(tmp_path: Path) -> None:
    export_a = make_export(tmp_path / "a", fingerprint="a" * 64)
    export_b = make_export(tmp_path / "b", fingerprint="b" * 64)
    out = tmp_path / "engine"
    build_engines(export_a, out, cpu_options(buckets=(32,)))
    with pytest.raises(ArtifactError, match="holds the engine of another model .*aaaaaaaaaaaa.*--force"):
        build_engines(export_b, out, cpu_options(buckets=(32,)))
    assert EngineManifest.load(out).model_fingerprint == "a" * 64
    build_engines(export_b, out, cpu_options(buckets=(32,), force=True))
    assert EngineManifest.load(out).model_fingerprint == "b" * 64
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "engine"]  # nothing left beside it


def test_graph_external_data_outside_the_export_is_refused(export_dir: Path, tmp_path: Path) -> None:
    """A graph whose weights are read from a file outside its directory is refused before any session opens it."""
    model = onnx.load(str(export_dir / "step.onnx"))
    (tmp_path / "secret.bin").write_bytes(np.ones(1, np.float32).tobytes())
    weight = onnx.TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1])
    weight.data_location = TensorProto.EXTERNAL
    for key, value in (("location", "../secret.bin"), ("offset", "0"), ("length", "4")):
        weight.external_data.add(key=key, value=value)
    model.graph.initializer.append(weight)
    onnx.save(model, str(export_dir / "step.onnx"))
    manifest = json.loads((export_dir / "manifest.json").read_text())
    manifest["graphs"]["step"]["sha256"] = file_sha256(export_dir / "step.onnx")
    (export_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="external data of .*step.onnx '../secret.bin' resolves to .*, outside"):
        build_engines(export_dir, tmp_path / "e", cpu_options())
    assert not (tmp_path / "e").exists()


# ---------------------------------------------------------------- the KV cache graphs (export --kv-cache)


def window_input(batch: int, seq: int, start: int, width: int, kv: np.ndarray, temperature: float = 0.0,
                 seed: int | None = None) -> tuple[StepInput, WindowInput]:
    """A refresh call's input and a window over its columns [start, start + width) with that refresh's kv."""
    rng = np.random.default_rng(seq * 7 + width)
    ids = rng.integers(0, CFG.vocab_size, size=(batch, seq), dtype=np.int64)
    mask = np.ones_like(ids)
    mask[0, :2] = 0  # a left-padded row
    starts = np.full(batch, start, dtype=np.int64)
    return StepInput(ids, mask), WindowInput(ids[:, start : start + width], mask, starts, kv, temperature, seed)


def test_an_ort_engine_dir_carries_the_cache_graphs(tmp_path: Path) -> None:
    export_dir = make_export(tmp_path / "export", kv_cache=True)
    m = build_engines(export_dir, tmp_path / "engine", cpu_options(buckets=(32,), ort_save_optimized=True)).manifest
    export = ExportManifest.load(export_dir)
    assert m.has_cache and m.graph_hashes == {name: g.sha256 for name, g in export.graphs.items()}
    assert m.files == {name: f"{name}.opt.onnx" for name in ("step", "window_step")}
    assert all((tmp_path / "engine" / f).is_file() for f in m.files.values())
    backend, info = open_target(tmp_path / "engine")
    assert info.kind == "engine" and supports_cache(backend)
    reference = OrtBackend(export_dir)
    step, _ = window_input(2, 20, 0, 1, np.zeros(0))
    got, want = backend.refresh(step), reference.refresh(step)  # type: ignore[attr-defined]
    for a, b in zip(got, want, strict=True):
        np.testing.assert_array_equal(a, b)
    _, window = window_input(2, 20, 12, 8, want.kv, 0.5, 3)
    got_w, want_w = backend.window_step(window), reference.window_step(window)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(got_w.token_ids, window.window_ids)
    np.testing.assert_array_equal(got_w.confidence, want_w.confidence)

    # A cache graph changed after the build: the engine dir is refused, as for a step graph.
    manifest = json.loads((export_dir / "manifest.json").read_text())
    manifest["graphs"]["window_step"]["sha256"] = "0" * 64
    (export_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="window_step graph was built from ONNX .* the export changed"):
        open_target(tmp_path / "engine")
    # The window graph gone from the export (re-exported without --kv-cache): refused too.
    del manifest["graphs"]["window_step"]
    (export_dir / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(ArtifactError, match="window_step|kv"):
        open_target(tmp_path / "engine")


def test_window_lengths_are_refused_where_they_mean_nothing(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--window-lengths applies to --backend tensorrt only"):
        build_engines(make_export(tmp_path / "export"), tmp_path / "e", cpu_options(window_lengths=(32,)))


@pytest.fixture(scope="module")
def kv_export(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One real export of a tiny model with the KV cache graphs (the module's only export: tracing takes a while)."""
    root = tmp_path_factory.mktemp("kv-export")
    write_tokenizer(root / "tokenizer.json")
    ckpt = save_checkpoint(tiny_model(0), root / "ckpt", "llada", tokenizer_file=root / "tokenizer.json")
    return export_checkpoint(ckpt, root / "export", ExportOptions(kv_cache=True, verify=False, max_seq_len=48)).out


def test_an_ort_engine_dir_of_a_kv_cache_export_runs_refresh_and_window_step(kv_export: Path, tmp_path: Path) -> None:
    out = tmp_path / "engine"
    m = build_engines(kv_export, out, cpu_options(buckets=(16, 32))).manifest
    assert m.has_cache and set(m.graph_hashes) == {"step", "window_step", "prompt_step"}
    engine, info = open_target(out)
    export, _ = open_target(kv_export)
    assert supports_cache(engine) and supports_cache(export)
    for batch, seq, start, width, temperature, seed in ((1, 24, 8, 8, 0.0, None), (2, 40, 24, 16, 0.8, 5)):
        step, _ = window_input(batch, seq, 0, 1, np.zeros(0))
        got, want = engine.refresh(step), export.refresh(step)  # type: ignore[attr-defined]
        np.testing.assert_array_equal(got.token_ids, want.token_ids)
        np.testing.assert_allclose(got.confidence, want.confidence, rtol=0, atol=1e-6)
        assert want.kv.shape == (2, 2, batch, 2, seq, 8)  # [layers, 2, batch, kv_heads, seq, head_dim]
        np.testing.assert_allclose(got.kv, want.kv, rtol=0, atol=1e-6)
        _, window = window_input(batch, seq, start, width, want.kv, temperature, seed)
        got_w, want_w = engine.window_step(window), export.window_step(window)  # type: ignore[attr-defined]
        assert got_w.token_ids.shape == (batch, width)
        np.testing.assert_array_equal(got_w.token_ids, want_w.token_ids)
        np.testing.assert_allclose(got_w.confidence, want_w.confidence, rtol=0, atol=1e-6)
    # Whole cached generations through the engine dir: the export's tokens.
    config = GenerationConfig(gen_length=16, steps=8, block_length=8, kv_cache=True)
    prompts = [[5, 6, 7], [8, 9, 10, 11, 12]]
    calls: list[int] = []
    window_step = engine.window_step  # type: ignore[attr-defined]
    engine.window_step = lambda inputs: calls.append(inputs.window_ids.shape[1]) or window_step(inputs)  # type: ignore[attr-defined]
    runs = [run_generation(b, prompts, config, ids=SpecialIds(mask=info.mask_id, pad=info.pad_id)) for b in (engine, export)]
    assert calls and set(calls) == {8}  # the engine dir's cached passes ran, over one block each
    np.testing.assert_array_equal(runs[0].tokens, runs[1].tokens)
    assert runs[0].passes == runs[1].passes


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"buckets": (16, 64), "max_prompt": 40}, "exceeds the model's 96 positions"),
        ({"buckets": (16, 32), "max_gen_length": 48}, "differs from the last bucket"),
        ({"max_prompt": 96}, "leaves no room"),
        ({"max_batch": 0}, "--max-batch"),
        ({"workspace_bytes": 1 << 30}, "apply to --backend tensorrt only"),
    ],
)
def test_bad_settings_are_config_errors(export_dir: Path, tmp_path: Path, options: dict[str, object],
                                        message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        build_engines(export_dir, tmp_path / "e", cpu_options(**options))


def test_parse_size() -> None:
    assert parse_size("4G") == 4 << 30
    assert parse_size("512M") == 512 << 20
    assert parse_size("1.5GiB") == 3 << 29
    assert parse_size("1048576") == 1 << 20
    for bad in ("", "G", "-1G", "four", "1e-30"):
        with pytest.raises(ConfigError):
            parse_size(bad)
    for bad in ("nan", "NaNG", "inf", "-infM", "1e400", "\u0664G"):  # NaN, infinities, Arabic-Indic four: one line each
        with pytest.raises(ConfigError, match="not a number"):
            parse_size(bad)


# ---------------------------------------------------------------- the CLI


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(argv)
    captured = capsys.readouterr()
    return int(info.value.code or 0), captured.out, captured.err


def test_cli_build_ort(export_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "engine"
    code, stdout, err = run_main(["build", str(export_dir), "--out", str(out), "--backend", "ort", "--buckets",
                                  "16,32,48", "--max-batch", "4", "--provider", "CPUExecutionProvider", "--threads",
                                  "1"], capsys)
    assert code == 0, err
    assert "engine dir:" in stdout and "opening ONNX Runtime sessions" in err  # progress goes to stderr
    m = EngineManifest.load(out)
    assert (m.buckets, m.max_batch, m.max_prompt) == ((16, 32, 48), 4, MAX_SEQ_LEN - 48)
    assert m.ort_session is not None and m.ort_session["intra_op_threads"] == 1


def test_cli_kept_lengths_file(export_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    hist = tmp_path / "kept.json"
    hist.write_text(json.dumps({"10": 5, "30": 2, "48": 1}))
    code, _, err = run_main(["build", str(export_dir), "--out", str(tmp_path / "e"), "--max-gen-length", "48",
                             "--kept-lengths", str(hist), "--max-buckets", "3", "--provider", "CPUExecutionProvider"],
                            capsys)
    assert code == 0, err
    assert EngineManifest.load(tmp_path / "e").buckets == (16, 30, 48)  # 10 rises to the default min_bucket 16


def test_cli_tensorrt_without_tensorrt_is_a_clear_exit_2(export_dir: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither flavour importable (TensorRT-RTX is a test dependency here, so its absence is simulated)."""
    monkeypatch.setattr(tensorrt_library, "import_library", lambda name: None)
    assert not tensorrt_library.tensorrt_available()
    code, _, err = run_main(["build", str(export_dir), "--out", str(tmp_path / "e"), "--backend", "tensorrt"], capsys)
    assert code == 2
    assert "TensorRT is not installed" in err and "--backend ort" in err
    assert "Traceback" not in err
    assert not (tmp_path / "e").exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--buckets", "64,32"], "ascending"),
        (["--workspace", "lots", "--backend", "ort"], "not a number"),
        (["--workspace", "nan"], "not a number"),
        (["--buckets", "\u0661\u0666,32"], "digits 0-9"),  # Arabic-Indic 16: int() would read it, the CLI refuses it
        (["--buckets", "16,\u00b2"], "digits 0-9"),  # superscript two: str.isdigit() passes it, int() does not
        (["--window-lengths", "\u0663\u0662"], "digits 0-9"),
        (["--buckets", "16,48", "--kept-lengths", "KEPT"], "not both"),
        (["--window-lengths", "32,16"], "ascending"),
        (["--window-lengths", "32", "--provider", "CPUExecutionProvider"], "tensorrt only"),
    ],
)
def test_cli_bad_input_exits_2(export_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                               args: list[str], message: str) -> None:
    kept = tmp_path / "kept.json"
    kept.write_text("[1, 2]")
    args = [str(kept) if a == "KEPT" else a for a in args]
    code, _, err = run_main(["build", str(export_dir), "--out", str(tmp_path / "e"), *args], capsys)
    assert code == 2 and message in err, err


def test_cli_refuses_a_foreign_engine_manifest_file(export_dir: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "e"
    out.mkdir()
    (out / MANIFEST_FILE).write_text("{}")  # looks like an engine dir, but seer-deploy's marker is missing
    for force in ([], ["--force"]):
        code, _, err = run_main(["build", str(export_dir), "--out", str(out), "--provider", "CPUExecutionProvider",
                                 *force], capsys)
        assert code == 2 and err.count("\n") == 1 and r"did not write (engine.json)" in err, err
    assert [p.name for p in out.iterdir()] == [MANIFEST_FILE] and (out / MANIFEST_FILE).read_text() == "{}"


def test_cli_checks_everything_before_the_first_progress_line(export_dir: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    for flags in (["--threads", "-1"], ["--max-batch", "0"], ["--min-prompt", "0"], ["--max-prompt", "96"]):
        code, out, err = run_main(["build", str(export_dir), "--out", str(tmp_path / "e"), *flags], capsys)
        assert code == 2 and out == "" and err.startswith("error: ") and err.count("\n") == 1, (flags, err)
    assert not (tmp_path / "e").exists()
