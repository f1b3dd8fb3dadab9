"""Optimization profile geometry (engines.profiles): each input's ranges per bucket, per (bucket, window) pair and
for the image axes, planned from the axes an export records; which profile a call takes; the device buffers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from seer_deploy.contracts.graphs import PROMPT_STEP, STEP, VISION, WINDOW_STEP, GraphIO, step_graph
from seer_deploy.core.errors import ArtifactError, ConfigError
from seer_deploy.engines.profiles import (
    ImageAxes,
    ProfileLayout,
    WindowLayout,
    buffer_shapes,
    choose_profile,
    choose_profile_for_seq,
    choose_prompt_cache_profile,
    plan_profiles,
    profile_shapes,
    recorded_axes,
    window_profile_shapes,
)

STEP_INPUTS = {
    "input_ids": ["batch", "seq"],
    "attention_mask": ["batch", "seq"],
    "temperature": ["batch"],
    "sample_uniform": ["batch", "seq"],
}
KV = [2, 2, "batch", 2, "seq", 8]  # [layers, 2, batch, kv_heads, seq, head_dim] of a 2-layer model
WINDOW_STEP_INPUTS = {  # as an export --kv-cache records the window_step graph's inputs
    "window_ids": ["batch", "window"],
    "attention_mask": ["batch", "seq"],
    "window_start": ["batch"],
    "kv": KV,
    "temperature": ["batch"],
    "sample_uniform": ["batch", "window"],
}
REFRESH = step_graph(kv_cache=True)
MULTIMODAL_STEP = step_graph(multimodal=True)


def window_axes() -> dict[str, tuple[int | str, ...]]:
    return recorded_axes(WINDOW_STEP_INPUTS)


# ---------------------------------------------------------------- profiles


def test_recorded_axes_are_the_declared_axes_by_name() -> None:
    axes = recorded_axes({"input_ids": ["batch", "seq"], "temperature": ["batch"], "extra": ["batch", 3, "seq"],
                          "image_table": ["image_tokens", 16]})
    assert axes == {"input_ids": ("batch", "seq"), "temperature": ("batch",), "extra": ("batch", 3, "seq"),
                    "image_table": ("image_tokens", 16)}


@pytest.mark.parametrize("inputs", [
    {"input_ids": ["b", "s"]},  # symbols that are not Axis names
    {"input_ids": ["batch", "seq"], "x": ["batch", "other"]},  # unknown dynamic axis
    {"input_ids": ["batch", "seq"], "x": ["batch", -1]},
    {"input_ids": ["batch", 0]},
])
def test_recorded_axes_refuse_what_they_cannot_plan(inputs: dict[str, list[int | str]]) -> None:
    with pytest.raises(ArtifactError, match="planned axes"):
        recorded_axes(inputs)


def test_profile_shapes() -> None:
    layout = ProfileLayout(buckets=(16, 32, 64), max_batch=4, max_prompt=20, min_prompt=2)
    profiles = profile_shapes(layout, recorded_axes(STEP_INPUTS))
    assert [p.index for p in profiles] == [0, 1, 2]
    assert [(p.lo, p.bucket) for p in profiles] == [(0, 16), (16, 32), (32, 64)]
    for p in profiles:
        ids = p.shapes["input_ids"]
        assert ids.min == (1, layout.min_prompt + p.lo + 1)
        assert ids.opt == ids.max == (layout.max_batch, layout.max_prompt + p.bucket)
        assert p.shapes["attention_mask"] == ids == p.shapes["sample_uniform"]
        assert p.shapes["temperature"].min == (1,)
        assert p.shapes["temperature"].max == p.shapes["temperature"].opt == (layout.max_batch,)


@settings(max_examples=40, deadline=None)
@given(
    buckets=st.lists(st.integers(1, 200), min_size=1, max_size=6, unique=True).map(sorted),
    min_prompt=st.integers(1, 10),
    extra_prompt=st.integers(0, 30),
)
def test_every_call_fits_its_chosen_profile(buckets: list[int], min_prompt: int, extra_prompt: int) -> None:
    layout = ProfileLayout(tuple(buckets), max_batch=2, max_prompt=min_prompt + extra_prompt, min_prompt=min_prompt)
    profiles = profile_shapes(layout, recorded_axes(STEP_INPUTS))

    def fits(index: int, seq: int) -> bool:
        r = profiles[index].shapes["input_ids"]
        return r.min[1] <= seq <= r.max[1]

    for kept in range(1, buckets[-1] + 1):
        for prompt in (layout.min_prompt, layout.max_prompt):
            index = choose_profile(kept, layout, prompt_len=prompt, batch=1)
            assert profiles[index].lo < kept <= profiles[index].bucket
            assert fits(index, prompt + kept)
            assert fits(index, prompt + profiles[index].bucket)  # the padded call the runtime makes
    for seq in range(layout.min_prompt + 1, layout.max_prompt + buckets[-1] + 1):
        index = choose_profile_for_seq(seq, layout)
        assert fits(index, seq)
        assert all(not fits(i, seq) for i in range(index))  # the smallest profile that fits


def test_choose_profile_boundaries() -> None:
    layout = ProfileLayout(buckets=(16, 32, 64), max_batch=4, max_prompt=20)
    assert choose_profile(1, layout) == 0
    assert choose_profile(16, layout) == 0  # exactly at a bucket
    assert choose_profile(17, layout) == 1  # one past
    assert choose_profile(64, layout) == 2
    with pytest.raises(ConfigError, match="exceeds the largest bucket 64"):
        choose_profile(65, layout)
    with pytest.raises(ConfigError, match="at least 1"):
        choose_profile(0, layout)
    with pytest.raises(ConfigError, match="prompt width 21"):
        choose_profile(10, layout, prompt_len=21)
    with pytest.raises(ConfigError, match="batch 5"):
        choose_profile(10, layout, batch=5)


def test_choose_profile_for_seq_boundaries() -> None:
    layout = ProfileLayout(buckets=(16, 32, 64), max_batch=4, max_prompt=20)
    assert choose_profile_for_seq(20 + 16, layout) == 0
    assert choose_profile_for_seq(20 + 17, layout) == 1
    assert choose_profile_for_seq(20 + 64, layout) == 2
    with pytest.raises(ConfigError, match="exceeds this engine's largest profile"):
        choose_profile_for_seq(20 + 65, layout)
    with pytest.raises(ConfigError, match="shorter"):
        choose_profile_for_seq(1, layout)
    with pytest.raises(ConfigError, match="batch 0"):
        choose_profile_for_seq(30, layout, batch=0)
    layout.check_batch(None)
    layout.check_batch(4)
    with pytest.raises(ConfigError, match="batch 5 is outside this engine's 1..4"):
        layout.check_batch(5)


def test_device_buffers_hold_the_largest_call_of_any_profile() -> None:
    """TensorRT's buffers are sized once: batch and sequence at the last profile's maximum, fixed dims as built."""
    layout = ProfileLayout(buckets=(16, 32, 64), max_batch=4, max_prompt=20, min_prompt=2)
    assert layout.largest_axes() == {"batch": 4, "seq": 20 + 64, "candidates": 20 + 64, "run": 1 + 64, "cached": 20 - 1}
    engine = {"input_ids": (-1, -1), "attention_mask": (-1, -1), "candidates": (-1, -1), "token_ids": (-1, -1),
              "confidence": (-1, -1), "eos_prob": (-1, -1), "sparsity": (-1, 8, -1)}
    assert buffer_shapes(STEP, layout, engine) == {
        "input_ids": (4, 84), "attention_mask": (4, 84), "candidates": (4, 84), "token_ids": (4, 84),
        "confidence": (4, 84), "eos_prob": (4, 84), "sparsity": (4, 8, 84),
    }
    for profile in profile_shapes(layout, recorded_axes(STEP_INPUTS)):  # every profile's calls fit
        assert all(a <= b for a, b in zip(profile.shapes["input_ids"].max, (4, 84), strict=True))
    # TensorRT drops inputs nothing reads (the engine may lack `temperature`); only what it has gets a buffer.
    assert buffer_shapes(STEP, layout, {"input_ids": (-1, -1), "token_ids": (-1, -1)}) == {
        "input_ids": (4, 84), "token_ids": (4, 84)}


@pytest.mark.parametrize(("graph", "engine", "message"), [
    (STEP, {"logits": (-1, -1, 126)}, "does not declare"),
    (STEP, {"sparsity": (-1, -1)}, "rank 2"),
    (STEP, {"sparsity": (-1, -1, -1)}, "dim 1 = -1"),  # the declared stats rows are fixed in the engine
    (MULTIMODAL_STEP, {"image_table": (-1, 32)}, "batch and sequence axes only"),  # a text layout: no image axes
])
def test_buffer_shapes_refuse_an_engine_that_is_not_the_declared_graph(
    graph: GraphIO, engine: dict[str, tuple[int, ...]], message: str
) -> None:
    with pytest.raises(ArtifactError, match=message):
        buffer_shapes(graph, ProfileLayout((16,), 1, 8), engine)


def test_layout_validation() -> None:
    ProfileLayout((16, 32), max_batch=1, max_prompt=96).validate(max_seq_len=128)
    with pytest.raises(ConfigError, match="exceeds the model's 128 positions"):
        ProfileLayout((16, 32), max_batch=1, max_prompt=97).validate(max_seq_len=128)
    for bad in (ProfileLayout((32, 16), 1, 8), ProfileLayout((16,), 0, 8), ProfileLayout((16,), 1, 8, min_prompt=9),
                ProfileLayout((), 1, 8)):
        with pytest.raises(ConfigError):
            bad.validate()


def test_window_axes_from_manifest_shapes() -> None:
    axes = window_axes()
    assert axes["window_ids"] == axes["sample_uniform"] == ("batch", "window")
    assert axes["kv"] == (2, 2, "batch", 2, "seq", 8) and axes["attention_mask"] == ("batch", "seq")
    assert axes["window_start"] == ("batch",)
    with pytest.raises(ConfigError, match="window_profile_shapes"):
        profile_shapes(ProfileLayout((16,), 1, 8), axes)


def test_window_profiles_cover_bucket_by_window_pairs() -> None:
    layout = ProfileLayout(buckets=(16, 32, 64, 128), max_batch=4, max_prompt=20, min_prompt=20)
    windows = WindowLayout(layout, (32, 128))
    # A bucket's calls have at most max_prompt + bucket - min_prompt = bucket response columns here: windows wider
    # than 32 only in buckets 64 and 128, capped at the bucket.
    assert windows.pairs() == [(0, 0), (1, 0), (2, 0), (2, 1), (3, 0), (3, 1)]
    assert windows.profile_count == 6
    assert [windows.window_range(i, j) for i, j in windows.pairs()] == [
        (1, 16), (1, 32), (1, 32), (33, 64), (1, 32), (33, 128)]
    profiles = window_profile_shapes(windows, window_axes())
    assert [p.index for p in profiles] == list(range(6))
    assert [(p.bucket, p.window_lo, p.window) for p in profiles] == [
        (16, 1, 16), (32, 1, 32), (64, 1, 32), (64, 33, 64), (128, 1, 32), (128, 33, 128)]
    step = profile_shapes(layout, recorded_axes(STEP_INPUTS))
    for p in profiles:
        seq = step[layout.buckets.index(p.bucket)].shapes["input_ids"]  # the bucket's sequence range, as step's
        mask = p.shapes["attention_mask"]
        assert mask.max == mask.opt == seq.max and mask.min == (1, max(seq.min[1], 20 + p.window_lo))
        assert p.shapes["window_ids"].min == (1, p.window_lo) and p.shapes["window_ids"].max == (4, p.window)
        assert p.shapes["window_ids"].opt == p.shapes["window_ids"].max == p.shapes["sample_uniform"].max
        kv = p.shapes["kv"]  # batch and sequence follow the profile, the model's sizes stay
        assert kv.min == (2, 2, 1, 2, mask.min[1], 8) and kv.opt == kv.max == (2, 2, 4, 2, seq.max[1], 8)
        assert p.shapes["window_start"].min == (1,) and p.shapes["window_start"].max == (4,)
    # With a wide prompt range every pair is reachable (a short prompt leaves room for wide windows); a pair's
    # shortest sequence holds the narrowest prompt and its narrowest window.
    wide = WindowLayout(ProfileLayout((16, 32), 1, 40), (8, 32))
    assert wide.pairs() == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [wide.seq_range(i, j) for i, j in wide.pairs()] == [(2, 56), (10, 56), (18, 72), (18, 72)]


def test_choose_window_profile_boundaries() -> None:
    layout = ProfileLayout(buckets=(16, 32, 64), max_batch=4, max_prompt=20, min_prompt=20)
    windows = WindowLayout(layout, (8, 32))
    pairs = windows.pairs()
    assert pairs == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    assert windows.choose(20 + 16, 8) == pairs.index((0, 0))
    assert windows.choose(20 + 16, 9) == pairs.index((0, 1))  # one past a window length
    assert windows.choose(20 + 17, 8) == pairs.index((1, 0))  # one past a bucket
    assert windows.choose(20 + 64, 32, batch=4) == pairs.index((2, 1))
    with pytest.raises(ConfigError, match="window 33 is wider than this engine's widest window 32"):
        windows.choose(20 + 64, 33)
    with pytest.raises(ConfigError, match="at least one column"):
        windows.choose(30, 0)
    with pytest.raises(ConfigError, match="exceeds this engine's largest profile"):
        windows.choose(20 + 65, 8)
    with pytest.raises(ConfigError, match="batch 5"):
        windows.choose(30, 8, batch=5)
    with pytest.raises(ConfigError, match="10 response columns a sequence of 30 has with prompts of at least 20"):
        windows.choose(30, 17)  # a 17-column window in a 30-long sequence needs a prompt narrower than the build's
    with pytest.raises(ConfigError, match="10 response columns"):
        windows.choose(30, 11)  # the same, inside the widest window


@settings(max_examples=40, deadline=None)
@given(
    buckets=st.lists(st.integers(1, 80), min_size=1, max_size=4, unique=True).map(sorted),
    windows=st.lists(st.integers(1, 80), min_size=1, max_size=3, unique=True).map(sorted),
    min_prompt=st.integers(1, 6),
    extra_prompt=st.integers(0, 12),
)
def test_every_cached_call_fits_its_chosen_window_profile(buckets: list[int], windows: list[int], min_prompt: int,
                                                          extra_prompt: int) -> None:
    """Every call a prompt of the engine's widths makes (window <= its response columns, <= the widest window) gets a
    profile whose ranges hold it, the narrowest one that does; the build plans exactly those profiles."""
    layout = ProfileLayout(tuple(buckets), max_batch=2, max_prompt=min_prompt + extra_prompt, min_prompt=min_prompt)
    windows = [w for w in windows if w <= buckets[-1]] or [buckets[-1]]
    plan = WindowLayout(layout, tuple(windows))
    profiles = window_profile_shapes(plan, window_axes())
    assert len(profiles) == plan.profile_count

    def fits(index: int, seq: int, window: int) -> bool:
        mask, ids = profiles[index].shapes["attention_mask"], profiles[index].shapes["window_ids"]
        return mask.min[1] <= seq <= mask.max[1] and ids.min[1] <= window <= ids.max[1]

    for prompt in {layout.min_prompt, layout.max_prompt}:
        for response in range(1, buckets[-1] + 1):
            seq = prompt + response
            for window in range(1, min(response, windows[-1]) + 1):
                index = plan.choose(seq, window, batch=2)
                assert fits(index, seq, window)
                assert profiles[index].window == min(w for w in (p.window for p in profiles
                                                                 if fits(p.index, seq, window)))


def test_window_layout_validation() -> None:
    layout = ProfileLayout((16, 32), max_batch=1, max_prompt=8)
    WindowLayout(layout, (16, 32)).validate()
    for bad, message in (((), "ascending"), ((32, 16), "ascending"), ((0, 16), "positive"),
                         ((16, 33), "exceeds the last bucket 32")):
        with pytest.raises(ConfigError, match=message):
            WindowLayout(layout, bad).validate()


def test_cache_engine_buffers_hold_the_largest_call() -> None:
    """refresh: its kv output at the largest batch and sequence; window_step: the window axes at the widest window."""
    layout = ProfileLayout(buckets=(16, 32, 64), max_batch=4, max_prompt=20, min_prompt=2)
    dyn = (-1, -1)
    kv = (2, 2, -1, 2, -1, 8)
    refresh = {"input_ids": dyn, "attention_mask": dyn, "temperature": (-1,), "sample_uniform": dyn,
               "candidates": dyn, "with_stats": (-1,), "token_ids": dyn, "confidence": dyn, "kv": kv}
    assert buffer_shapes(REFRESH, layout, refresh)["kv"] == (2, 2, 4, 2, 84, 8)
    windows = WindowLayout(layout, (16, 32))
    assert windows.largest_axes() == {"batch": 4, "seq": 84, "candidates": 84, "run": 65, "cached": 19, "window": 32}
    window = {"window_ids": dyn, "attention_mask": dyn, "window_start": (-1,), "kv": kv, "temperature": (-1,),
              "sample_uniform": dyn, "token_ids": dyn, "confidence": dyn}
    assert buffer_shapes(WINDOW_STEP, windows, window) == {
        "window_ids": (4, 32), "attention_mask": (4, 84), "window_start": (4,), "kv": (2, 2, 4, 2, 84, 8),
        "temperature": (4,), "sample_uniform": (4, 32), "token_ids": (4, 32), "confidence": (4, 32)}
    for profile in window_profile_shapes(windows, window_axes()):  # every profile's calls fit the buffers
        assert all(a <= b for a, b in zip(profile.shapes["window_ids"].max, (4, 32), strict=True))
        assert all(a <= b for a, b in zip(profile.shapes["kv"].max, (2, 2, 4, 2, 84, 8), strict=True))
    with pytest.raises(ArtifactError, match="batch and sequence axes only"):
        buffer_shapes(WINDOW_STEP, layout, window)  # a window axis needs a WindowLayout
    with pytest.raises(ArtifactError, match="kv has dim 3 = 4, declared kv_heads|dim"):
        buffer_shapes(REFRESH, layout, {"kv": (2, 2, -1, -1, -1, 8)})


def test_plan_profiles_follows_the_axes_a_graph_records() -> None:
    """Any graph an export lists is planned from its recorded axes: a window axis -> (bucket, window) pairs, a
    sequence axis -> one per bucket, neither (pictures) -> one; image axes from the layout's ImageAxes."""
    images = ImageAxes(image_tokens=48, images=3)
    layout = ProfileLayout(buckets=(16, 32), max_batch=2, max_prompt=24, min_prompt=2, images=images)
    step = plan_profiles("step", {**STEP_INPUTS, "image_table": ["image_tokens", 16]}, layout)
    assert [(p.index, p.bucket) for p in step] == [(0, 16), (1, 32)]
    assert all(p.shapes["image_table"].min == (1, 16) and p.shapes["image_table"].max == (48, 16) for p in step)
    assert step[1].shapes["input_ids"].min == (1, 2 + 16 + 1) and step[1].shapes["input_ids"].max == (2, 24 + 32)
    (vision,) = plan_profiles("vision", {"pixel_values": ["images", 3, 8, 8]}, layout)
    assert vision.bucket == 0 and vision.shapes["pixel_values"].min == (1, 3, 8, 8)
    assert vision.shapes["pixel_values"].opt == vision.shapes["pixel_values"].max == (3, 3, 8, 8)
    windows = WindowLayout(layout, (8, 32))
    assert len(plan_profiles("window_step", WINDOW_STEP_INPUTS, layout, windows)) == windows.profile_count
    with pytest.raises(ConfigError, match="needs window lengths"):
        plan_profiles("window_step", WINDOW_STEP_INPUTS, layout)
    with pytest.raises(ConfigError, match="has image axes"):
        plan_profiles("vision", {"pixel_values": ["images", 3, 8, 8]}, ProfileLayout((16,), 1, 8))
    with pytest.raises(ConfigError, match="--max-pictures"):
        ProfileLayout((16,), 1, 8, images=ImageAxes(0, 1)).validate()
    # The buffers of a multimodal engine hold its largest image table; the vision graph's its largest call.
    assert buffer_shapes(MULTIMODAL_STEP, layout, {"image_table": (-1, 16)}) == {"image_table": (48, 16)}
    assert buffer_shapes(VISION, layout, {"pixel_values": (-1, 3, 8, 8)}) == {"pixel_values": (3, 3, 8, 8)}


