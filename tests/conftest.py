"""Shared fixtures: tiny random LLaDA-style models and checkpoints written in the real layouts."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch

from seer_deploy.models.checkpoints.checkpoint import Layout, save_checkpoint
from seer_deploy.models.demos.demo_tasks import VOCAB, write_tokenizer
from seer_deploy.models.families.config import ModelConfig
from seer_deploy.models.networks.llada import MaskPredictor


def _divide_the_cores_among_workers() -> None:
    """pytest-xdist runs one worker per core (addopts); torch's default of one thread per core in every worker
    oversubscribes the cores, and its OpenMP threads spin while they wait: measured on two of the demo's test files,
    6 min 34 s -> 5 min 13 s with one thread per worker. Each worker, and the processes its tests start, get their
    share of the cores; a test that asks for threads still gets them."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = max(1, (os.cpu_count() or 1) // workers)
        os.environ.setdefault("OMP_NUM_THREADS", str(share))
        torch.set_num_threads(share)


_divide_the_cores_among_workers()

DEMO_DIR = Path(__file__).resolve().parents[1] / "seer_deploy" / "models" / "demos" / "demo"


def tiny_config(**overrides: object) -> ModelConfig:
    """A 2-layer model over the demo vocabulary (so the demo tokenizer fits it)."""
    ids = {tok: i for i, tok in enumerate(VOCAB)}
    fields: dict[str, object] = {
        "vocab_size": len(VOCAB),
        "d_model": 32,
        "n_layers": 2,
        "n_heads": 4,
        "n_kv_heads": 2,
        "mlp_hidden": 64,
        "max_seq_len": 128,
        "rope_theta": 10000.0,
        "mask_id": ids["<|mdm_mask|>"],
        "eos_id": ids["<|endoftext|>"],
        "pad_id": ids["<|endoftext|>"],
        "bos_id": ids["<|startoftext|>"],
    }
    fields.update(overrides)
    return ModelConfig(**fields)  # type: ignore[arg-type]


def tiny_model(seed: int = 0, **overrides: object) -> MaskPredictor:
    torch.manual_seed(seed)
    model = MaskPredictor(tiny_config(**overrides))
    with torch.no_grad():  # larger than default init so predictions differ across positions
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.2)
    return model.eval()


@pytest.fixture
def make_checkpoint(tmp_path: Path) -> Callable[..., Path]:
    """Write a tiny random model as a checkpoint directory: make_checkpoint(layout='llada', **save_kwargs)."""

    def make(layout: Layout = "llada", name: str | None = None, model: MaskPredictor | None = None, **kwargs: object) -> Path:
        tok = tmp_path / "tokenizer.json"
        if not tok.exists():
            write_tokenizer(tok)
        out = tmp_path / (name or f"ckpt-{layout}")
        save_checkpoint(model or tiny_model(), out, layout, tokenizer_file=tok, **kwargs)  # type: ignore[arg-type]
        return out

    return make


# The demos' exports that several test files read, each traced once per run instead of once per file (tracing is most
# of an export's time, and of CI's): name -> (checkpoint, ExportOptions keywords). Tests read them, never write.
SHARED_DEMO_EXPORTS: dict[str, tuple[str, dict[str, object]]] = {
    "demo": ("demo", {}), "demo-kv": ("demo", {"kv_cache": True}), "demo-vl": ("demo-vl", {})}


def _listing(root: Path) -> dict[str, list[int]]:
    return {str(p.relative_to(root)): [p.stat().st_size, p.stat().st_mtime_ns] for p in sorted(root.rglob("*"))}


@pytest.fixture(scope="session")
def shared_demo_export(tmp_path_factory: pytest.TempPathFactory, worker_id: str) -> Iterator[Callable[[str], Path]]:
    """shared_demo_export(name) -> the demo exported as SHARED_DEMO_EXPORTS[name] says (verified, as `export` does
    by default). Under pytest-xdist the workers share the run's temp root: the first worker to ask exports under a file
    lock, the others wait and read it. At the session's end every file must be as it was exported: a test that wrote
    into a shared export fails the run."""
    from filelock import FileLock

    from seer_deploy.export.exporter import export_checkpoint
    from seer_deploy.export.multimodal import export_multimodal
    from seer_deploy.export.options import ExportOptions

    root = tmp_path_factory.getbasetemp()
    root = (root.parent if worker_id != "master" else root) / "shared-exports"
    root.mkdir(exist_ok=True)
    seen: dict[Path, dict[str, list[int]]] = {}

    def get(name: str) -> Path:
        out = root / name
        with FileLock(str(root / f"{name}.lock")):
            listing = root / f"{name}.listing.json"
            if not listing.exists():
                checkpoint, options = SHARED_DEMO_EXPORTS[name]
                export = export_multimodal if checkpoint == "demo-vl" else export_checkpoint
                export(checkpoint, out, ExportOptions(**options))  # type: ignore[arg-type]
                listing.write_text(json.dumps(_listing(out)))
        seen[out] = json.loads(listing.read_text())
        return out

    yield get
    changed = [str(out) for out, before in seen.items() if _listing(out) != before]
    assert not changed, f"a test wrote into the shared export(s) {changed}: copy it or write elsewhere"


def demo_available() -> bool:
    return (DEMO_DIR / "model.safetensors").is_file()


requires_demo = pytest.mark.skipif(not demo_available(), reason="the demo checkpoint has not been trained yet")


@pytest.fixture
def cli_exit(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], tuple[int, str, str]]:
    """Run the CLI in this process: cli_exit(argv) -> (exit code, stdout, stderr)."""
    from seer_deploy.cli import main

    def run(argv: list[str]) -> tuple[int, str, str]:
        with pytest.raises(SystemExit) as exc:
            main(argv)
        out, err = capsys.readouterr()
        return int(exc.value.code or 0), out, err

    return run
