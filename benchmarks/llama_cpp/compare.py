"""seer-deploy against llama.cpp's `llama-diffusion-cli`, side by side on the same random LLaDA weights (issue 37, item 5).

One run:
 1. writes a random checkpoint in LLaDA's original layout (LLaDA-8B-Instruct's config.json keys and tensor names, bf16
    safetensors shards + index) with a byte-level BPE tokenizer.json trained by the `tokenizers` trainer, whose special
    tokens sit at LLaDA's ids (BOS 126080, EOS 126081, mask 126336, EoT 126348);
 2. gets llama.cpp: `llama-diffusion-cli` from --llama-bin or PATH, else built (only the llama-diffusion-cli,
    llama-quantize and llama-tokenize targets) from the source the `llama-cpp-python` sdist carries under
    vendor/llama.cpp; converts the checkpoint with llama.cpp's own convert_hf_to_gguf.py (f32), then q8_0 with
    llama-quantize;
 3. exports the checkpoint with `seer-deploy export CKPT --out DIR --kv-cache --max-seq-len 512` (default flags
    otherwise; if its check fails, the line is recorded and the export rerun with --no-verify);
 4. checks that both sides get the same prompt ids and run the same model (one step over the whole response: every
    position's argmax, compared token for token), then runs both at gen_length 256 in one block, 64 steps, 2 threads,
    in alternating rounds: llama.cpp f32, llama.cpp q8_0, seer-deploy ORT fp32 (Seer off), seer-deploy with the dual KV
    cache over blocks of 32; each run is one process, whose peak RSS comes from wait4();
 5. prints the table (s/step median, ratio to llama.cpp f32, time to first step, peak RSS against 1.25x the weights
    file + 1 GiB) and writes it with every raw figure to WORK/compare-<shape>.json and .md.

Everything fetched, built or generated stays under --work (default /tmp/llama_work), never in the repository.
seer-deploy runs through its CLI from this working tree, so the numbers follow whatever the tree's step graphs and
sessions are. Not part of CI. Full size: ~20 min on 2 quiet cores (build included), longer on a shared machine;
`--layers 2 --d-model 256 --mlp-hidden 704 --heads 4 --rounds 1` is a quick check. Details: README.md beside it.

    .venv/bin/python benchmarks/llama_cpp/compare.py [--work /tmp/llama_work] [--rounds 4] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # benchmarks/llada_checkpoint.py
from llada_checkpoint import BOS, EOS, SPECIALS, Shape, is_current, write_checkpoint
from measured import run_measured

PY = sys.executable
# The seer-deploy CLI of the interpreter running this script (the repo's venv, installed -e: this working tree).
SEER_CLI = ([str(Path(PY).parent / "seer-deploy")] if (Path(PY).parent / "seer-deploy").is_file()
            else [PY, "-c", "from seer_deploy.cli import main; main()"])
GiB = 2**30

PROMPT_WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "the", "lazy", "dog", "while", "seven", "wizards", "quietly", "judge", "boxing", "matches", "near", "the", "old", "river", "bank", "and", "count", "every", "step", "of", "the", "long", "way", "home", "before", "the", "night", "falls", "again", "over", "the", "silent", "hills"]
AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


# ---------------------------------------------------------------------------------------------------------------------
# small helpers


def log(msg: str) -> None:
    print(f"[{datetime.now(UTC).strftime('%H:%M:%S')}] {msg}", flush=True)


def check(cmd: list[str], what: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(cmd, capture_output=True, text=True, check=False, **kwargs)
    if r.returncode != 0:
        tail = "\n".join((r.stdout + r.stderr).strip().splitlines()[-25:])
        raise SystemExit(f"{what} failed (exit {r.returncode}): {' '.join(map(str, cmd))}\n{tail}")
    return r


def last_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else ""


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


# ---------------------------------------------------------------------------------------------------------------------
# 1. the checkpoint


def pick_prompt(ckpt: Path, n_tokens: int) -> tuple[str, list[int]]:
    """Text whose ids (BOS included) number exactly n_tokens with the checkpoint's tokenizer."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ckpt / "tokenizer.json"))
    count = lambda s: len(tok.encode(s).ids)
    words, text = list(PROMPT_WORDS), ""
    fillers = [" a", " b", " x", " i"]
    while count(text or "a") < n_tokens and words:
        w = words.pop(0)
        cand = (text + " " + w) if text else w
        if count(cand) <= n_tokens:
            text = cand
    while count(text) < n_tokens:
        for f in fillers:
            if count(text + f) <= n_tokens:
                text += f
                break
        else:
            raise SystemExit("could not build a prompt of the requested length")
    ids = tok.encode(text).ids
    assert len(ids) == n_tokens and ids[0] == BOS, (len(ids), ids[:3])
    return text, list(ids)


