"""Builds the optional C core of the runtime loop; everything else about the package is in pyproject.toml.

Without a working C compiler the install still succeeds (with a warning) and the loop uses its numpy twin.
SEER_DEPLOY_STRICT_BUILD=1 (CI) compiles with -Wall -Wextra -Werror and makes any build failure fatal.
"""

from __future__ import annotations

import os
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

STRICT_ENV = "SEER_DEPLOY_STRICT_BUILD"
# What a missing or failing compiler raises: no compiler found, the compiler not runnable, a compile/link error.
BUILD_FAILURES = (CCompilerError, ExecError, PlatformError, OSError)


def strict_build() -> bool:
    return os.environ.get(STRICT_ENV) == "1"


class OptionalBuildExt(build_ext):
    """build_ext that warns instead of failing, unless the strict build is asked for."""

    def run(self) -> None:
        try:
            super().run()
        except BUILD_FAILURES as exc:  # a missing compiler fails here, before any extension is tried
            self._give_up(exc)

    def build_extension(self, ext: Extension) -> None:
        if self.compiler.compiler_type == "unix":
            flags = ["-O3", "-std=c11"]
            if strict_build():
                flags += ["-Wall", "-Wextra", "-Werror"]
            ext.extra_compile_args = flags + list(ext.extra_compile_args or [])
        try:
            super().build_extension(ext)
        except BUILD_FAILURES as exc:
            self._give_up(exc)

    def _give_up(self, exc: BaseException) -> None:
        if strict_build():
            raise exc
        print(
            f"WARNING: the C core of seer-deploy's runtime loop was not built ({exc}); the numpy twin will be used. "
            f"Install a C compiler and reinstall for the faster host loop.",
            file=sys.stderr,
        )


setup(
    ext_modules=[Extension("seer_deploy.runtime._loopcore", sources=["seer_deploy/runtime/_loopcore.c"])],
    cmdclass={"build_ext": OptionalBuildExt},
)
