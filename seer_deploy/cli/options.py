"""Click option groups shared by the verbs, each declared once here: how to open a target, Seer, generation and
decoding, the seed, the chat template; and the server's limits (serve's alone, built into its `ServeOptions`).

A group is a decorator: it adds its options to a command and hands the command ONE typed object built from them
(`TargetOptions`, `SeerOptions`, a validated `GenerationConfig`, the seed, a `TemplateChoice`), so a verb's
signature names what it takes, not a dozen scalars, and a flag means the same in every verb. A verb may expose only
some of a group's flags (`target_options("threads")`) and give one its own default or help
(`threads={"default": 0}`); the flags it leaves out take the group's defaults. A verb never declares a group's flag
itself (tests/test_code_shape.py checks).

`--steps` and `--block-length` default to gen-length only when they are not given: `--steps 0` is an error, not
"the default". The generation group validates the whole set, so a bad flag stops a verb before any work starts.
Nothing heavy is imported here: the objects' modules load when a command runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from seer_deploy.core.backend_names import BACKEND_CHOICES
from seer_deploy.core.decoding_names import DECODE_CHOICES, REMASKING_CHOICES

if TYPE_CHECKING:
    from seer_deploy.core.generation import GenerationConfig
    from seer_deploy.runtime.targets import TargetOptions, TemplateChoice
    from seer_deploy.seer.options import SeerOptions
    from seer_deploy.serve.options import ServeOptions

Command = TypeVar("Command", bound=Callable[..., Any])


class GroupOption(click.Option):
    """An option a shared group added (not one a verb declared itself): what the CLI's shape test tells apart."""

    def __init__(self, *args: Any, group: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.group = group


@dataclass(frozen=True)
class Flag:
    """One option of a group: its declarations (flags and the parameter name) and click's settings for it."""

    decls: tuple[str, ...]
    settings: dict[str, Any] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.decls[-1]


@dataclass(frozen=True)
class OptionGroup:
    """Options declared once, built into one object (`build` gets every flag's value, the group's defaults for the
    flags a verb does not expose) and handed to the command as the keyword `name`."""

    name: str
    flags: tuple[Flag, ...]
    build: Callable[[dict[str, Any]], Any]

    @property
    def option_names(self) -> frozenset[str]:
        """Every flag this group declares ('--threads', '--seer', '--no-seer', ...)."""
        return frozenset(opt for flag in self.flags for decl in flag.decls[:-1] for opt in decl.split("/") if opt)

    def __call__(self, *only: str, **overrides: Mapping[str, Any]) -> Callable[[Command], Command]:
        """The decorator adding the flags named in `only` (all when none is), `overrides[name]` on top of a flag's
        settings (its default, help, choices)."""
        known = {flag.name for flag in self.flags}
        unknown = sorted((set(only) | set(overrides)) - known)
        if unknown:
            raise ValueError(f"option group {self.name!r} has no flag {unknown[0]!r}; it has {sorted(known)}")
        chosen = [flag for flag in self.flags if not only or flag.name in only]
        settings = {flag.name: {**flag.settings, **overrides.get(flag.name, {})} for flag in self.flags}

        def decorate(func: Command) -> Command:
            @functools.wraps(func)
            def command(*args: Any, **kwargs: Any) -> Any:
                values = {name: spec.get("default") for name, spec in settings.items()}
                values |= {flag.name: kwargs.pop(flag.name) for flag in chosen}
                return func(*args, **kwargs, **{self.name: self.build(values)})

            command.__click_params__ = list(getattr(func, "__click_params__", []))  # type: ignore[attr-defined]
            decorated: Any = command
            for flag in reversed(chosen):
                decorated = click.option(*flag.decls, cls=GroupOption, group=self.name, **settings[flag.name])(decorated)
            return decorated  # type: ignore[no-any-return]

        return decorate


def _target(values: dict[str, Any]) -> TargetOptions:
    from seer_deploy.runtime.targets import TargetOptions

    options = TargetOptions(backend=values["backend"], providers=tuple(values["providers"]) or None,
                            threads=values["threads"], device=values["device"], io_binding=values["io_binding"],
                            cuda_graph=values["cuda_graph"])
    options.check()
    return options


target_options = OptionGroup("target_options", (
    Flag(("--backend", "backend"), {"type": click.Choice(BACKEND_CHOICES), "default": None,
                                    "help": "torch, ort or tensorrt [default: the target's own: checkpoint torch, "
                                            "export directory ort, engine directory what it was built for]."}),
    Flag(("--provider", "providers"), {"multiple": True, "default": (),
                                       "help": "ONNX Runtime provider, in order of preference (repeat) [default: the "
                                               "engine's, else CUDA if available, else CPU]. Export and ONNX Runtime "
                                               "engine targets only."}),
    Flag(("--threads", "threads"), {"type": int, "default": None,
                                    "help": "Intra-op threads: ONNX Runtime's session, or torch's for a checkpoint "
                                            "[default: the engine's, else the library's]. Not for TensorRT engines."}),
    Flag(("--device", "device"), {"default": None, "metavar": "cpu|cuda[:N]",
                                  "help": "Where the model runs: torch's device for a checkpoint, the CUDA provider's "
                                          "GPU for ONNX Runtime, the GPU of a TensorRT engine [default: torch cpu; "
                                          "ONNX Runtime CUDA if installed; TensorRT GPU 0]."}),
    Flag(("--io-binding", "io_binding"), {"is_flag": True, "default": False,
                                          "help": "ONNX Runtime: bind inputs and outputs to buffers kept on the device "
                                                  "per call shape; only the chosen tokens and their confidence come "
                                                  "back to the host. Pays off on CUDA."}),
    Flag(("--cuda-graph", "cuda_graph"), {"is_flag": True, "default": False,
                                          "help": "ONNX Runtime on CUDA or TensorRT: capture the step graph once per "
                                                  "call shape as a CUDA graph and replay it (calls padded to fixed "
                                                  "shapes: batch to a power of two, sequence to a multiple of 32)."}),
), _target)


def _seer(values: dict[str, Any]) -> SeerOptions:
    from seer_deploy.seer.config import parse_tail_context
    from seer_deploy.seer.options import SeerOptions

    tail = values["tail_context"]
    return SeerOptions(on=values["on"], config=values["config"],
                       tail_context=None if tail is None else parse_tail_context(tail),
                       first_canvas=values["first_canvas"])


seer_options = OptionGroup("seer", (
    Flag(("--seer/--no-seer", "on"), {"default": None,
                                      "help": "Truncate each response after step zero [default: on when a calibrated "
                                              "Seer config is found]."}),
    Flag(("--seer-config", "config"), {"type": click.Path(exists=True, dir_okay=False, path_type=Path),
                                       "default": None,
                                       "help": "Seer config from `seer-deploy calibrate` [default: the target's own, "
                                               "if any]."}),
    Flag(("--tail-context", "tail_context"), {"default": None, "metavar": "N|all",
                                              "help": "Seer: cut slots the later steps still run, as committed EOS. 0 "
                                                      "is the paper's cut (fastest); 'all' keeps the whole cut tail in "
                                                      "view (every step at full length, the steps still the cut's; on "
                                                      "the demo the answers then equal full length's) [default: the "
                                                      "Seer config's]."}),
    Flag(("--first-canvas", "first_canvas"), {"type": int, "default": None, "metavar": "N",
                                              "help": "Seer: progressive step zero. Run step zero on N response slots "
                                                      "first; rows whose end lies inside are planned from it, the "
                                                      "others run step zero at full --gen-length (0: off) [default: "
                                                      "the Seer config's]."}),
), _seer)


def _generation(values: dict[str, Any]) -> GenerationConfig:
    """The GenerationConfig of the flags (it checks itself when made: a ConfigError naming the flag); an unset
    --steps means gen-length, an unset --block-length one block. An unset --decode / --remasking is LLaDA's here and
    the family's own once the target is open (`family_rule`); a Dream rule named alone brings Dream's sampler."""
    from seer_deploy.core.decoding_names import DREAM_DECODES, DREAM_REMASKING
    from seer_deploy.core.generation import GenerationConfig

    steps, decode, remasking = values["steps"], values["decode"], values["remasking"]
    family_rule = decode is None and remasking is None and values["block_length"] is None and not values["kv_cache"]
    if decode is None:
        decode = "timesteps" if remasking in DREAM_REMASKING else "fixed"
    if remasking is None:
        remasking = "maskgit_plus" if decode in DREAM_DECODES else "low_confidence"
    return GenerationConfig(**(values | {"steps": values["gen_length"] if steps is None else steps, "decode": decode,
                                         "remasking": remasking, "family_rule": family_rule}))


generation_options = OptionGroup("generation", (
    Flag(("--gen-length", "gen_length"), {"type": int, "default": 64, "show_default": True,
                                          "help": "Response slots (masks) to fill."}),
    Flag(("--steps", "steps"), {"type": int, "default": None, "help": "Denoising steps [default: gen-length]."}),
    Flag(("--block-length", "block_length"), {"type": int, "default": None,
                                              "help": "Semi-autoregressive block [default: gen-length]."}),
    Flag(("--temperature", "temperature"), {"type": float, "default": 0.0, "show_default": True,
                                            "help": "0 = greedy (deterministic)."}),
    Flag(("--remasking", "remasking"), {"type": click.Choice(REMASKING_CHOICES), "default": None,
                                        "help": "How each step picks the tokens it commits: LLaDA's low_confidence / "
                                                "random, or with the Dream family's --decode timesteps / confident "
                                                "Dream's alg: origin, maskgit_plus, topk_margin, entropy [default: the "
                                                "family's own, as its authors' evaluation runs it: LLaDA "
                                                "low_confidence, Dream entropy, Dimple maskgit_plus, LaViDa-Dream "
                                                "topk_margin]."}),
    Flag(("--cfg-scale", "cfg_scale"), {"type": float, "default": 0.0, "show_default": True,
                                        "help": "Classifier-free guidance."}),
    Flag(("--decode", "decode"), {"type": click.Choice(DECODE_CHOICES), "default": None,
                                  "help": "fixed: LLaDA's even split of --steps per block. threshold / factor: "
                                          "Fast-dLLM's parallel decoding, each step commits every candidate the rule "
                                          "accepts (at least one) and a block ends when it has no masks, so the steps "
                                          "follow the model's confidence (--steps unused). timesteps: Dream's sampler "
                                          "(no blocks; step i of --steps commits int(masks * (1 - t[i+1] / t[i])), t = "
                                          "linspace(1, --eps, steps + 1)). confident: Dimple's confident decoding "
                                          "(every mask scoring above --threshold, else the schedule re-anchored at "
                                          "the masks left; it stops when none is left) [default: the family's own: "
                                          "LLaDA fixed, the Dream family timesteps]."}),
    Flag(("--threshold", "threshold"), {"type": float, "default": 0.9, "show_default": True,
                                        "help": "--decode threshold: commit the candidates whose probability is at "
                                                "least this; --decode confident: those whose score is above it "
                                                "(Dimple's alg_p_threshold)."}),
    Flag(("--eps", "eps"), {"type": float, "default": 1e-3, "show_default": True,
                            "help": "--decode timesteps / confident: the last timestep, in (0, 1)."}),
    Flag(("--alg-temp", "alg_temp"), {"type": float, "default": 0.0, "show_default": True,
                                      "help": "--decode timesteps / confident: > 0 draws the committed positions from "
                                              "softmax(score / alg-temp) instead of taking the top scores."}),
    Flag(("--top-p", "top_p"), {"type": float, "default": None,
                                "help": "--decode timesteps / confident: nucleus filter before the softmax, in (0, 1] "
                                        "(the torch backend only: the graphs return no vocabulary)."}),
    Flag(("--top-k", "top_k"), {"type": int, "default": None,
                                "help": "--decode timesteps / confident: top-k filter before the softmax (torch "
                                        "backend only)."}),
    Flag(("--factor", "factor"), {"type": float, "default": 1.0, "show_default": True,
                                  "help": "--decode factor: commit the top n while the n-th probability is >= 1 - "
                                          "factor / (n + 1)."}),
    Flag(("--kv-cache", "kv_cache"), {"is_flag": True, "default": False,
                                      "help": "Block-wise dual KV cache (Fast-dLLM): refresh the keys and values at "
                                              "each block's first step, run only the block in the others. Needs an "
                                              "export made with --kv-cache (or torch); an approximation: answers may "
                                              "differ from the uncached run's. Pair it with --block-length (Fast-dLLM "
                                              "uses 32)."}),
    Flag(("--prompt-cache", "prompt_cache"), {"is_flag": True, "default": False,
                                              "help": "Prompt cache: step zero's keys and values of the prompt (all "
                                                      "but its last token) are kept and every later pass runs the last "
                                                      "prompt token and the answer only. Exact with prefix-DLM "
                                                      "attention (LaViDa: its authors' cache); elsewhere Dimple's "
                                                      "prefilling, an approximation. Needs an export made with "
                                                      "--kv-cache (or torch)."}),
), _generation)

seed_option = OptionGroup("seed", (
    Flag(("--seed", "seed"), {"type": click.IntRange(0, 2**63 - 1), "default": 0, "show_default": True,
                              "help": "Seed for temperature > 0 / random."}),
), lambda values: values["seed"])


def _template(values: dict[str, Any]) -> TemplateChoice | None:
    """The chat template chosen instead of the target's own (its file read now: a bad one stops the verb before any
    work); None keeps the target's."""
    from seer_deploy.core.errors import ConfigError
    from seer_deploy.models.text.chat_template import read_template_file
    from seer_deploy.runtime.targets import TemplateChoice

    file, raw = values["chat_template"], values["raw_prompts"]
    if raw and file is not None:
        raise ConfigError("--chat-template and --no-chat-template contradict each other; give one")
    if raw:
        return TemplateChoice(None, "--no-chat-template")
    return None if file is None else TemplateChoice(read_template_file(file), str(file))


template_options = OptionGroup("template", (
    Flag(("--chat-template", "chat_template"), {"type": click.Path(dir_okay=False, path_type=Path), "default": None,
                                                "help": "A Jinja chat template file to build prompts with, instead of "
                                                        "the checkpoint's own (tokenizer_config.json's chat_template, "
                                                        "carried into the export)."}),
    Flag(("--no-chat-template", "raw_prompts"), {"is_flag": True, "default": False,
                                                 "help": "Send prompts as raw text, without a chat template (base "
                                                         "models)."}),
), _template)

API_KEY_ENV = "SEER_DEPLOY_API_KEY"


def parse_sizes(text: str | None) -> tuple[int, ...]:
    """--gen-lengths N,N,...: the sizes, or ConfigError for anything but integers separated by commas."""
    from seer_deploy.core.checks import ascii_int
    from seer_deploy.core.errors import ConfigError

    if not text:
        return ()
    sizes = [ascii_int(part) for part in text.split(",")]
    if any(size is None for size in sizes):
        raise ConfigError(f"--gen-lengths '{text}' must be integers (digits 0-9) separated by commas, e.g. 32,64,128")
    return tuple(size for size in sizes if size is not None)


def _serving(values: dict[str, Any]) -> ServeOptions:
    """The server's limits; `serve` adds what it names itself (the model name, --max-batch, --gen-lengths: flags
    other verbs use with their own meanings) and checks the whole."""
    import sys

    from seer_deploy.serve.options import ServeOptions

    return ServeOptions(**(values | {"access_log": sys.stderr if values["access_log"] else None}))


serving_options = OptionGroup("serving", (
    Flag(("--batching", "batching"), {"type": click.Choice(["step", "call"]), "default": "step", "show_default": True,
                                      "help": "step: rows join and leave the running batch between forward passes; "
                                              "call: rows of one setting run together to the end of their call (the "
                                              "batcher before issue 46)."}),
    Flag(("--max-wait-ms", "max_wait_ms"), {"type": float, "default": 5.0, "show_default": True,
                                            "help": "--batching call: how long a batch waits to fill after its first "
                                                    "row arrives."}),
    Flag(("--max-queue", "max_queue"), {"type": int, "default": 256, "show_default": True,
                                        "help": "Rows waiting; beyond it requests get 429 with Retry-After."}),
    Flag(("--timeout", "timeout_s"), {"type": float, "default": 60.0, "show_default": True,
                                      "help": "Per-request deadline in seconds, queueing included (504 past it)."}),
    Flag(("--max-body-bytes", "max_body_bytes"), {"type": int, "default": 8 << 20, "show_default": True,
                                                  "help": "Larger bodies get 413."}),
    Flag(("--read-timeout", "read_timeout_s"), {"type": float, "default": 30.0, "show_default": True,
                                                "help": "Seconds a request's headers, then its body, may take to "
                                                        "arrive (408 and the connection closed)."}),
    Flag(("--max-connections", "max_connections"), {"type": int, "default": 512, "show_default": True,
                                                    "help": "Open connections; a request on one beyond it gets 503 "
                                                            "(put a reverse proxy in front for more)."}),
    Flag(("--max-prompts", "max_prompts"), {"type": int, "default": 32, "show_default": True,
                                            "help": "Prompts one /v1/completions request may list."}),
    Flag(("--retry-after", "retry_after_s"), {"type": int, "default": 1, "show_default": True,
                                              "help": "Seconds a 429 tells the client to wait (Retry-After)."}),
    Flag(("--api-key", "api_key"), {"default": None, "envvar": API_KEY_ENV, "show_envvar": True,
                                    "help": "Require 'Authorization: Bearer KEY' on /v1/* and /metrics."}),
    Flag(("--access-log/--no-access-log", "access_log"), {"default": True, "show_default": True,
                                                          "help": "One JSON line per request on stderr."}),
), _serving)

GROUPS: tuple[OptionGroup, ...] = (target_options, seer_options, generation_options, seed_option, template_options,
                                   serving_options)
