"""Reading the JSON file of an artifact (an export's manifest.json, an engine's engine.json)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from seer_deploy.core.errors import ArtifactError


def read_json(path: Path, fix: str) -> Any:
    """The parsed file; ArtifactError saying it is not JSON, and `fix` (how to make a good one), when it is not."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ArtifactError(f"{path} is not valid JSON ({exc}); {fix}") from exc
