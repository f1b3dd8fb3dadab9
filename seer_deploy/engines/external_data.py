"""A graph's external data stays in its own directory: checked on the graph's structure alone, before ONNX Runtime
or TensorRT's parser opens anything (either would open whatever path a damaged or hostile graph names)."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from seer_deploy.core.errors import ArtifactError
from seer_deploy.core.files import confined, os_error_fix
from seer_deploy.engines.onnx_proto import EXTERNAL, load_structure


def check_external_data(graph_file: Path) -> None:
    """ArtifactError unless every external-data location the graph names lies inside the graph's directory
    (symlinks resolved); checked on the graph structure alone, before ONNX Runtime or TensorRT opens anything."""
    from google.protobuf.message import DecodeError

    try:
        model = load_structure(graph_file)
    except OSError as exc:
        raise ArtifactError(f"{graph_file} cannot be read ({exc.strerror}); {os_error_fix(exc)}") from exc
    except (DecodeError, ValueError, RecursionError) as exc:
        raise ArtifactError(f"{graph_file} is not a readable ONNX graph ({exc}); re-export it") from exc
    locations = set()
    functions = (_node_tensors(function.node) for function in model.functions)
    for tensor in itertools.chain(_graph_tensors(model.graph), *functions):
        if tensor.data_location == EXTERNAL:
            entries = {entry.key: entry.value for entry in tensor.external_data}
            locations.add(entries.get("location", ""))
    for location in sorted(locations):
        confined(graph_file.parent, location, f"external data of {graph_file}", error=ArtifactError)


def _graph_tensors(graph: Any) -> Iterator[Any]:
    """Every tensor a graph holds: initializers, sparse initializers, node attributes and subgraphs."""
    yield from graph.initializer
    for sparse in graph.sparse_initializer:
        yield from (sparse.values, sparse.indices)
    yield from _node_tensors(graph.node)


def _node_tensors(nodes: Iterable[Any]) -> Iterator[Any]:
    for node in nodes:
        for attr in node.attribute:
            if attr.HasField("t"):
                yield attr.t
            yield from attr.tensors
            for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                yield from _graph_tensors(sub)