PROMPT_STEP_INPUTS = {  # as an export --kv-cache records the prompt_step graph's inputs
    "run_ids": ["batch", "run"],
    "attention_mask": ["batch", "seq"],
    "prompt_kv": [2, 2, "batch", 2, "cached", 8],
    "temperature": ["batch"],
    "sample_uniform": ["batch", "run"],
    "candidates": ["batch", "candidates"],
    "prompt_width": ["batch"],
}


def test_prompt_cache_profiles_follow_the_buckets() -> None:
    """prompt_step: one profile per bucket, its run the last prompt token and the bucket's responses, its cache the
    prompts less that token; a call takes the profile of its responses' bucket, every call's shapes inside it."""
    layout = ProfileLayout(buckets=(16, 32), max_batch=4, max_prompt=40, min_prompt=3)
    profiles = plan_profiles("prompt_step", PROMPT_STEP_INPUTS, layout)
    assert [p.bucket for p in profiles] == [16, 32]
    assert [(p.shapes["run_ids"].min, p.shapes["run_ids"].max) for p in profiles] == [((1, 2), (4, 17)),
                                                                                      ((1, 18), (4, 33))]
    assert {(p.shapes["prompt_kv"].min[4], p.shapes["prompt_kv"].max[4]) for p in profiles} == {(2, 39)}
    for prompt in (3, 20, 40):
        for response in (1, 16, 17, 32):
            index = choose_prompt_cache_profile(prompt - 1, response + 1, layout, batch=4)
            shapes = profiles[index].shapes
            call = {"run_ids": (4, response + 1), "attention_mask": (4, prompt + response),
                    "prompt_kv": (2, 2, 4, 2, prompt - 1, 8)}
            for name, shape in call.items():
                assert all(lo <= d <= hi for lo, d, hi in zip(shapes[name].min, shape, shapes[name].max, strict=True))
    with pytest.raises(ConfigError, match="nothing to cache"):
        choose_prompt_cache_profile(0, 5, layout)
    with pytest.raises(ConfigError, match="--max-prompt"):
        choose_prompt_cache_profile(45, 5, layout)
    assert buffer_shapes(PROMPT_STEP, layout, {"prompt_kv": (2, 2, -1, 2, -1, 8), "run_ids": (-1, -1)}) == {
        "prompt_kv": (2, 2, 4, 2, 39, 8), "run_ids": (4, 33)}
