"""Build dispatchtx: the compiled core when possible, the pure build otherwise.

- `DISPATCHTX_NO_EXTENSIONS=1` builds no extension (the pure build).
- A machine without a working C compiler (or without Cython) still installs
  the pure build, with a warning.
- The compiled module's stub lives in `stubs/` and is copied into the wheel
  beside `py.typed`.
- The wheel records whether the pure build was asked for
  (`dispatchtx/_build.py`), so that an import of a pure build nobody asked
  for (the compiler failed) warns instead of passing silently.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from typing import Any

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.build_py import build_py

HERE = Path(__file__).parent
STUBS = HERE / "stubs" / "dispatchtx"
NO_EXTENSIONS = os.environ.get("DISPATCHTX_NO_EXTENSIONS", "") not in ("", "0")


def warn(message: str) -> None:
    print(f"WARNING (dispatchtx): {message}", file=sys.stderr)


class BuildPyWithStubs(build_py):
    """Ship the compiled module's stubs inside the package, and the build's
    record of whether the pure build was asked for."""

    def run(self) -> None:
        super().run()
        target = Path(self.build_lib) / "dispatchtx"
        target.mkdir(parents=True, exist_ok=True)
        for stub in STUBS.glob("*.pyi"):
            shutil.copyfile(stub, target / stub.name)
        (target / "_build.py").write_text(
            '"""Written by setup.py when the wheel was built."""\n\n'
            f"PURE_BUILD_REQUESTED = {NO_EXTENSIONS!r}\n"
        )


class OptionalBuildExt(build_ext):
    """Fall back to the pure build when the extension cannot be compiled."""

    def run(self) -> None:
        try:
            super().run()
        except Exception as error:  # no compiler, broken toolchain
            warn(f"the compiled core could not be built ({error}); installing the pure build")

    def build_extension(self, ext: Any) -> None:
        try:
            super().build_extension(ext)
        except Exception as error:
            warn(f"building {ext.name} failed ({error}); installing the pure build")


def extensions() -> list[Extension]:
    if NO_EXTENSIONS:
        print("dispatchtx: DISPATCHTX_NO_EXTENSIONS is set; building the pure build")
        return []
    try:
        from Cython.Build import cythonize
    except ImportError:
        warn("Cython is not installed; installing the pure build")
        return []
    # -g0: the shipped extension carries no debug info (it is most of its size).
    no_debug_info = [] if sys.platform == "win32" else ["-g0"]
    return cythonize(
        [
            Extension(
                "dispatchtx._core",
                ["src/dispatchtx/_core.pyx"],
                extra_compile_args=no_debug_info,
            )
        ],
        compiler_directives={"language_level": "3"},
    )


setup(
    ext_modules=extensions(),
    cmdclass={"build_py": BuildPyWithStubs, "build_ext": OptionalBuildExt},
)
