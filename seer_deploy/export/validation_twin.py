"""The validation-only twin of an export: its language-model graphs with one more output, the LM head's float32 logits
(the input of the head's ArgMax), so that the export's check compares the whole distribution the export computes with
torch's, not only the token it picks.

The served graphs return B x S numbers per pass, never B x S x V logits, and stay so: the twin lives in a folder of
the staging directory only while the check runs (the weights file hard-linked, or symbolically linked where the file
system refuses hard links: nothing is copied) and is removed before the export is installed. Its graphs are the
export's node for node, the output added; `probe_logits` runs them on the probes and closes them before the export's
own graphs are opened (an 8B model's prepacked weights are held once).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path

import onnx

from seer_deploy.contracts.export_manifest import ExportManifest
from seer_deploy.contracts.graph_calls import graph_feed, window_feed
from seer_deploy.core.backend import StepInput
from seer_deploy.core.files import file_sha256
from seer_deploy.engines.ort import OrtBackend, OrtSessionOptions
from seer_deploy.export.distributions import ProbeLogits
from seer_deploy.export.validate import (
    ExportValidationError,
    ProbeReference,
    probe_window,
    response_candidates,
)

LOGITS = "validation_logits"  # the twin's extra output: float32 [B, C, V] over the call's candidates (or window)
TWIN_DIR = ".validation-twin"


def add_logits_output(model: onnx.ModelProto) -> None:
    """In place: expose the input of the graph's top-level ArgMax over the last axis (the LM head's logits) as the
    output LOGITS. ExportValidationError if the graph has no such ArgMax or more than one."""
    heads = [node for node in model.graph.node if node.op_type == "ArgMax" and _last_axis(node)]
    if len(heads) != 1:
        raise ExportValidationError(f"the {model.graph.name or 'exported'} graph has {len(heads)} top-level ArgMax "
                                    "nodes over the vocabulary (one expected): its logits cannot be checked")
    model.graph.node.append(onnx.helper.make_node("Identity", [heads[0].input[0]], [LOGITS], name=LOGITS))
    model.graph.output.append(onnx.helper.make_tensor_value_info(LOGITS, onnx.TensorProto.FLOAT, None))


def _last_axis(node: onnx.NodeProto) -> bool:
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    return attrs.get("axis", 0) == -1 or attrs.get("axis", 0) == 2


@contextmanager
def logits_twin(staged: Path) -> Iterator[Path]:
    """A twin of the staged export in staged/TWIN_DIR (every file linked, the step and window graphs rewritten with
    add_logits_output, the manifest's hashes of them updated), removed on leaving."""
    manifest = ExportManifest.load(staged)
    twin = staged / TWIN_DIR
    twin.mkdir()
    try:
        for path in staged.iterdir():
            if path.is_file():
                _link(path, twin / path.name)
        records = dict(manifest.graphs)
        for name, record in manifest.graphs.items():
            target = twin / record.file
            model = onnx.load(str(staged / record.file), load_external_data=False)
            add_logits_output(model)
            target.unlink()
            onnx.save(model, str(target))
            records[name] = replace(record, sha256=file_sha256(target))
        (twin / "manifest.json").unlink()
        replace(manifest, graphs=records).save(twin)
        yield twin
    finally:
        shutil.rmtree(twin, ignore_errors=True)


def _link(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        target.symlink_to(source)


def cpu_backend(directory: Path) -> OrtBackend:
    """ONNX Runtime on the CPU over an export directory (what an export's check runs)."""
    return OrtBackend(directory, OrtSessionOptions(providers=("CPUExecutionProvider",)))


def probe_logits(staged: Path, open_backend: Callable[[Path], OrtBackend],
                 refs: list[ProbeReference]) -> list[ProbeLogits]:
    """The export's logits on every probe, from its twin: step zero, and the window step against the cache a
    refresh over the response returned (as the token checks call them)."""
    with logits_twin(staged) as twin:
        backend = open_backend(twin)
        out = [_logits_of(backend, ref) for ref in refs]
        del backend
    return out


def _logits_of(backend: OrtBackend, ref: ProbeReference) -> ProbeLogits:
    p = ref.probe
    step_io = backend._step_io
    inputs = StepInput(p.input_ids, p.attention_mask, prompt_width=p.prompt_width).checked(backend.max_seq_len)
    values = backend._call(step_io, graph_feed(step_io, inputs, backend._image_inputs(inputs), with_stats=True),
                           [LOGITS])
    if not backend.supports_cache:
        return ProbeLogits(values[LOGITS], None)
    refreshed = backend.refresh(StepInput(p.input_ids, p.attention_mask, prompt_width=p.prompt_width,
                                          candidates=response_candidates(p)))
    window = probe_window(p, refreshed.kv, backend)
    window_io = backend._window_io
    logits = backend._call(window_io, window_feed(window_io, window.checked()), [LOGITS])[LOGITS]
    return ProbeLogits(values[LOGITS], logits[:, backend.window_lead:])

