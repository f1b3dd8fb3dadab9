"""Decisions made once: the statistics an export computes are the Seer config's, and a run refuses a config that
reads statistics its export did not compute (issue 43)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.core.sparsity import StatsSpec
from seer_deploy.export.exporter import export_checkpoint
from seer_deploy.export.options import ExportOptions
from seer_deploy.seer.config import SeerConfig

PROMPT = "sort 31415926"
CALIBRATED = SeerConfig(detector="fused", stats_layers=(1,), abs_threshold=0.02, rel_threshold=0.1,
                        rows=((1, "frac_h_rel"),))


@pytest.fixture(scope="module")
def exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny checkpoint that ships a seer.json, exported with the defaults, and its twin without one."""
    from conftest import tiny_model

    from seer_deploy.models.checkpoints.checkpoint import save_checkpoint
    from seer_deploy.models.demos.demo_tasks import write_tokenizer

    root = tmp_path_factory.mktemp("decide-once")
    write_tokenizer(root / "tokenizer.json")
    out: dict[str, Path] = {}
    for name, seer in (("shipped", CALIBRATED), ("plain", None)):
        ckpt = save_checkpoint(tiny_model(), root / f"ckpt-{name}", "llada", tokenizer_file=root / "tokenizer.json")
        if seer is not None:
            seer.save(ckpt / "seer.json")
        out[f"{name}-ckpt"] = ckpt
        out[name] = export_checkpoint(ckpt, root / f"export-{name}", ExportOptions()).out
    return out


def test_an_export_computes_the_shipped_seer_configs_statistics(exports: dict[str, Path]) -> None:
    assert ExportManifest.load(exports["shipped"]).seer == StatsSpec((1,), 0.02, 0.1)
    assert ExportManifest.load(exports["plain"]).seer == StatsSpec((0, 1), 0.05, 0.05)  # no config: every layer


def test_a_seer_config_at_other_thresholds_is_refused_in_one_line(
        exports: dict[str, Path], tmp_path: Path, cli_exit: Callable[[list[str]], tuple[int, str, str]]) -> None:
    config = tmp_path / "seer.json"
    CALIBRATED.save(config)  # reads layer 1 at 0.02 / 0.1; the plain export computed every layer at 0.05 / 0.05
    code, out, err = cli_exit(["generate", str(exports["plain"]), "-p", PROMPT, "--gen-length", "16",
                               "--seer-config", str(config)])
    assert code == 2 and out == ""
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "abs 0.02 / rel 0.1" in lines[0] and "abs 0.05 / rel 0.05" in lines[0] and "--seer-config" in lines[0]
    # Same thresholds, a layer the export lacks: refused too; the matching config runs.
    CALIBRATED.with_(stats_layers=(0,), rows=((0, "frac_h_rel"),)).save(config)
    code, _, err = cli_exit(["generate", str(exports["shipped"]), "-p", PROMPT, "--gen-length", "16",
                             "--seer-config", str(config)])
    assert code == 2 and "layers [0], computed for layers [1] only" in err
    code, out, err = cli_exit(["generate", str(exports["shipped"]), "-p", PROMPT, "--gen-length", "16", "--seer"])
    assert code == 0, err
    # An EOS-only detector reads no statistics: any export serves it.
    CALIBRATED.with_(detector="eos").save(config)
    code, _, err = cli_exit(["generate", str(exports["plain"]), "-p", PROMPT, "--gen-length", "16",
                             "--seer-config", str(config)])
    assert code == 0, err


def test_the_shipped_config_runs_on_its_export_as_on_its_checkpoint(exports: dict[str, Path]) -> None:
    """The export's default statistics are the checkpoint's own seer.json's, so Seer cuts as torch does."""
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.service import Prompt, SeerOptions, ServiceOptions, generate

    options = ServiceOptions(generation=GenerationConfig(gen_length=16, steps=16), seer=SeerOptions(on=True))
    prompts = [Prompt(PROMPT), Prompt("reverse 8675309")]
    torch_run = generate(prompts, exports["shipped-ckpt"], options)
    ort_run = generate(prompts, exports["shipped"], options)
    assert [a.tokens for a in ort_run.answers] == [a.tokens for a in torch_run.answers]
    assert [a.seer.kept for a in ort_run.answers if a.seer] == [a.seer.kept for a in torch_run.answers if a.seer]


