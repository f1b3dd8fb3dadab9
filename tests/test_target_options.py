"""Every option is honoured for every kind of target, or refused with a clear error naming the option and why.

The matrix: target kinds (checkpoint, export dir, ONNX Runtime engine dir, and the same three for a multimodal
checkpoint) x options (--backend, --batch-size, --provider, --threads, --seer/--no-seer, --tail-context,
--cfg-scale), through the one generation service that `seer-deploy generate` calls.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import tiny_model
from test_multimodal import pictures, write_tiny_vl

from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig
from seer_deploy.engines.build import BuildOptions, build_engines
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.multimodal import export_multimodal
from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
from seer_deploy.models.demos.demo_tasks import write_tokenizer
from seer_deploy.runtime.reference import generate
from seer_deploy.service import Prompt, SeerOptions, Service, ServiceOptions, TargetOptions

KINDS = ("checkpoint", "export", "engine", "multimodal-checkpoint", "multimodal-export", "multimodal-engine")
TORCH_KINDS = ("checkpoint", "multimodal-checkpoint")
ORT_KINDS = tuple(k for k in KINDS if k not in TORCH_KINDS)
OWN_BACKEND = {kind: "torch" if kind in TORCH_KINDS else "ort" for kind in KINDS}
CONFIG = GenerationConfig(gen_length=8, steps=8)
CPU = ("CPUExecutionProvider",)


@pytest.fixture(scope="module")
def targets(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One directory of each kind, plus three pictures."""
    root = tmp_path_factory.mktemp("kinds")
    write_tokenizer(root / "tokenizer.json")
    ckpt = save_checkpoint(tiny_model(5), root / "ckpt", "llada", tokenizer_file=root / "tokenizer.json")
    session = OrtSessionOptions(providers=CPU, intra_op_threads=2)
    export = export_checkpoint(ckpt, root / "export").out
    engine = build_engines(export, export / "engine", BuildOptions(backend="ort", ort_session=session)).out
    vl, _, _ = write_tiny_vl(root / "vl", seed=1)
    vl_export = export_multimodal(vl, root / "vl-export").out
    vl_engine = build_engines(vl_export, vl_export / "engine", BuildOptions(backend="ort", ort_session=session)).out
    for i, picture in enumerate(pictures(3)):
        picture.save(root / f"pic{i}.png")
    return {"checkpoint": ckpt, "export": export, "engine": engine, "multimodal-checkpoint": vl,
            "multimodal-export": vl_export, "multimodal-engine": vl_engine, "root": root}


def requests_for(kind: str, targets: dict[str, Path]) -> list[Prompt]:
    if kind.startswith("multimodal"):
        tasks = ("colors", "count", "shapes")
        return [Prompt(f"<image> {t}", (str(targets["root"] / f"pic{i}.png"),)) for i, t in enumerate(tasks)]
    return [Prompt(p) for p in ("reverse 12", "sort 987", "count 5")]


def run(kind: str, targets: dict[str, Path], generation: GenerationConfig = CONFIG, **options: object
        ) -> tuple[Service, list[list[int]], int, list]:
    service = Service(targets[kind], ServiceOptions(generation=generation, **options))  # type: ignore[arg-type]
    out = service.generate(requests_for(kind, targets))
    return service, [a.tokens for a in out.answers], out.passes, out.reports


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("backend", ("torch", "ort", "tensorrt"))
def test_backend_is_the_targets_own_or_refused(kind: str, backend: str, targets: dict[str, Path]) -> None:
    if backend == OWN_BACKEND[kind]:
        service, tokens, _, _ = run(kind, targets, target=TargetOptions(backend=backend))  # type: ignore[arg-type]
        assert len(tokens) == 3 and service.info.backend == backend
        return
    with pytest.raises(ConfigError, match=rf"TARGET '.*' is an? (checkpoint|export directory|ort engine).*{backend}"):
        Service(targets[kind], ServiceOptions(generation=CONFIG, target=TargetOptions(backend=backend)))  # type: ignore[arg-type]