def seer_prompt_ids(ckpt: Path, text: str) -> list[int] | None:
    """The ids seer-deploy's own tokenizer gives the prompt (its encode_prompt), in a child process."""
    code = ("import json,sys; from seer_deploy.models.text.tokenizer import Tokenizer; "
            f"print(json.dumps(Tokenizer(sys.argv[1], {EOS}).encode_prompt(sys.argv[2])))")
    r = subprocess.run([PY, "-c", code, str(ckpt / "tokenizer.json"), text], capture_output=True, text=True,
                       cwd=REPO, check=False)
    if r.returncode != 0:
        log(f"warning: seer-deploy's tokenizer could not be imported ({last_line(r.stderr)})")
        return None
    return json.loads(last_line(r.stdout))


# ---------------------------------------------------------------------------------------------------------------------
# 2. llama.cpp


def amx_cpu() -> bool:
    try:
        return " amx_" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False


def llama_source(work: Path, given: Path | None) -> tuple[Path, str]:
    """llama.cpp's source tree: --llama-src, else vendor/llama.cpp of the llama-cpp-python sdist (downloaded once)."""
    if given is not None:
        return given, f"given ({given})"
    src = work / "src"
    src.mkdir(parents=True, exist_ok=True)
    sdists = sorted(src.glob("llama_cpp_python-*.tar.gz"))
    if not sdists:
        log("downloading the llama-cpp-python sdist (pip download --no-binary :all: --no-deps llama-cpp-python)")
        check([PY, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", "llama-cpp-python", "-d", str(src)],
              "pip download llama-cpp-python")
        sdists = sorted(src.glob("llama_cpp_python-*.tar.gz"))
    sdist = sdists[-1]
    root = src / sdist.name.removesuffix(".tar.gz")
    if not (root / "vendor" / "llama.cpp" / "convert_hf_to_gguf.py").is_file():
        log(f"unpacking {sdist.name}")
        with tarfile.open(sdist) as tar:
            tar.extractall(src, filter="data")
    return root / "vendor" / "llama.cpp", sdist.name.removesuffix(".tar.gz")


def ensure_build_tools() -> None:
    missing = [t for t in ("cmake", "c++", "make") if shutil.which(t) is None]
    if not missing:
        return
    if os.geteuid() != 0:
        raise SystemExit(f"{', '.join(missing)} missing: apt-get install cmake build-essential (as root)")
    log(f"{', '.join(missing)} missing: apt-get install -y cmake build-essential")
    check(["apt-get", "update"], "apt-get update")
    check(["apt-get", "install", "-y", "cmake", "build-essential"], "apt-get install")


def build_llama(src: Path, build: Path, jobs: int) -> tuple[Path, list[str]]:
    """Configure once and build only the three targets (incremental when the build dir exists)."""
    ensure_build_tools()
    flags = AMX_FLAGS if amx_cpu() else ""
    cfg = ["cmake", "-S", str(src), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF",
           "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF", "-DGGML_NATIVE=ON",
           f"-DCMAKE_C_FLAGS={flags}", f"-DCMAKE_CXX_FLAGS={flags}"]
    if shutil.which("ninja") and not (build / "Makefile").exists():
        cfg[1:1] = ["-G", "Ninja"]
    targets = ["llama-diffusion-cli", "llama-quantize", "llama-tokenize"]
    bld = ["cmake", "--build", str(build), "-j", str(jobs), "--target", *targets]
    log(f"building {', '.join(targets)} with -j{jobs}" + (f" (AMX CPU: {flags})" if flags else ""))
    check(cfg, "cmake configure")
    check(bld, "cmake build")
    return build / "bin", [" ".join(cfg), " ".join(bld)]


def find_tool(bindir: Path | None, name: str) -> Path | None:
    if bindir is not None and (bindir / name).is_file():
        return bindir / name
    found = shutil.which(name)
    return Path(found) if found else None


CONVERT_WRAPPER = r"""
import runpy, sys
llama = sys.argv[1]
sys.path[:0] = [llama, llama + "/gguf-py"]
import conversion.base as base
orig = base.TextModel.get_vocab_base_pre
def pre(self, tokenizer):
    # the random BPE tokenizer's check hash is in no list: its pre-tokenizer is GPT-2's byte-level regex
    try:
        return orig(self, tokenizer)
    except NotImplementedError:
        return "gpt-2"
base.TextModel.get_vocab_base_pre = pre
sys.argv = [llama + "/convert_hf_to_gguf.py"] + sys.argv[2:]
runpy.run_path(sys.argv[0], run_name="__main__")
"""


def convert(src: Path, ckpt: Path, out: Path, outtype: str) -> None:
    """llama.cpp's own convert_hf_to_gguf.py, unchanged but for the tokenizer's pre-tokenizer name (see wrapper)."""
    tmp = out.with_name(out.name + ".tmp")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "NO_LOCAL_GGUF": "1"}
    check([PY, "-c", CONVERT_WRAPPER, str(src), str(ckpt), "--outtype", outtype, "--outfile", str(tmp)],
          f"convert_hf_to_gguf.py --outtype {outtype}", env=env)
    tmp.rename(out)


