"""The prompt cache (LaViDa's prefix-DLM cache, Dimple's prefilling) and the Dream family's block-wise KV cache, on
tiny checkpoints in the families' public layouts: the cached passes against full passes, whole generations with and
without the cache on torch and ONNX Runtime, and the refusals."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from test_cli import run
from test_families_text import family_checkpoint

from seer_deploy.core.backend import PromptInput, window_lead
from seer_deploy.core.errors import ConfigError
from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.options import ExportOptions
from seer_deploy.models.checkpoints.checkpoint import load_checkpoint
from seer_deploy.models.networks.llada import MaskPredictor
from seer_deploy.runtime.loop import check_prompts, run_generation
from seer_deploy.runtime.reference import generate
from seer_deploy.runtime.torch_backend import TorchBackend
from seer_deploy.seer.config import SeerConfig

CPU = OrtSessionOptions(providers=("CPUExecutionProvider",))
PROMPTS = [[10, 3, 5, 2, 17], [10, 8, 17], [10, 1, 2, 3, 4, 5, 6, 17], [10, 9, 9, 17]]
CONFIGS = {
    "fixed": GenerationConfig(16, 16, block_length=8),
    "threshold": GenerationConfig(16, 16, decode="threshold", threshold=0.3),
    # the Dream family's sampler: the score from the graphs; LaViDa-Dream's greedy first token from the prompt pass
    "dream": GenerationConfig(16, 16, decode="timesteps", remasking="entropy"),
    "first-token": GenerationConfig(16, 16, decode="timesteps", remasking="topk_margin", first_from_prompt=True),
}
TRUNCATION = {"full": {}, "seer": {"seer": SeerConfig(detector="eos", eos_floor=0.0)},
              "kept": {"kept_lengths": [5, 16, 9, 12]}}


def cached_checkpoint(root: Path, family: str, prefix_dlm: bool, **fields: object) -> tuple[MaskPredictor, Path]:
    """A tiny checkpoint of `family` (with prefix-DLM attention asked for in config.json as LaViDa's `prefix_lm`),
    exported with the cache graphs."""
    _, ckpt = family_checkpoint(root, family, layout="llada" if family == "llada" else "llama", **fields)
    if prefix_dlm:
        config = json.loads((ckpt / "config.json").read_text())
        (ckpt / "config.json").write_text(json.dumps({**config, "prefix_lm": True}))
    model = load_checkpoint(ckpt).model
    assert model.cfg.prefix_dlm == prefix_dlm
    return model, export_checkpoint(ckpt, root / "export", ExportOptions(kv_cache=True)).out


@pytest.fixture(scope="module", params=["llada", "dream"], ids=["lavida-llada", "lavida-dream"])
def lavida(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[MaskPredictor, Path]:
    """LaViDa's two language models (LLaDA's; Dream's: shifted logits, q/k/v biases, grouped-query attention) with
    prefix-DLM attention."""
    return cached_checkpoint(tmp_path_factory.mktemp(f"lavida-{request.param}"), request.param, True)


def generations(backend: object, config: GenerationConfig, model: MaskPredictor, **extra: object) -> np.ndarray:
    return run_generation(backend, PROMPTS, config, special_ids(model), **extra).tokens  # type: ignore[arg-type]


def special_ids(model: MaskPredictor) -> SpecialIds:
    cfg = model.cfg
    return SpecialIds(mask=cfg.mask_id, pad=cfg.pad_id, eos=cfg.eos_id)


def cached_pass(model: MaskPredictor, ids: torch.Tensor, kv: torch.Tensor, width: int) -> torch.Tensor:
    """Logits of the response columns from a pass over [last prompt token + response] against kv's columns before
    it (what prompt_step computes)."""
    B, S = ids.shape
    start = torch.full((B,), width - 1)
    hidden = model.cached_hidden(ids[:, width - 1 :], torch.ones(B, S, dtype=torch.long), start,
                                 kv[:, :, :, :, : width - 1], torch.full((B,), width))
    return model.shifted(model.logits_of(hidden), dim=1)[:, 1:]


def test_prefix_dlm_prompt_cache_is_exact_after_the_response_changed(lavida: tuple[MaskPredictor, Path]) -> None:
    """The cache is taken at step zero (response all masks); later passes see another response, and the prompt's keys
    and values are still exact under prefix-DLM attention, so the cached pass is the full pass. Without prefix-DLM
    (Dimple's prefilling) the prompt's keys and values depend on the response: the cached pass differs."""
    model, _ = lavida
    cfg, width = model.cfg, 6
    ids = torch.randint(0, cfg.vocab_size, (2, 14), generator=torch.Generator().manual_seed(4))
    step_zero = ids.clone()
    step_zero[:, width:] = cfg.mask_id
    plain = MaskPredictor(replace(cfg, prefix_dlm=False))
    plain.load_state_dict(model.state_dict())
    for net, exact in ((model, True), (plain.eval(), False)):
        with torch.no_grad():
            kv = net(step_zero, return_kv=True, **({"prompt_width": torch.full((2,), width)} if exact else {})).kv
            full = net(ids, **({"prompt_width": torch.full((2,), width)} if exact else {})).logits[:, width:]
            assert kv is not None
            got = cached_pass(net, ids, kv, width)
        assert torch.allclose(got, full, atol=1e-5) == exact


@pytest.mark.parametrize("truncation", list(TRUNCATION))
@pytest.mark.parametrize("decode", list(CONFIGS))
def test_lavida_prompt_cache_gives_the_uncached_tokens(lavida: tuple[MaskPredictor, Path], decode: str,
                                                       truncation: str) -> None:
    """LaViDa's prompt cache (both language models) gives the tokens of the same loop without it, on torch, on ONNX
    Runtime and in the reference loop, with Seer off, on and with forced kept lengths; its passes run fewer
    positions."""
    model, export = lavida
    config, extra = CONFIGS[decode], TRUNCATION[truncation]
    want = generations(TorchBackend(model), config, model, **extra)
    for backend in (TorchBackend(model), OrtBackend(export, CPU)):
        np.testing.assert_array_equal(generations(backend, replace(config, prompt_cache=True), model, **extra), want)
    reference = generate(model, PROMPTS, replace(config, prompt_cache=True), **extra)  # type: ignore[arg-type]
    np.testing.assert_array_equal(reference.tokens.numpy(), want)
    runs = [run_generation(TorchBackend(model), PROMPTS, c, special_ids(model), **extra)  # type: ignore[arg-type]
            for c in (config, replace(config, prompt_cache=True))]
    assert runs[0].passes == runs[1].passes and runs[1].tokens_processed < runs[0].tokens_processed
    if runs[1].seer is not None and decode == "fixed":  # each request's report counts the cached passes' positions
        assert sum(r.tokens_processed for r in runs[1].seer) == runs[1].tokens_processed


def test_the_prompt_step_graph_equals_torch(lavida: tuple[MaskPredictor, Path]) -> None:
    """prompt_step.onnx against torch on a left-padded batch, a few candidate columns each; a cache of other columns
    than the mask's is refused."""
    model, export = lavida
    manifest = json.loads((export / "manifest.json").read_text())
    assert list(manifest["graphs"]["prompt_step"]["inputs"]) == ["run_ids", "attention_mask", "prompt_kv",
                                                                 "temperature", "sample_uniform", "candidates",
                                                                 "score_rule", "score_temperature", "prompt_width"]
    assert list(manifest["graphs"]["prompt_step"]["outputs"]) == ["token_ids", "confidence", "score"]
    ids = np.random.default_rng(1).integers(0, model.cfg.vocab_size, (2, 12))
    mask = np.ones_like(ids)
    mask[1, :2] = 0  # left padding, in the cache
    with torch.no_grad():
        kv = model(torch.from_numpy(ids), torch.from_numpy(mask), return_kv=True,
                   prompt_width=torch.full((2,), 7)).kv
    assert kv is not None
    call = PromptInput(ids[:, 6:], mask, kv[:, :, :, :, :6].numpy(), candidates=np.array([[1, 3], [2, 5]]),
                       prompt_width=7)
    got, want = OrtBackend(export, CPU).prompt_step(call), TorchBackend(model).prompt_step(call)
    for b, columns in enumerate(call.candidates):  # type: ignore[union-attr]
        np.testing.assert_array_equal(got.token_ids[b, columns], want.token_ids[b, columns])
        np.testing.assert_allclose(got.confidence[b, columns], want.confidence[b, columns], atol=1e-5)
    for remasking in ("topk_margin", "entropy"):  # the decoding rules' scores, as the step graph's
        scored = call._replace(scoring=GenerationConfig(16, 16, decode="timesteps", remasking=remasking).scoring())
        got, want = OrtBackend(export, CPU).prompt_step(scored), TorchBackend(model).prompt_step(scored)
        assert got.score is not None and want.score is not None
        for b, columns in enumerate(call.candidates):  # type: ignore[union-attr]
            np.testing.assert_allclose(got.score[b, columns], want.score[b, columns], atol=1e-5)
            assert not np.allclose(got.score[b, columns], got.confidence[b, columns])  # not the confidence
    with pytest.raises(ConfigError, match="prompt_kv"):
        OrtBackend(export, CPU).prompt_step(call._replace(prompt_kv=kv.numpy()))


@pytest.mark.parametrize(("family", "prefix_dlm"), [("dream", False), ("dimple", False), ("dream", True)],
                         ids=["dream", "dimple", "lavida-dream"])
def test_dream_family_kv_cache_gives_the_uncached_tokens_where_the_cache_is_exact(
        family: str, prefix_dlm: bool, tmp_path: Path) -> None:
    """With one layer a column's keys and values depend on its own token only, so the block-wise cache is exact: the
    cached loop gives the tokens of the uncached one, on torch and ONNX Runtime. The window starts one column before
    its block (the shifted logits read the first token from there; LaViDa-Dream's first window holds the last prompt
    column, a prompt query); started at the block, the tokens differ."""
    model, export = cached_checkpoint(tmp_path, family, prefix_dlm, n_layers=1)
    config = GenerationConfig(24, 24, block_length=8)
    for extra in TRUNCATION.values():
        want = generations(TorchBackend(model), config, model, **extra)
        for backend in (TorchBackend(model), OrtBackend(export, CPU)):
            np.testing.assert_array_equal(generations(backend, replace(config, kv_cache=True), model, **extra), want)
    blind = TorchBackend(model)
    blind.window_lead = 0  # the window without the column before the block
    assert not np.array_equal(generations(blind, replace(config, kv_cache=True), model), want)


def test_lavida_dream_kv_cache_on_onnx_runtime_equals_torch(lavida: tuple[MaskPredictor, Path]) -> None:
    """The block-wise cache on two layers (an approximation): ONNX Runtime = torch token for token, the window of a
    shifted, prefix-DLM model starting at the last prompt column."""
    model, export = lavida
    config = GenerationConfig(16, 16, block_length=8, kv_cache=True)
    for extra in TRUNCATION.values():
        np.testing.assert_array_equal(generations(OrtBackend(export, CPU), config, model, **extra),
                                      generations(TorchBackend(model), config, model, **extra))


def test_prompt_cache_refusals(lavida: tuple[MaskPredictor, Path], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:
    model, export = lavida
    cfg = model.cfg
    with pytest.raises(ConfigError, match="choose one"):
        GenerationConfig(8, 8, kv_cache=True, prompt_cache=True).validate()
    torch_backend = TorchBackend(model)
    with pytest.raises(ConfigError, match="mask token"):
        check_prompts([[10, 3], [10, cfg.mask_id, 17]], GenerationConfig(8, 8, prompt_cache=True), torch_backend,
                      cfg.mask_id)
    check_prompts([[10, cfg.mask_id, 17]], GenerationConfig(8, 8), torch_backend, cfg.mask_id)  # filled uncached
    picture = 7  # a prompt ending with a picture's placeholder: a cached pass would run an image id
    with pytest.raises(ConfigError, match="ends with a picture"):
        check_prompts([[10, 3, picture]], GenerationConfig(8, 8, prompt_cache=True), torch_backend, cfg.mask_id, picture)
    check_prompts([[10, picture, 3]], GenerationConfig(8, 8, prompt_cache=True), torch_backend, cfg.mask_id, picture)
    blocks = GenerationConfig(8, 8, block_length=4, kv_cache=True)  # the block-wise cache: LaViDa-Dream's first
    lead = window_lead(torch_backend)  # window holds the last prompt token, LaViDa-LLaDA's does not
    if lead:
        with pytest.raises(ConfigError, match="ends with a picture"):
            check_prompts([[10, 3, picture]], blocks, torch_backend, cfg.mask_id, picture)
    else:
        check_prompts([[10, 3, picture]], blocks, torch_backend, cfg.mask_id, picture)
    with pytest.raises(ConfigError, match="cfg-scale"):
        GenerationConfig(8, 8, prompt_cache=True, cfg_scale=1.0)
    code, _, err = run(["generate", str(export), "-p", "reverse 12", "--gen-length", "8", "--kv-cache",
                        "--prompt-cache"], capsys)
    assert code == 2 and "choose one" in err and len(err.strip().splitlines()) == 1
    plain = tmp_path / "plain"  # an export without the prompt-cache graph (made before it existed)
    shutil.copytree(export, plain)
    manifest = json.loads((plain / "manifest.json").read_text())
    (plain / manifest["graphs"].pop("prompt_step")["file"]).unlink()
    (plain / "manifest.json").write_text(json.dumps(manifest))
    code, _, err = run(["generate", str(plain), "-p", "reverse 12", "--gen-length", "8", "--prompt-cache"], capsys)
    assert code == 2 and "export --kv-cache" in err and len(err.strip().splitlines()) == 1
    code, out, err = run(["generate", str(plain), "-p", "reverse 12", "--gen-length", "8", "--kv-cache", "--json"],
                         capsys)  # the block-wise cache still runs
    assert code == 0, err
    assert json.loads(out.splitlines()[0])["decode"]["kv_cache"] is True


@pytest.mark.parametrize("family", ["dimple", "llada"])
def test_dimple_prefilling_in_the_runtime_loop_equals_the_reference_loop(family: str, tmp_path: Path) -> None:
    """Without prefix-DLM the prompt cache is Dimple's prefilling (step zero's keys and values of the prompt, its last
    token run again; not the uncached tokens): the runtime loop on torch and ONNX Runtime gives the reference loop's
    tokens, which compute it apart (`reference.generate`), with Seer off and on."""
    model, export = cached_checkpoint(tmp_path, family, False)
    for decode, config in CONFIGS.items():
        cached = replace(config, prompt_cache=True)
        for seer in (None, SeerConfig(detector="eos", eos_floor=0.0)):
            want = generate(model, PROMPTS, cached, seer=seer)
            for backend in (TorchBackend(model), OrtBackend(export, CPU)):
                got = run_generation(backend, PROMPTS, cached, special_ids(model), seer=seer)
                np.testing.assert_array_equal(got.tokens, want.tokens.numpy(), err_msg=f"{decode} {seer}")
            if seer is None and decode == "fixed":
                assert want.tokens_processed == got.tokens_processed
        uncached = generate(model, PROMPTS, config)
        assert not np.array_equal(uncached.tokens.numpy(), want.tokens.numpy())  # an approximation: it differs