@pytest.mark.parametrize("kind", KINDS)
def test_batch_size_splits_the_requests_into_step_zeros(kind: str, targets: dict[str, Path]) -> None:
    _, one, passes_one, _ = run(kind, targets, batch_size=1, seer=SeerOptions(on=False))
    _, three, passes_three, _ = run(kind, targets, batch_size=3, seer=SeerOptions(on=False))
    assert one == three  # a row's tokens do not depend on its batch
    assert passes_one == 3 * passes_three  # three batches of one: every pass three times
    with pytest.raises(ConfigError, match="--batch-size must be >= 1"):
        Service(targets[kind], ServiceOptions(generation=CONFIG, batch_size=0))


@pytest.mark.parametrize("kind", KINDS)
def test_provider_is_honoured_on_onnx_runtime_and_refused_on_torch(kind: str, targets: dict[str, Path]) -> None:
    if kind in TORCH_KINDS:
        with pytest.raises(ConfigError, match="--provider sets ONNX Runtime sessions.*runs on torch"):
            Service(targets[kind], ServiceOptions(generation=CONFIG, target=TargetOptions(providers=CPU)))
        return
    service, _, _, _ = run(kind, targets, target=TargetOptions(providers=CPU))
    assert isinstance(service.backend, OrtBackend) and service.backend.providers == list(CPU)
    with pytest.raises(ConfigError, match="NoSuchExecutionProvider.*not available"):
        Service(targets[kind], ServiceOptions(generation=CONFIG,
                                              target=TargetOptions(providers=("NoSuchExecutionProvider",))))


@pytest.mark.parametrize("kind", KINDS)
def test_threads_set_the_engines_intra_op_threads(kind: str, targets: dict[str, Path]) -> None:
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)  # not what the option asks for: the run must set it
        service, _, _, _ = run(kind, targets, target=TargetOptions(threads=1))
        if kind in TORCH_KINDS:
            assert torch.get_num_threads() == 1
        else:
            assert isinstance(service.backend, OrtBackend) and service.backend.options.intra_op_threads == 1
    finally:
        torch.set_num_threads(before)
    if kind.endswith("engine"):  # without --threads an engine dir keeps the setting it was built with
        service, _, _, _ = run(kind, targets)
        assert isinstance(service.backend, OrtBackend) and service.backend.options.intra_op_threads == 2


@pytest.mark.parametrize("kind", KINDS)
def test_seer_on_and_off(kind: str, targets: dict[str, Path]) -> None:
    _, _, _, on = run(kind, targets, seer=SeerOptions(on=True))
    assert all(r is not None and 1 <= r.kept <= CONFIG.gen_length for r in on)
    _, _, _, off = run(kind, targets, seer=SeerOptions(on=False))
    assert off == [None, None, None]


@pytest.mark.parametrize("kind", KINDS)
def test_tail_context_keeps_the_cut_slots_or_is_refused_without_seer(kind: str, targets: dict[str, Path]) -> None:
    _, _, _, reports = run(kind, targets, seer=SeerOptions(on=True, tail_context="all"))
    assert all(r is not None and r.context == CONFIG.gen_length - r.kept for r in reports)
    with pytest.raises(ConfigError, match="--tail-context applies to Seer runs"):
        Service(targets[kind], ServiceOptions(generation=CONFIG, seer=SeerOptions(on=False, tail_context=4)))


@pytest.mark.parametrize("kind", KINDS)
def test_cfg_scale_runs_on_torch_and_is_refused_by_compact_backends(kind: str, targets: dict[str, Path]) -> None:
    guided = GenerationConfig(gen_length=8, steps=8, cfg_scale=1.0)
    if kind in ORT_KINDS:
        with pytest.raises(ConfigError, match="cfg_scale 1.0 .*only the torch backend has"):
            Service(targets[kind], ServiceOptions(generation=guided, seer=SeerOptions(on=False)))
        return
    service, tokens, _, _ = run(kind, targets, generation=guided, seer=SeerOptions(on=False))
    ids = service.prompt_ids(requests_for(kind, targets))  # sets the pictures' table for a multimodal checkpoint
    want = generate(service.backend.model, ids, guided).tokens.tolist()  # type: ignore[attr-defined]
    assert tokens == want


