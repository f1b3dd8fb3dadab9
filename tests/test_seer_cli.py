"""`calibrate` writes a config that `generate --seer` uses; `inspect` draws a readable PNG (tiny models, seconds)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from matplotlib.image import imread

from seer_deploy.cli import main
from seer_deploy.core.sparsity import STAT_NAMES
from seer_deploy.seer.config import SeerConfig

PROMPTS = ["reverse 12", "sort 987", "count 4444", "filter 1928", "double 31", "reverse 5", "sort 21", "count 7",
           "filter 44", "double 9", "reverse 808", "sort 3141"]


def run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    out = capsys.readouterr()
    return int(exit_info.value.code or 0), out.out, out.err


def test_calibrate_writes_a_config_that_generate_uses(make_checkpoint, tmp_path: Path, capsys) -> None:
    ckpt = make_checkpoint("llada")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "cfg" / "seer.json"
    code, stdout, err = run(["calibrate", str(ckpt), "--prompts", str(prompts), "--gen-length", "8", "--out", str(out),
                             "--target-safe", "0.9", "--batch-size", "5", "--tail-context", "all"], capsys)
    assert code == 0, err
    assert "wrote" in stdout and "validation" in stdout
    cfg = SeerConfig.load(out)
    assert cfg.tail_context == "all"
    cfg = cfg.with_(tail_context=0)  # the paper's cut below; the whole tail in view is checked at the end
    cfg.save(out)
    assert cfg.detector == "fused" and cfg.calibration["n_calibration"] + cfg.calibration["n_validation"] == 12
    assert set(cfg.calibration["detectors"]) == {"eos", "sparsity", "fused"}
    assert cfg.trends and cfg.trends[0].gen_length == 8 and len(cfg.weights) == len(cfg.rows) >= 1
    raw = json.loads(out.read_text())
    assert {"stats_layers", "abs_threshold", "rel_threshold"} <= set(raw)  # what the exporter reads

    # A config with a large margin keeps every slot: the answers equal the run without Seer.
    code, plain, _ = run(["generate", str(ckpt), "-p", "sort 987", "-p", "reverse 5", "--gen-length", "8", "--json",
                          "--no-seer"], capsys)
    assert code == 0 and all("seer" not in json.loads(line) for line in plain.splitlines())
    wide = cfg.with_(margin=8)
    wide.save(tmp_path / "wide.json")
    code, seered, err = run(["generate", str(ckpt), "-p", "sort 987", "-p", "reverse 5", "--gen-length", "8", "--json",
                             "--seer-config", str(tmp_path / "wide.json")], capsys)
    assert code == 0, err
    rows = [json.loads(line) for line in seered.splitlines()]
    assert [r["tokens"] for r in rows] == [json.loads(line)["tokens"] for line in plain.splitlines()]
    assert all(r["seer"]["kept"] == 8 and r["seer"]["detector"] == "fused" for r in rows)

    # The calibrated config itself: each request reports boundary, kept length and work, and the tail is EOS.
    code, seered, err = run(["generate", str(ckpt), "-p", "sort 987", "--gen-length", "8", "--json", "--seer-config",
                             str(out)], capsys)
    assert code == 0, err
    row = json.loads(seered)
    report = row["seer"]
    expected = 8 if report["boundary"] is None else min(8, report["boundary"] + cfg.margin)
    assert report["kept"] == expected and report["tokens_processed"] <= report["full_tokens_processed"]
    assert all(t == 11 for t in row["tokens"][report["kept"] :]) and report["context"] == 0

    # --tail-context: the same cut, the cut slots still in view as committed EOS (more work, same steps).
    code, seered, err = run(["generate", str(ckpt), "-p", "sort 987", "--gen-length", "8", "--json", "--seer-config",
                             str(out), "--tail-context", "all"], capsys)
    assert code == 0, err
    with_tail = json.loads(seered)["seer"]
    assert (with_tail["kept"], with_tail["passes"]) == (report["kept"], report["passes"])
    assert with_tail["context"] == 8 - report["kept"]
    assert with_tail["tokens_processed"] - report["tokens_processed"] == (report["passes"] - 1) * with_tail["context"]
    for bad, message in ((["--tail-context", "most"], "not a count"), (["--no-seer", "--tail-context", "4"], "Seer runs")):
        code, _, err = run(["generate", str(ckpt), "-p", "sort 987", "--gen-length", "8", *bad], capsys)
        assert code == 2 and message in err, err


def test_calibrate_fits_margin_and_tail_context_end_to_end(make_checkpoint, tmp_path: Path, capsys) -> None:
    from seer_deploy.calibration.collect import batched_generation
    from seer_deploy.calibration.detector_fit import split_indices
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.models.checkpoints.checkpoint import load_checkpoint
    from seer_deploy.models.text.tokenizer import Tokenizer
    from seer_deploy.seer.metrics import identical_share, true_lengths

    ckpt = make_checkpoint("llada")
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n")
    out = tmp_path / "seer.json"
    code, stdout, err = run(["calibrate", str(ckpt), "--prompts", str(prompts), "--gen-length", "8", "--out", str(out),
                             "--target-safe", "0.9", "--batch-size", "5", "--target-identical", "1.0",
                             "--identity-tail-contexts", "2,all", "--identity-margin-span", "0"], capsys)
    assert code == 0, err
    cfg = SeerConfig.load(out)
    fit = cfg.calibration["identity_margin"]
    assert (cfg.margin, cfg.tail_context) == (fit["margin"], fit["tail_context"]) and "end to end" in stdout
    tried = [(t["margin"], t["tail_context"]) for t in fit["tried"]]
    safe_margin = cfg.calibration["detectors"]["fused"]["margin"]
    assert tried[0] == (safe_margin, 0)  # a span of 0: the safe margin only, then the contexts, cheapest first
    assert len(tried) >= 2, "the tiny model's cut answers equal full length's: the tail-context path did not run"
    assert tried[1:] == [(safe_margin, c) for c in (2, "all")][: len(tried) - 1]
    assert (fit["identical"] >= 1.0) != fit["rule"].startswith("target not reached")

    # The reported shares are what the reference loop gives with the written config on each half of the prompts.
    model = load_checkpoint(str(ckpt))
    tok = Tokenizer.from_checkpoint(model.path, model.config.eos_id, model.config.eot_id)
    ids = [tok.encode_prompt(t) for t in PROMPTS]
    gen = GenerationConfig(gen_length=8, steps=8)
    full, _ = batched_generation(model.model, ids, gen, batch_size=5)
    stops = {model.config.eos_id} | ({model.config.eot_id} if model.config.eot_id is not None else set())
    true_len = true_lengths(full, stops)
    cal, val = split_indices(len(ids), 0.5, 0)
    for rows, share in ((cal, fit["identical"]), (val, fit["validation_identical"])):
        tokens, _ = batched_generation(model.model, [ids[i] for i in rows], gen, seer=cfg, batch_size=5)
        assert identical_share(tokens, full[rows], true_len[rows]) == pytest.approx(share, abs=1e-4)

    for bad, message in ((["--identity-tail-contexts", "all"], "needs --target-identical"),
                         (["--target-identical", "2"], "must lie in"),
                         (["--target-identical", "0.9", "--identity-margin-span", "-1"], "must be >= 0"),
                         (["--target-identical", "0.9", "--identity-tail-contexts", "x"], "not a count"),
                         (["--gen-length", "4096"], "exceeds the model")):
        code, _, err = run(["calibrate", str(ckpt), "--prompts", str(prompts), "--gen-length", "8", "--out",
                            str(tmp_path / "bad.json"), *bad], capsys)
        assert code == 2 and message in err, err
    assert not (tmp_path / "bad.json").exists()


def test_generate_seer_without_a_calibration_warns(make_checkpoint, capsys) -> None:
    ckpt = make_checkpoint("llada")
    code, out, err = run(["generate", str(ckpt), "-p", "sort 987", "--gen-length", "8", "--seer"], capsys)
    assert code == 0 and "no calibrated Seer config" in err and "tokens processed" in err and "->" in out


def test_inspect_writes_a_png_and_json(make_checkpoint, tmp_path: Path, capsys) -> None:
    ckpt = make_checkpoint("llama")
    png = tmp_path / "fig" / "profile.png"
    code, out, err = run(["inspect", str(ckpt), "--prompt", "reverse 1234", "--gen-length", "16", "--out", str(png),
                          "--json"], capsys)
    assert code == 0, err
    image = imread(png)
    assert image.shape[:2] == (round(100 * (1.9 * 3 + 0.8)), 1100)  # 2 layers + the EOS panel
    rgb = image[..., :3]
    assert rgb.std() > 0.05 and len(np.unique(rgb.reshape(-1, 3), axis=0)) > 50  # not blank: lines and text
    assert [p.name for p in png.parent.iterdir()] == ["profile.png"]  # written atomically
    data = json.loads(out)
    assert data["gen_length"] == 16 and len(data["eos_prob"]) == 16 and 0 <= data["true_end"] <= 16
    assert set(data["stats"]) == {"layer 0", "layer 1"} and set(data["stats"]["layer 1"]) == set(STAT_NAMES)
    for b in data["boundaries"].values():
        assert b["position"] is None or 1 <= b["position"] <= 16