def llama_ids(tokenize: Path, gguf: Path, text: str) -> list[int] | None:
    r = subprocess.run([str(tokenize), "-m", str(gguf), "-p", text, "--ids", "--log-disable"], capture_output=True,
                       text=True, check=False)
    m = re.search(r"\[([\d,\s]*)\]\s*$", r.stdout.strip())
    if r.returncode != 0 or not m:
        log(f"warning: llama-tokenize failed: {last_line(r.stderr or r.stdout)}")
        return None
    return [int(x) for x in m.group(1).replace(",", " ").split()]


# ---------------------------------------------------------------------------------------------------------------------
# 3. the seer-deploy export


GLOG = re.compile(r"^[EWI]\d{4} \d")  # torch's C++ log lines (e.g. torch.export notes), not the CLI's


def export(ckpt: Path, out: Path, max_seq_len: int) -> dict[str, Any]:
    """`seer-deploy export CKPT --out DIR --kv-cache --max-seq-len N`; on failure the line, then --no-verify."""
    base = [*SEER_CLI, "export", str(ckpt), "--out", str(out), "--kv-cache", "--max-seq-len", str(max_seq_len)]
    rec: dict[str, Any] = {"command": " ".join(base)}
    shutil.rmtree(out, ignore_errors=True)
    p = run_measured(base, cwd=REPO)
    lines = [line.strip() for line in (p.out + "\n" + p.err).splitlines() if line.strip() and not GLOG.match(line)]
    rec.update(rc=p.rc, seconds=round(p.wall_s, 1), peak_rss_gib=round(p.peak_rss / GiB, 2),
               verified=p.rc == 0, lines=[line for line in lines if not line.startswith("exporting")][-6:])
    if p.rc != 0:
        rec["failure"] = last_line(p.err or p.out)
        log(f"export check failed: {rec['failure']}; rerunning with --no-verify")
        shutil.rmtree(out, ignore_errors=True)
        q = run_measured([*base, "--no-verify"], cwd=REPO)
        rec["no_verify"] = {"rc": q.rc, "seconds": round(q.wall_s, 1), "peak_rss_gib": round(q.peak_rss / GiB, 2),
                            "lines": [line.strip() for line in (q.out + q.err).splitlines()
                                      if line.strip() and not line.strip().startswith("exporting")
                                      and not GLOG.match(line)][-4:]}
        if q.rc != 0:
            raise SystemExit(f"seer-deploy export --no-verify failed too: {last_line(q.err or q.out)}")
    return rec


def export_weights_bytes(out: Path) -> tuple[str, int]:
    """The export's weights file (manifest's weights.file, else its largest non-graph file) and its size."""
    try:
        manifest = json.loads((out / "manifest.json").read_text())
        name = manifest["weights"]["file"]
        return name, (out / name).stat().st_size
    except (OSError, KeyError, TypeError, ValueError):
        files = [f for f in out.rglob("*") if f.is_file() and f.suffix not in (".onnx", ".json")]
        big = max(files, key=lambda f: f.stat().st_size)
        return big.name, big.stat().st_size


# ---------------------------------------------------------------------------------------------------------------------
# 4. the runs


@dataclass
class Side:
    name: str
    kind: str  # "llama" | "seer"
    cmd: list[str]
    weights_bytes: int
    runs: list[dict[str, Any]] = field(default_factory=list)


