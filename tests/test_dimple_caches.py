"""Dimple's caches with pictures (issue 45): the cached passes (the prompt cache: Dimple's prefilling; the block-wise
--kv-cache) run text after the row's pictures, whose M-RoPE positions are the 1-D ones plus a per-row shift
(models.pictures.mrope.text_position_shift). Checked: a cached pass with the shift computes the full pass (and
without it does not); on a one-layer checkpoint, where both caches are exact, the cached loops give the uncached
tokens on torch and ONNX Runtime, under LLaDA's loop and Dimple's own rule."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from dimple_checkpoint import picture, write_dimple
from test_tensorrt_build import recording  # noqa: F401  (a fixture)

from seer_deploy.core.generation import GenerationConfig, SpecialIds
from seer_deploy.models.networks.image_prompts import ImageConditionedModel
from seer_deploy.models.pictures.mrope import mrope_positions, picture_layout, text_position_shift
from seer_deploy.runtime.loop import run_generation
from seer_deploy.service import Prompt, Service, ServiceOptions

GRIDS = [(1, 4, 6), (1, 2, 8), (1, 6, 2)]  # 6, 4 and 3 image tokens; each advances the positions by 3, 4, 3


def test_the_shift_is_what_m_rope_gives_text_after_the_pictures() -> None:
    """For each row (pictures, padding, none), every text column after its last picture has three equal M-RoPE
    positions, equal to the 1-D position plus the row's shift."""
    layout = picture_layout(GRIDS, 2)
    base = 1000
    rows = [[5, base + 0, base + 1, base + 2, base + 3, base + 4, base + 5, 6, 7, 8],
            [0, 0, 5, base + 6, base + 7, base + 8, base + 9, 6, 7, 8],
            [0, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
    ids = np.array(rows)
    mask = (np.arange(10)[None, :] >= np.array([0, 2, 1])[:, None]).astype(np.int64)
    positions = mrope_positions(ids, mask, base, layout)
    shift = text_position_shift(ids, mask, base, layout)
    np.testing.assert_array_equal(shift, [3 - 6, 4 - 4, 0])
    one_d = np.cumsum(mask, axis=1) - 1
    for axis in range(3):
        np.testing.assert_array_equal(positions[axis][:, 7:], one_d[:, 7:] + shift[:, None])


def test_a_cached_pass_with_the_shift_computes_the_full_pass(tmp_path: Path) -> None:
    """Against a fresh cache (the full pass's own keys and values) the window pass and the prompt-cache pass over text
    after two pictures give the full pass's logits; with the 1-D positions (no shift) they do not."""
    _, lm, _ = write_dimple(tmp_path)
    cfg = lm.cfg
    base = cfg.n_embed_rows
    layout = picture_layout(GRIDS[:2], 2)
    table = torch.randn(10, cfg.d_model, generator=torch.Generator().manual_seed(1))
    model = ImageConditionedModel(lm, table, layout).eval()
    prompt = [11, *range(base, base + 6), 12, 13, *range(base + 6, base + 10), 14, 15]
    ids = torch.tensor([prompt + [cfg.mask_id, 20, cfg.mask_id, 21, 22, cfg.mask_id]])
    mask = torch.ones_like(ids)
    P, S = len(prompt), ids.shape[1]
    with torch.no_grad():
        full = model(ids, mask, return_kv=True)
        assert full.kv is not None
        shift = torch.from_numpy(text_position_shift(ids.numpy(), mask.numpy(), base, layout))
        assert int(shift[0]) == (3 - 6) + (4 - 4)
        start = P - 1  # the window / run starts at the last prompt token
        for given, equal in ((shift, True), (None, False)):
            window = model.forward_window(ids[:, start:], mask, torch.tensor([start]), full.kv, position_shift=given)
            run = model.shifted(model.logits_of(model.cached_hidden(
                ids[:, start:], mask, torch.tensor([start]), full.kv[:, :, :, :, :start], position_shift=given)), 1)
            for got in (window, run):  # the first column is the last prompt token's own logits (the shift inside)
                assert torch.allclose(got[:, 1:], full.logits[:, start + 1 : S], atol=1e-5) == equal


@pytest.fixture(scope="module")
def one_layer(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, list[str]]:
    """A one-layer Dimple checkpoint (a column's keys and values depend on its own token only, so both caches are
    exact), its export with the cache graphs (whose own check runs the cached graphs on prompts with pictures),
    and two pictures."""
    from seer_deploy.export.dimple import prepare_dimple
    from seer_deploy.export.options import ExportOptions

    root = tmp_path_factory.mktemp("dimple-one-layer")
    path, _, _ = write_dimple(root, num_hidden_layers=1)
    files = []
    for i, size in enumerate([(100, 60), (60, 130)]):
        picture(*size, seed=i).save(root / f"p{i}.png")
        files.append(str(root / f"p{i}.png"))
    export = prepare_dimple(path, root / "onnx", ExportOptions(kv_cache=True)).start().out
    return path, export, files


def requests(files: list[str]) -> list[Prompt]:
    return [Prompt("hello <image> what is <image> the answer", (files[0], files[1])),
            Prompt("<image> hello world", (files[1],)), Prompt("what is the answer")]


def answers(target: Path, files: list[str], generation: GenerationConfig,
            kept: list[int] | None = None) -> list[list[int]]:
    """The three requests' answers, through the service (`kept`: each row cut to these lengths, as Seer's cut)."""
    service = Service(target, ServiceOptions(generation=generation, batch_size=3))
    if kept is None:
        return [a.tokens for a in service.generate(requests(files)).answers]
    info = service.info
    special = SpecialIds(mask=info.mask_id, pad=info.pad_id, eos=info.eos_id)
    ids = service.prompt_ids(requests(files))
    return run_generation(service.backend, ids, generation, special, kept_lengths=kept).tokens.tolist()


def test_the_export_has_the_cache_graphs_with_the_shift(one_layer: tuple[Path, Path, list[str]]) -> None:
    from seer_deploy.contracts.export_manifest import ExportManifest

    manifest = ExportManifest.load(one_layer[1])
    assert manifest.has_cache and manifest.has_prompt_cache
    for graph in ("window_step", "prompt_step"):
        assert list(manifest.graphs[graph].inputs)[-1] == "position_shift"
        assert manifest.graphs[graph].inputs["position_shift"].shape == ["batch"]


@pytest.mark.parametrize("rule", ["llada", "dimple"])
@pytest.mark.parametrize("kept", [None, [5, 16, 9]], ids=["full", "cut"])
def test_dimples_caches_give_the_uncached_tokens_with_pictures_where_exact(
        one_layer: tuple[Path, Path, list[str]], rule: str, kept: list[int] | None) -> None:
    """Rows with two, one and no pictures, at full length and cut per row (as Seer cuts them): the prompt cache
    (Dimple's prefilling) and, under LLaDA's loop, the block-wise cache give the uncached run's tokens, on torch and
    ONNX Runtime."""
    checkpoint, export, files = one_layer
    if rule == "llada":
        plain = GenerationConfig(gen_length=16, steps=16, block_length=8)
        cached = [replace(plain, kv_cache=True), replace(plain, prompt_cache=True)]
    else:  # Dimple's confident decoding, its authors' rule (the Dream family's sampler runs with the prompt cache)
        plain = GenerationConfig(gen_length=16, steps=16, decode="confident", remasking="maskgit_plus",
                                 threshold=0.5)
        cached = [replace(plain, prompt_cache=True)]
    want = answers(checkpoint, files, plain, kept)
    for generation in cached:
        for target in (checkpoint, export):
            assert answers(target, files, generation, kept) == want, (target.name, generation)


def test_without_the_shift_the_cached_tokens_differ(one_layer: tuple[Path, Path, list[str]]) -> None:
    """The same runs with the cached passes at the 1-D positions (the backend's shift taken away): other tokens, on
    both backends, so the tokens above depend on the shift."""
    checkpoint, export, files = one_layer
    generation = GenerationConfig(gen_length=16, steps=16, block_length=8, prompt_cache=True)
    want = answers(checkpoint, files, replace(generation, prompt_cache=False))
    for target in (checkpoint, export):
        service = Service(target, ServiceOptions(generation=generation, batch_size=3))
        service.backend.position_shift = lambda ids, mask: np.zeros(ids.shape[0], np.int64)  # type: ignore[attr-defined]
        assert [a.tokens for a in service.generate(requests(files)).answers] != want


def test_both_builders_take_the_dimple_cache_export(one_layer: tuple[Path, Path, list[str]], tmp_path: Path,
                                                    request: pytest.FixtureRequest) -> None:
    """`build --backend ort` opens every graph's session (the cache graphs' declared inputs = the files'), and
    TensorRT-RTX builds the cache graphs on this CPU with profiles carrying position_shift [batch] (the engines run
    on an RTX-class GPU only, which none of this project's machines has)."""
    from test_tensorrt_build import Handed, check_engine_dir

    from seer_deploy.engines.build import BuildOptions, prepare_build

    export = one_layer[1]
    ort_dir = prepare_build(export, tmp_path / "ort", BuildOptions(backend="ort")).start().out
    assert (ort_dir / "engine.json").is_file()
    built: Handed = request.getfixturevalue("recording")
    options = BuildOptions(backend="tensorrt", trt_library="tensorrt_rtx", buckets=(16,), max_batch=2,
                           max_pictures=2, compute_capabilities=("8.9",))
    engine = prepare_build(export, tmp_path / "trt", options).start().out
    manifest = check_engine_dir(export, engine, options, built)
    trt = manifest.tensorrt
    assert trt is not None and {"window_step", "prompt_step"} <= set(trt.profiles)
    for graph in ("window_step", "prompt_step"):
        for profile in trt.profiles[graph]:
            assert profile["shapes"]["position_shift"]["max"] == [2]


@pytest.mark.parametrize("shift", [np.zeros(3, np.int64), np.zeros(2, np.float32), np.zeros((2, 1), np.int64)],
                         ids=["rows", "dtype", "shape"])
def test_a_shift_that_is_not_one_integer_per_row_is_refused(shift: np.ndarray) -> None:
    from seer_deploy.core.backend import PromptInput, WindowInput
    from seer_deploy.core.errors import ConfigError

    kv = np.zeros((1, 2, 2, 1, 6, 4), np.float32)
    ids, mask = np.zeros((2, 3), np.int64), np.ones((2, 6), np.int64)
    assert np.array_equal(WindowInput(ids, mask, np.array([3, 3]), kv).checked().position_shift, [0, 0])
    for call in (WindowInput(ids, mask, np.array([3, 3]), kv, position_shift=shift),
                 PromptInput(ids, mask, kv[:, :, :, :, :3], prompt_width=4, position_shift=shift)):
        with pytest.raises(ConfigError, match="one integer per row"):
            call.checked()
