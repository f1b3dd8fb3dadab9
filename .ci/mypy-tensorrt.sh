#!/usr/bin/env bash
# Type-check the TensorRT modules (both flavours, engines/tensorrt_library.py) against the installed tensorrt-stubs.
#
# Why the detour: tensorrt-stubs 10.13.0.35.1 installs its .pyi files as plain `tensorrt/` and
# `tensorrt_bindings/` packages without a py.typed marker, so mypy skips them and `trt` silently becomes Any
# (ignore_missing_imports hides it); five method signatures in them are not valid Python (a parameter named
# `in`, a non-default parameter after defaults). This script copies the stubs to a temp dir, replaces only the
# parameter lists that do not parse with (*args, **kwargs), puts the copy on MYPYPATH, proves that mypy now
# sees real TensorRT types (a probe must reveal Builder.build_serialized_network), then checks the modules.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"  # the active environment's (CI activates its venv); override with PYTHON=...

STUBS="$(mktemp -d)"
trap 'rm -rf "${STUBS}"' EXIT

"${PYTHON}" - "${STUBS}" <<'PY'
"""Copy tensorrt-stubs' .pyi files to argv[1], repairing the few signatures that do not parse."""
import ast
import sys
from importlib import metadata
from pathlib import Path

out = Path(sys.argv[1])
try:
    dist = metadata.distribution("tensorrt-stubs")
except metadata.PackageNotFoundError:
    sys.exit("tensorrt-stubs is not installed; pip install tensorrt-stubs==10.13.0.35.1")
files = [f for f in dist.files or [] if str(f).endswith(".pyi") and str(f).split("/")[0] in ("tensorrt", "tensorrt_bindings")]
if not files:
    sys.exit("tensorrt-stubs has no tensorrt/*.pyi files; its layout changed, update .ci/mypy-tensorrt.sh")
for f in files:
    lines = Path(dist.locate_file(f)).read_text().splitlines()
    for i, line in enumerate(lines):
        body = line.strip()
        if not (body.startswith("def ") and body.endswith(":")):
            continue
        try:
            ast.parse(body + " ...")
        except SyntaxError:
            name = body[4 : body.index("(")]
            ret = body[body.rindex(")") + 1 : -1]  # " -> T"
            first = body[body.index("(") + 1 :].split(",")[0].split(":")[0].strip()
            params = "self, *args: typing.Any, **kwargs: typing.Any" if first == "self" else "*args: typing.Any, **kwargs: typing.Any"
            lines[i] = line[: len(line) - len(line.lstrip())] + f"def {name}({params}){ret}:"
    text = "# mypy: ignore-errors\n" + "\n".join(lines) + "\n"
    ast.parse(text)  # fail here, loudly, if a repair was not enough
    dest = out / str(f)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
PY

export MYPYPATH="${STUBS}${MYPYPATH:+:${MYPYPATH}}"
FLAGS=(--follow-imports=silent --disallow-untyped-defs --disallow-incomplete-defs --warn-unused-ignores)

# The probe: if the stubs were not picked up, trt is Any and the real check below would pass vacuously.
PROBE="${STUBS}/probe_tensorrt_types.py"
# Also the binding every function of ours uses to call either flavour (engines/tensorrt_library.py): a local that is
# the stubs' module for mypy and the imported library at run time must keep the stubs' types, not turn into Any.
cat > "${PROBE}" <<'EOF'
from types import ModuleType
from typing import TYPE_CHECKING

import tensorrt as trt
reveal_type(trt.Builder.build_serialized_network)


def bound(module: ModuleType) -> None:
    if TYPE_CHECKING:
        api = trt
    else:
        api = module
    reveal_type(api.Builder.build_serialized_network)
EOF
REVEALED="$("${PYTHON}" -m mypy "${FLAGS[@]}" "${PROBE}" 2>&1 || true)"
if [ "$(grep -c "IHostMemory" <<< "${REVEALED}")" -ne 2 ]; then
    echo "mypy-tensorrt: mypy does not see the TensorRT stubs (trt is Any); check the tensorrt-stubs install" >&2
    echo "${REVEALED}" >&2
    exit 1
fi

"${PYTHON}" -m mypy "${FLAGS[@]}" seer_deploy/engines/tensorrt_library.py seer_deploy/engines/tensorrt_build.py \
    seer_deploy/engines/tensorrt_engine.py
