"""User-facing errors: each names the problem and the fix; the CLI prints them as one line."""


class SeerDeployError(Exception):
    """Base class for errors caused by the user's input (exit code 2 on the CLI)."""

    exit_code = 2


class CheckpointError(SeerDeployError):
    """A checkpoint directory is missing, malformed or of an unknown layout."""


class ConfigError(SeerDeployError):
    """Invalid generation, export or build settings."""


class ArtifactError(SeerDeployError):
    """An export or engine directory does not match what is being asked of it."""


class UnverifiedExport(SeerDeployError):
    """An export finished and was installed, but its check against torch failed: the work is kept, marked unverified
    in its manifest, and the run fails (exit code 1: not the user's input, but not a result to trust blindly)."""

    exit_code = 1