LLAMA_TIMES = re.compile(r"total time: ([\d.]+)ms, time per step: ([\d.]+)ms, sampling time per step: ([\d.]+)ms")
# llama.cpp's log lines carry the time since the process's log started: minutes.seconds.milliseconds.microseconds. The
# step callback prints "diffusion step: K/N" as step K starts.
LLAMA_STEP = re.compile(r"(\d+)\.(\d+)\.(\d+)\.(\d+) I\s*diffusion step: (\d+)/(\d+)")
LOG_PREFIX = re.compile(r"^\s*\d+\.\d+\.\d+\.\d+ [A-Z] ?\n?")
SEER_SUMMARY = re.compile(r"(\d+) prompts? on (\S+): ([\d.]+)s, (\d+) forward passes")


def llama_cmd(cli: Path, gguf: Path, text: str, total: int, steps: int, gen: int, threads: int) -> list[str]:
    """The canvas is -ub tokens (prompt + masks); one block as long as the canvas puts every response slot in block 0
    (block k spans [prompt + k * block, prompt + (k + 1) * block) clipped to the canvas). -n is not used by the
    diffusion example; it is passed for the record. --temp 0 alone is not greedy in llama-diffusion-cli: its sampler
    chain is top-k (40), top-p (0.95), then a random draw; --top-k 1 makes every position take its argmax (the draw
    then has one candidate). The confidence it ranks positions by is then 1.0 everywhere, so it commits left to right
    rather than by LLaDA's low confidence: the step's work is the same, its answers are not LLaDA's order."""
    return [str(cli), "-m", str(gguf), "-p", text, "-n", str(gen), "-c", str(total), "-b", str(total), "-ub",
            str(total), "--diffusion-steps", str(steps), "--diffusion-block-length", str(total),
            "--diffusion-algorithm", "4", "--temp", "0", "--top-k", "1", "--top-p", "1", "-s", "0",
            "-t", str(threads), "-tb", str(threads), "--log-colors", "off"]


def run_llama(side: Side) -> dict[str, Any]:
    p = run_measured(side.cmd)
    text = p.out + "\n" + p.err
    m = LLAMA_TIMES.search(text)
    rec: dict[str, Any] = {"rc": p.rc, "wall_s": p.wall_s, "peak_rss": p.peak_rss}
    if p.rc != 0 or not m:
        rec["error"] = last_line(p.err or p.out)
        return rec
    total_s = float(m.group(1)) / 1000
    found = LLAMA_STEP.findall(text)
    marks = {int(k): int(mi) * 60 + int(sec) + int(ms) / 1e3 + int(us) / 1e6 for mi, sec, ms, us, k, _ in found}
    rec.update(avg_step_s=float(m.group(2)) / 1000, sampling_step_s=float(m.group(3)) / 1000, gen_s=total_s)
    if 0 in marks and 1 in marks:
        n = int(found[0][5])
        end = marks[0] + total_s
        rec.update(load_s=marks[0], first_done_s=marks[1], first_step_call_s=marks[1] - marks[0],
                   step_s=(end - marks[1]) / (n - 1))
    else:  # no timestamps in the log: wall clock around the loop's own total
        rec.update(load_s=p.wall_s - total_s, first_done_s=None, step_s=rec["avg_step_s"])
    ml = re.search(r"max_length\s+u32\s+=\s+(\d+)", text)
    rec["canvas"] = int(ml.group(1)) if ml else None
    rec["answer"] = LOG_PREFIX.sub("", text.split(m.group(0), 1)[1]).rstrip("\n")
    return rec