class Counts:
    """How often a run opens each file named in `files` (an audit hook: every open, whoever does it) and calls the
    patched functions."""

    def __init__(self, files: tuple[str, ...]) -> None:
        import sys

        self.files = files
        self.seen: dict[str, int] = {}
        self.on = False
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple[object, ...]) -> None:
        if self.on and event == "open" and isinstance(args[0], str | Path):
            name = Path(args[0]).name
            if name in self.files:
                self.seen[name] = self.seen.get(name, 0) + 1

    def count(self, monkeypatch: pytest.MonkeyPatch, owner: object, name: str, label: str) -> None:
        original = getattr(owner, name)

        def counted(*args: object, **kwargs: object) -> object:
            if self.on:
                self.seen[label] = self.seen.get(label, 0) + 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, counted)


def test_one_generate_on_an_export_reads_and_builds_each_thing_once(
        exports: dict[str, Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        cli_exit: Callable[[list[str]], tuple[int, str, str]]) -> None:
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.models.text.tokenizer import Tokenizer
    from seer_deploy.runtime import targets

    counts = Counts(("config.json", "manifest.json", "tokenizer.json", "seer.json"))
    counts.count(monkeypatch, targets.Description, "__init__", "described")
    counts.count(monkeypatch, Tokenizer, "__init__", "tokenizer built")
    counts.count(monkeypatch, GenerationConfig, "check_fits", "validated")  # settings: checked when made
    template = tmp_path / "chat.jinja"
    template.write_text("{{ messages[0].content }}")
    for extra in ([], ["--chat-template", str(template)]):  # a chosen template: still one tokenizer
        counts.seen.clear()
        counts.on = True
        code, _, err = cli_exit(["generate", str(exports["shipped"]), "-p", PROMPT, "--gen-length", "16", "--seer",
                                 *extra])
        counts.on = False
        assert code == 0, err
        assert counts.seen == {"described": 1, "manifest.json": 1, "tokenizer.json": 1, "tokenizer built": 1,
                               "validated": 1, "seer.json": 1}, extra


def test_one_served_chat_request_reads_and_builds_each_thing_once(exports: dict[str, Path],
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """From opening the service to one chat request's answer: the target described, its manifest read, the tokenizer
    built and the request checked once each (the server prepares a request once: serve/responder)."""
    import httpx

    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.models.text.tokenizer import Tokenizer
    from seer_deploy.runtime import targets
    from seer_deploy.serve import BackgroundServer, ServeOptions, create_app
    from seer_deploy.service import Service, ServiceOptions

    counts = Counts(("config.json", "manifest.json", "tokenizer.json", "seer.json"))
    counts.count(monkeypatch, targets.Description, "__init__", "described")
    counts.count(monkeypatch, Tokenizer, "__init__", "tokenizer built")
    counts.count(monkeypatch, GenerationConfig, "check_fits", "validated")
    counts.on = True
    service = Service(exports["shipped"], ServiceOptions(generation=GenerationConfig(gen_length=16, steps=16)))
    with BackgroundServer(create_app(service, ServeOptions(model_name="tiny"))) as running:
        reply = httpx.post(f"{running.url}/v1/chat/completions", timeout=600,
                           json={"model": "tiny", "max_tokens": 16, "messages": [{"role": "user", "content": PROMPT}]})
        counts.on = False
    assert reply.status_code == 200, reply.text
    assert reply.json()["usage"]["passes"] >= 1
    assert counts.seen == {"described": 1, "manifest.json": 1, "tokenizer.json": 1, "tokenizer built": 1,
                           "validated": 1, "seer.json": 1}, counts.seen
