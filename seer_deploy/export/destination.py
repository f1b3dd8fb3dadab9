"""Whether an export may be written at its destination: an empty or absent directory, or this tool's export of the
same model (of any model with --force); never a directory holding files seer-deploy did not write there."""

from __future__ import annotations

import re
from pathlib import Path

from seer_deploy.core.atomic import OWNER_FILE, OWNER_FORMAT, check_replaceable, remove_stale_temporaries
from seer_deploy.core.errors import SeerDeployError
from seer_deploy.core.files import read_json
from seer_deploy.models.checkpoints.checkpoint_files import checkpoint_fingerprint

ARTIFACT_KIND = "export"  # the ownership marker's kind (core.atomic.claim)
NESTED_TEMPORARY = re.compile(r"^\.(?P<name>.+)\.\w+-\d+-[0-9a-f]{8}(?:\.old)?$")  # core.atomic.temp_dir_beside's


def destination_fingerprint(dest: Path, checkpoint: Path, force: bool) -> str | None:
    """Refuse a destination this export may not replace (check_replaceable); the checkpoint's fingerprint, when the
    check needed it (an export is there and no --force), so that a checkpoint is hashed up front only then."""
    remove_nested_debris(dest)
    check_replaceable(dest, ARTIFACT_KIND, None, force)
    if force or not dest.is_dir() or not any(dest.iterdir()):
        return None
    fingerprint = checkpoint_fingerprint(checkpoint)
    check_replaceable(dest, ARTIFACT_KIND, fingerprint, force)
    return fingerprint


def remove_nested_debris(dest: Path) -> None:
    """In our own export only: remove what a killed `export --build` left inside it (the engine's temporary
    directory beside DIR/engine), which would otherwise count as a file seer-deploy did not write there."""
    if dest.is_symlink() or not (dest / OWNER_FILE).is_file():
        return
    try:
        marker = read_json(dest / OWNER_FILE, "ownership marker")
    except SeerDeployError:
        return  # check_replaceable names the problem
    if marker.get("format") != OWNER_FORMAT or marker.get("kind") != ARTIFACT_KIND:
        return
    for entry in list(dest.iterdir()):
        match = NESTED_TEMPORARY.match(entry.name)
        if match is not None:
            remove_stale_temporaries(dest / match["name"])  # temporaries of live writers stay