def run_seer(side: Side, trace: Path) -> dict[str, Any]:
    trace.unlink(missing_ok=True)
    p = run_measured([PY, str(HERE / "_seer_child.py"), str(trace), *side.cmd], cwd=REPO)
    rec: dict[str, Any] = {"rc": p.rc, "wall_s": p.wall_s, "peak_rss": p.peak_rss}
    m = SEER_SUMMARY.search(p.err)
    if p.rc != 0 or not m:
        rec["error"] = last_line(p.err or p.out)
        return rec
    gen_s, passes = float(m.group(3)), int(m.group(4))
    rec.update(gen_s=gen_s, passes=passes, backend=m.group(2), avg_step_s=gen_s / passes)
    record: dict[str, Any] = next((json.loads(line) for line in p.out.splitlines() if line.startswith("{")), {})
    rec["tokens"] = record.get("tokens")
    rec["json_timing"] = {k: v for k, v in record.items() if k.endswith("_s")}
    try:
        calls = json.loads(trace.read_text())["calls"]
    except (OSError, ValueError, KeyError):
        calls = []
    rec["ort_calls"] = len(calls)
    if calls and passes > 1:
        # Load: spawn to the first graph call's start; first step done: its end. Steady step time: from the end of
        # the first call to the end of the last over the remaining passes (host work between calls included, and
        # any session opened lazily mid-run).
        durations = sorted(e - s for s, e in calls)
        rec.update(load_s=calls[0][0] - p.spawn, first_done_s=calls[0][1] - p.spawn,
                   first_step_call_s=calls[0][1] - calls[0][0], median_call_s=durations[len(durations) // 2],
                   step_s=(calls[-1][1] - calls[0][1]) / (passes - 1))
    else:  # graphs not run through InferenceSession.run: the CLI's own figures
        rec.update(load_s=rec["json_timing"].get("load_s", p.wall_s - gen_s),
                   first_done_s=rec["json_timing"].get("first_step_s"), step_s=gen_s / passes)
    return rec


def summarize(side: Side) -> dict[str, Any]:
    ok = [r for r in side.runs if "step_s" in r]
    s: dict[str, Any] = {"name": side.name, "kind": side.kind, "runs_ok": len(ok), "runs": len(side.runs),
                         "weights_bytes": side.weights_bytes}
    if ok:
        firsts = [r["first_done_s"] for r in ok if r.get("first_done_s") is not None]
        s.update(step_s=median([r["step_s"] for r in ok]), avg_step_s=median([r["avg_step_s"] for r in ok]),
                 load_s=median([r["load_s"] for r in ok]), first_done_s=median(firsts),
                 peak_rss=max(r["peak_rss"] for r in ok), peak_rss_median=median([r["peak_rss"] for r in ok]),
                 step_s_all=[round(r["step_s"], 4) for r in ok], load_s_all=[round(r["load_s"], 2) for r in ok],
                 first_done_s_all=[round(x, 2) for x in firsts],
                 loadavg_1min_after=[r.get("loadavg_1min_after") for r in ok])
        if side.kind == "seer":
            s["passes"] = ok[0]["passes"]
            js = [r["json_timing"] for r in ok if r.get("json_timing")]
            for key in sorted({k for j in js for k in j}):
                s[f"json_{key}"] = median([j[key] for j in js if isinstance(j.get(key), int | float)])
        else:
            s["sampling_step_s"] = median([r["sampling_step_s"] for r in ok])
            s["passes"] = None
    errors = [r["error"] for r in side.runs if "error" in r]
    if errors:
        s["errors"] = errors
    return s


SEGMENT = re.compile(r"<id\d+>|[^<]+|<")


def compare_answers(a: str | None, b: str | None) -> dict[str, Any]:
    """Two printed answers, piece by piece: every filler token prints as `<idN>`, runs of real BPE tokens as their
    text, special tokens as nothing (on both sides)."""
    if a is None or b is None:
        return {"compared": False}
    sa, sb = SEGMENT.findall(a), SEGMENT.findall(b)
    out: dict[str, Any] = {"compared": True, "same": a == b, "pieces": [len(sa), len(sb)]}
    if len(sa) == len(sb):
        out["same_pieces"] = sum(x == y for x, y in zip(sa, sb, strict=True))
    return out


def one_step_check(cli: Path, ggufs: dict[str, Path], export_dir: Path, text: str, total: int, gen: int,
                   threads: int, tokfile: Path) -> dict[str, Any]:
    """Same weights, same model? One step over the whole response commits every position's argmax on both sides, with
    no order to differ in: the 256 tokens must be the same (llama.cpp f32 against seer-deploy ORT fp32)."""
    from tokenizers import Tokenizer

    p = run_measured([PY, str(HERE / "_seer_child.py"), str(export_dir.parent / "one-step-trace.json"), "generate",
                      str(export_dir), "--prompt", text, "--gen-length", str(gen), "--steps", "1", "--threads",
                      str(threads), "--no-seer", "--json"], cwd=REPO)
    record: dict[str, Any] = next((json.loads(line) for line in p.out.splitlines() if line.startswith("{")), {})
    (export_dir.parent / "one-step-trace.json").unlink(missing_ok=True)
    if p.rc != 0 or not record.get("tokens"):
        return {"error": f"seer-deploy: {last_line(p.err or p.out)}"}
    seer = Tokenizer.from_file(str(tokfile)).decode(record["tokens"], skip_special_tokens=True)
    out: dict[str, Any] = {}
    for name, gguf in ggufs.items():
        q = run_measured(llama_cmd(cli, gguf, text, total, 1, gen, threads))
        m = LLAMA_TIMES.search(q.err + q.out)
        answer = LOG_PREFIX.sub("", (q.err + q.out).split(m.group(0), 1)[1]).rstrip("\n") if m else None
        out[name] = compare_answers(seer, answer)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# 5. report


def git_state() -> str:
    head = subprocess.run(["git", "log", "-1", "--oneline"], capture_output=True, text=True, cwd=REPO,
                          check=False).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=REPO, check=False).stdout.strip()
    return head + (f" with uncommitted changes ({len(dirty.splitlines())} tracked files modified)" if dirty else "")


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        m = re.search(r"Model name:\s*(.+)", out)
        return m.group(1).strip() if m else platform.processor()
    except OSError:
        return platform.processor()


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def table(summaries: list[dict[str, Any]], ref: str) -> str:
    base = next((s for s in summaries if s["name"] == ref and "step_s" in s), None)
    rows = [("| side | s/step | / llama.cpp f32 | all-steps s/step | load s (to step 1) | first step done s | "
             "peak RSS GiB | weights file GiB | peak RSS / (1.25 x weights + 1 GiB) | passes |"),
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for s in summaries:
        if "step_s" not in s:
            rows.append(f"| {s['name']} | failed: {'; '.join(s.get('errors', []))[:120]} | | | | | | | | |")
            continue
        ratio = f"{s['step_s'] / base['step_s']:.2f}x" if base else "-"
        w = s["weights_bytes"]
        rows.append(f"| {s['name']} | {s['step_s']:.3f} | {ratio} | {s['avg_step_s']:.3f} | {s['load_s']:.2f} | "
                    f"{fmt(s['first_done_s'], '.2f')} | {s['peak_rss'] / GiB:.2f} | {w / GiB:.2f} | "
                    f"{s['peak_rss'] / (1.25 * w + GiB):.2f} | "
                    f"{s['passes'] if s['passes'] is not None else '-'} |")
    return "\n".join(rows)


def targets(summaries: list[dict[str, Any]], ref: str) -> list[str]:
    base = next((s for s in summaries if s["name"] == ref and "step_s" in s), None)
    lines = []
    for s in summaries:
        if s["kind"] != "seer" or "step_s" not in s:
            continue
        budget = 1.25 * s["weights_bytes"] + GiB
        first = s["first_done_s"] if s["first_done_s"] is not None else s["load_s"]
        parts = [(f"peak RSS {s['peak_rss'] / GiB:.2f} GiB vs {budget / GiB:.2f} "
                  f"({'met' if s['peak_rss'] <= budget else 'not met'})"),
                 f"first step done after {first:.2f} s vs 2 s ({'met' if first <= 2 else 'not met'})"]
        if base:
            r = s["step_s"] / base["step_s"]
            parts.insert(0, f"s/step {r:.2f}x llama.cpp f32's vs 0.8x ({'met' if r <= 0.8 else 'not met'})")
        lines.append(f"- {s['name']}: " + "; ".join(parts))
    return lines


# ---------------------------------------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/llama_work"),
                    help="where the source, build, checkpoint, GGUF files, export and results go (not the repo)")
    ap.add_argument("--d-model", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--mlp-hidden", type=int, default=2816)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=126464, help="at least 126349 (LLaDA's special ids)")
    ap.add_argument("--bpe-vocab", type=int, default=8192, help="tokens the BPE trainer learns")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--gen-length", type=int, default=256)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--kv-block", type=int, default=32, help="block length of the dual-KV-cache row")
    ap.add_argument("--max-seq-len", type=int, default=512, help="export's --max-seq-len")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--jobs", type=int, default=2, help="build parallelism")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--llama-bin", type=Path, default=None,
                    help="folder holding llama-diffusion-cli (and llama-quantize, llama-tokenize) [default: PATH, "
                         "else built under WORK/build]")
    ap.add_argument("--llama-src", type=Path, default=None,
                    help="a llama.cpp source tree [default: the llama-cpp-python sdist's vendor/llama.cpp]")
    ap.add_argument("--no-q8", action="store_true", help="skip the llama.cpp q8_0 row")
    ap.add_argument("--reuse-export", action="store_true",
                    help="keep an existing export (default: export again, so the tree's exporter is measured)")
    args = ap.parse_args()
    if args.vocab <= max(SPECIALS.values()):
        ap.error(f"--vocab must exceed {max(SPECIALS.values())} (LLaDA's EoT id)")
    shape = Shape(args.d_model, args.layers, args.mlp_hidden, args.heads, args.vocab)
    work = args.work.resolve()
    if work == REPO or REPO in work.parents:
        ap.error("--work must lie outside the repository")
    run_dir = work / "runs" / shape.tag
    run_dir.mkdir(parents=True, exist_ok=True)
    stages: dict[str, float] = {}
    started = datetime.now(UTC)
    log(f"shape {shape.tag} ({shape.params / 1e6:.0f}M parameters), work dir {run_dir}")

    # 1. checkpoint
    ckpt = run_dir / "checkpoint"
    t = time.perf_counter()
    if not is_current(ckpt, shape, args.seed, args.bpe_vocab, 4096):
        log("writing the random checkpoint (bf16 shards, BPE tokenizer)")
        write_checkpoint(ckpt, shape, 4096, args.seed, args.bpe_vocab, log=log)
        for f in run_dir.glob("*.gguf"):
            f.unlink()  # made from another checkpoint
    else:
        log("checkpoint exists (same shape and seed): reused")
    stages["checkpoint"] = time.perf_counter() - t
    text, ids = pick_prompt(ckpt, args.prompt_tokens)
    log(f"prompt ({len(ids)} ids with BOS): {text!r}")

    # 2. llama.cpp
    t = time.perf_counter()
    src, src_name = llama_source(work, args.llama_src)
    stages["llama.cpp source"] = time.perf_counter() - t
    t = time.perf_counter()
    cli = find_tool(args.llama_bin, "llama-diffusion-cli")
    build_cmds: list[str] = []
    if cli is None:
        bindir, build_cmds = build_llama(src, work / "build", args.jobs)
        cli = bindir / "llama-diffusion-cli"
    else:
        bindir = cli.parent
        log(f"llama-diffusion-cli found: {cli}")
    quantize, tokenize = find_tool(bindir, "llama-quantize"), find_tool(bindir, "llama-tokenize")
    stages["llama.cpp build"] = time.perf_counter() - t
    f32 = run_dir / "model-f32.gguf"
    t = time.perf_counter()
    if not f32.is_file():
        log("converting with convert_hf_to_gguf.py --outtype f32")
        convert(src, ckpt, f32, "f32")
    stages["convert f32"] = time.perf_counter() - t
    q8 = run_dir / "model-q8_0.gguf"
    t = time.perf_counter()
    q8_how = None
    if not args.no_q8:
        if q8.is_file():
            q8_how = "existing"
        elif quantize is not None:
            log("quantizing with llama-quantize q8_0")
            check([str(quantize), str(f32), str(q8), "q8_0", str(args.threads)], "llama-quantize")
            q8_how = "llama-quantize f32 -> q8_0"
        else:
            log("no llama-quantize: convert_hf_to_gguf.py --outtype q8_0")
            convert(src, ckpt, q8, "q8_0")
            q8_how = "convert_hf_to_gguf.py --outtype q8_0"
    stages["quantize q8_0"] = time.perf_counter() - t

    # same prompt ids on both sides
    ids_llama = llama_ids(tokenize, f32, text) if tokenize else None
    ids_seer = seer_prompt_ids(ckpt, text)
    same_ids = ids_llama == ids and (ids_seer is None or ids_seer == ids)
    log(f"prompt ids: tokenizers {len(ids)}, llama.cpp {'same' if ids_llama == ids else ids_llama}, seer-deploy "
        f"{'same' if ids_seer == ids else ids_seer}")
    if ids_llama is not None and ids_llama != ids:
        raise SystemExit("llama.cpp tokenizes the prompt differently; the comparison would not be on the same ids")

    # 3. export
    out = run_dir / "export"
    t = time.perf_counter()
    if args.reuse_export and (out / "manifest.json").is_file():
        exp: dict[str, Any] = {"reused": True}
        log("export reused")
    else:
        log(f"seer-deploy export --kv-cache --max-seq-len {args.max_seq_len}")
        exp = export(ckpt, out, args.max_seq_len)
        log(f"export: rc {exp['rc']}, {exp['seconds']} s, peak RSS {exp['peak_rss_gib']} GiB; "
            + " | ".join(exp["lines"][-3:]))
    stages["export"] = time.perf_counter() - t
    wfile, wbytes = export_weights_bytes(out)

    # 4. runs
    total = args.prompt_tokens + args.gen_length
    gen = ["generate", str(out), "--prompt", text, "--gen-length", str(args.gen_length), "--steps", str(args.steps),
           "--threads", str(args.threads), "--no-seer", "--json"]
    sides = [Side("llama.cpp f32", "llama", llama_cmd(cli, f32, text, total, args.steps, args.gen_length,
                                                      args.threads), f32.stat().st_size)]
    if q8_how:
        sides.append(Side("llama.cpp q8_0", "llama", llama_cmd(cli, q8, text, total, args.steps, args.gen_length,
                                                               args.threads), q8.stat().st_size))
    sides += [Side("seer-deploy ORT fp32, Seer off", "seer", [*gen, "--block-length", str(args.gen_length)], wbytes),
              Side(f"seer-deploy ORT fp32, dual KV cache, blocks of {args.kv_block}", "seer",
                   [*gen, "--block-length", str(args.kv_block), "--kv-cache"], wbytes)]
    t = time.perf_counter()
    ggufs = {"llama.cpp f32": f32, **({"llama.cpp q8_0": q8} if q8_how else {})}
    check1 = one_step_check(cli, ggufs, out, text, total, args.gen_length, args.threads, ckpt / "tokenizer.json")
    log(f"one-step check: {json.dumps(check1)}")
    stages["one-step check"] = time.perf_counter() - t
    stem = work / f"compare-{shape.tag}"
    state = git_state()  # when the runs start: the tree may change under a long run

    def report(rounds_done: int) -> str:
        """Write WORK/compare-<shape>.json and .md from the rounds done so far (after every round, so a run stopped
        early still leaves its figures); returns the markdown."""
        summaries = [summarize(s) for s in sides]
        ref = "llama.cpp f32"
        result = {
            "date": started.strftime("%Y-%m-%d %H:%M UTC"), "machine": cpu_model(), "cores": os.cpu_count(),
            "seer_deploy": state, "llama_cpp": src_name, "build": build_cmds, "q8_0": q8_how,
            "command": " ".join([os.path.relpath(PY, REPO), os.path.relpath(Path(sys.argv[0]).resolve(), REPO),
                                 *sys.argv[1:]]),
            "shape": shape.__dict__, "params": shape.params, "prompt": text, "prompt_ids": ids,
            "prompt_ids_llama": ids_llama, "prompt_ids_seer": ids_seer, "same_prompt_ids": same_ids,
            "gen_length": args.gen_length, "steps": args.steps, "threads": args.threads, "rounds": args.rounds,
            "rounds_done": rounds_done, "export": exp, "export_weights_file": wfile,
            "stages_s": {k: round(v, 1) for k, v in stages.items()}, "summaries": summaries,
            "one_step_check": check1, "commands": {s.name: s.cmd for s in sides},
            "raw": {s.name: s.runs for s in sides},
        }
        md = "\n".join([
            (f"{result['date']}, {result['machine']} ({result['cores']} cores), {args.threads} threads; seer-deploy "
             f"{state}; llama.cpp from {src_name}."),
            (f"Model: random LLaDA layout {shape.tag} ({shape.params / 1e6:.0f}M parameters), prompt {len(ids)} ids "
             f"(same on both sides: {same_ids}), gen_length {args.gen_length} in one block, {args.steps} steps, "
             f"medians of {rounds_done} of {args.rounds} alternating rounds."),
            "",
            table(summaries, ref),
            "",
            *targets(summaries, ref),
            "",
            "Same model on both sides (one step, every position its argmax, tokens equal to seer-deploy ORT fp32's): "
            + (", ".join(f"{name} {a.get('same_pieces', '?')}/{a['pieces'][0]}" for name, a in check1.items()
                         if isinstance(a, dict) and a.get("compared")) or json.dumps(check1)),
        ])
        stem.with_suffix(".json").write_text(json.dumps(result, indent=2))
        stem.with_suffix(".md").write_text(md + "\n")
        return md

    md = report(0)
    t = time.perf_counter()
    for rnd in range(args.rounds):
        order = sides if rnd % 2 == 0 else sides[::-1]
        for side in order:
            r = run_llama(side) if side.kind == "llama" else run_seer(side, run_dir / "trace.json")
            r["round"] = rnd
            r["loadavg_1min_after"] = round(os.getloadavg()[0], 2)  # others' work on the machine during the run
            side.runs.append(r)
            log(f"round {rnd + 1}/{args.rounds} {side.name}: " + (
                f"{r['step_s']:.3f} s/step, load {r['load_s']:.2f} s, first step done "
                f"{fmt(r.get('first_done_s'), '.2f')} s, peak RSS "
                f"{r['peak_rss'] / GiB:.2f} GiB" if "step_s" in r else f"FAILED: {r.get('error')}"))
        stages["runs"] = time.perf_counter() - t
        md = report(rnd + 1)
    print()
    print(md)
    print()
    print("export:", json.dumps(exp))
    print("stages (s):", json.dumps({k: round(v, 1) for k, v in stages.items()}))
    print(f"written: {stem}.json, {stem}.md")


if __name__ == "__main__":
    main()
