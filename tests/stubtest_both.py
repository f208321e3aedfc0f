"""Check stubs/dispatchtx/_core.pyi against BOTH builds with mypy.stubtest.

The compiled module is checked as installed (the wheel ships the stub
beside it). The pure twin has no stub of its own: this script lays out a
copy of the installed package in a temporary directory with the same stub
as `_core_py.pyi`, so that stubtest holds the pure build to the same API.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import dispatchtx

HERE = Path(__file__).resolve().parent
STUB = HERE.parent / "stubs" / "dispatchtx" / "_core.pyi"
ALLOWLIST = HERE.parent / "stubs" / "stubtest-allowlist.txt"


def stubtest(module: str, mypy_path: str | None) -> int:
    env = dict(os.environ)
    command = [sys.executable, "-m", "mypy.stubtest", module, "--allowlist", str(ALLOWLIST)]
    if mypy_path is not None:
        env["MYPYPATH"] = mypy_path
        # The allowlist names what Cython generates: unused for the pure twin.
        command.append("--ignore-unused-allowlist")
    print("+", " ".join(command), flush=True)
    return subprocess.run(command, env=env, check=False).returncode


def main() -> int:
    if not dispatchtx.COMPILED:
        print("stubtest: the compiled build did not load", file=sys.stderr)
        return 1
    installed = Path(dispatchtx.__file__).parent
    if not (installed / "_core.pyi").is_file():
        print(f"stubtest: the wheel did not ship _core.pyi in {installed}", file=sys.stderr)
        return 1
    failed = stubtest("dispatchtx._core", None)
    with tempfile.TemporaryDirectory() as tmp:
        package = Path(tmp) / "dispatchtx"
        package.mkdir()
        for source in installed.glob("*.py"):
            shutil.copyfile(source, package / source.name)
        shutil.copyfile(installed / "py.typed", package / "py.typed")
        shutil.copyfile(STUB, package / "_core_py.pyi")
        failed |= stubtest("dispatchtx._core_py", tmp)
    return failed


if __name__ == "__main__":
    sys.exit(main())
