"""The house: the library apart from the jobs, and no source file that
holds two parts."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import dispatchtx

SOURCE = Path(__file__).resolve().parent.parent / "src" / "dispatchtx"
MAX_LINES = 800


def library_modules() -> list[str]:
    names = []
    for module in pkgutil.walk_packages(dispatchtx.__path__, "dispatchtx."):
        name = module.name
        if name.startswith("dispatchtx.jobs") or name == "dispatchtx.__main__":
            continue  # the programs, and the entry point that starts them
        names.append(name)
    return names


def test_the_library_has_its_parts() -> None:
    modules = set(library_modules())
    for part in ("core", "store", "fs", "transport", "coordinator", "resources", "journal"):
        assert any(part in name for name in modules), part


def test_importing_the_library_loads_no_job() -> None:
    # One fresh interpreter imports every library module: what any one of
    # them loads is a part of what all of them load.
    program = (
        "import importlib, sys\n"
        f"for name in {library_modules()!r}:\n"
        "    try:\n"
        "        importlib.import_module(name)\n"
        "    except ImportError:\n"
        "        if name != 'dispatchtx._core':\n"  # absent from the pure build
        "            raise\n"
        "print('\\n'.join(m for m in sys.modules if m.startswith('dispatchtx.jobs')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, check=True
    )
    assert done.stdout.split() == []


def test_no_source_file_over_the_limit() -> None:
    if not SOURCE.is_dir():
        return  # run from an installed copy without the source tree
    sizes = {
        path.relative_to(SOURCE).as_posix(): len(path.read_text().splitlines())
        for pattern in ("*.py", "*.pyx")
        for path in SOURCE.rglob(pattern)
    }
    assert sizes
    assert {name: n for name, n in sizes.items() if n > MAX_LINES} == {}