def test_a_refused_option_is_one_line_and_exit_code_2(targets: dict[str, Path],
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    from seer_deploy.cli import main

    for argv, words in (
        (["generate", str(targets["export"]), "-p", "x", "--cfg-scale", "1"], "cfg_scale"),
        (["generate", str(targets["checkpoint"]), "-p", "x", "--provider", "CPUExecutionProvider"], "--provider"),
        (["generate", str(targets["checkpoint"]), "-p", "x", "--image", str(targets["root"] / "pic0.png")],
         "placeholder"),
        (["generate", str(targets["checkpoint"]), "-p", "<image> x", "--image", str(targets["root"] / "pic0.png")],
         "is a text model"),
    ):
        with pytest.raises(SystemExit) as exit_info:
            main(argv)
        err = capsys.readouterr().err
        assert exit_info.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err


def test_a_prompt_too_long_fails_before_any_batch_runs(targets: dict[str, Path]) -> None:
    service = Service(targets["checkpoint"], ServiceOptions(generation=CONFIG, batch_size=1, seer=SeerOptions(on=False)))
    calls: list[int] = []
    original = service.backend.step0
    service.backend.step0 = lambda inputs: calls.append(1) or original(inputs)  # type: ignore[method-assign]
    too_long = "reverse " + "1" * (service.info.config.max_seq_len + 1)
    with pytest.raises(ConfigError, match="exceeds the model's"):
        service.generate([Prompt("reverse 12"), Prompt(too_long)])
    assert calls == []  # the first, valid batch did not run either


@pytest.mark.parametrize("kind", [k for k in KINDS if k.startswith("multimodal")])
def test_a_text_only_request_runs_on_a_multimodal_target(kind: str, targets: dict[str, Path]) -> None:
    """A batch without pictures (alone, or beside one with a picture) on a target that takes pictures."""
    service = Service(targets[kind], ServiceOptions(generation=CONFIG, batch_size=2, seer=SeerOptions(on=False)))
    alone = service.generate([Prompt("colors")])
    mixed = service.generate([Prompt("colors"), *requests_for(kind, targets)[:1]])
    assert alone.answers[0].tokens == mixed.answers[0].tokens and len(alone.answers[0].tokens) == CONFIG.gen_length


@pytest.mark.parametrize("kind", KINDS)
def test_parallel_decoding_runs_on_every_kind(kind: str, targets: dict[str, Path]) -> None:
    """--decode threshold with a threshold every candidate clears: one pass commits the whole block, on any target."""
    easy = GenerationConfig(gen_length=8, steps=8, decode="threshold", threshold=1e-30)
    _, tokens, steps, _ = run(kind, targets, generation=easy, seer=SeerOptions(on=False))
    _, fixed_tokens, fixed_steps, _ = run(kind, targets, seer=SeerOptions(on=False))
    assert steps == 1 and fixed_steps == CONFIG.steps
    assert len(tokens) == len(fixed_tokens) == 3


@pytest.mark.parametrize("kind", KINDS)
def test_kv_cache_runs_on_torch_and_is_refused_by_exports_without_its_graphs(kind: str,
                                                                             targets: dict[str, Path]) -> None:
    cached = GenerationConfig(gen_length=8, steps=8, block_length=4, kv_cache=True)
    if kind in ORT_KINDS:  # these exports were made without --kv-cache
        with pytest.raises(ConfigError, match="export --kv-cache"):
            Service(targets[kind], ServiceOptions(generation=cached, seer=SeerOptions(on=False)))
        return
    _, tokens, steps, _ = run(kind, targets, generation=cached, seer=SeerOptions(on=True))
    assert steps >= 2 and all(len(t) == CONFIG.gen_length for t in tokens)
