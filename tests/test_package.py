"""The package's import point: which core it loads and what it says when the
pure core was loaded though nobody asked for it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import dispatchtx

PACKAGE = Path(dispatchtx.__file__).parent


def pure_copy(tmp_path: Path, build_record: str | None) -> Path:
    """A copy of the package without its extension, as a wheel whose
    compiler failed installs it; `build_record` is its `_build.py` (None: no
    record, as in a source tree)."""
    root = tmp_path / "site"
    shutil.copytree(
        PACKAGE,
        root / "dispatchtx",
        ignore=shutil.ignore_patterns("*.so", "*.pyd", "__pycache__", "_build.py"),
    )
    if build_record is not None:
        (root / "dispatchtx" / "_build.py").write_text(build_record)
    return root


def import_stderr(root: Path, *, no_extensions: str | None = None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "DISPATCHTX_NO_EXTENSIONS"}
    env["PYTHONPATH"] = str(root)
    if no_extensions is not None:
        env["DISPATCHTX_NO_EXTENSIONS"] = no_extensions
    program = (
        "import dispatchtx, dispatchtx.store\n"
        "import dispatchtx.coordinator\n"
        "assert dispatchtx.COMPILED is False, 'the copy must load the pure core'\n"
        f"assert dispatchtx.__file__.startswith({str(root)!r})\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.parametrize(
    "record", [None, "PURE_BUILD_REQUESTED = False\n"], ids=["source-tree", "compiler-failed"]
)
def test_an_unrequested_pure_build_warns_once_naming_how_to_rebuild(
    tmp_path: Path, record: str | None
) -> None:
    stderr = import_stderr(pure_copy(tmp_path, record))
    assert stderr.count(": RuntimeWarning: ") == 1, stderr
    assert "pure-Python core" in stderr
    assert "--no-binary dispatchtx" in stderr
    assert "DISPATCHTX_NO_EXTENSIONS=1" in stderr


def test_a_pure_build_asked_for_at_build_time_is_quiet(tmp_path: Path) -> None:
    stderr = import_stderr(pure_copy(tmp_path, "PURE_BUILD_REQUESTED = True\n"))
    assert ": RuntimeWarning: " not in stderr, stderr


def test_a_pure_core_asked_for_at_import_time_is_quiet(tmp_path: Path) -> None:
    stderr = import_stderr(pure_copy(tmp_path, None), no_extensions="1")
    assert ": RuntimeWarning: " not in stderr, stderr


def test_a_record_of_another_type_is_not_a_request(tmp_path: Path) -> None:
    stderr = import_stderr(pure_copy(tmp_path, "PURE_BUILD_REQUESTED = 'yes'\n"))
    assert stderr.count(": RuntimeWarning: ") == 1, stderr


@pytest.mark.skipif(not dispatchtx.COMPILED, reason="needs the compiled core")
def test_the_compiled_core_loads_quietly() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DISPATCHTX_NO_EXTENSIONS"}
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", "import dispatchtx; assert dispatchtx.COMPILED"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


SOURCE_ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(
    not (SOURCE_ROOT / "setup.py").exists(), reason="needs the project's source tree"
)
def test_the_sdist_carries_its_tests_and_its_license_and_runs_them(tmp_path: Path) -> None:
    pytest.importorskip("setuptools")
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("setup.py", "pyproject.toml", "MANIFEST.in", "README.md", "LICENSE", "tox.ini"):
        shutil.copyfile(SOURCE_ROOT / name, checkout / name)
    junk = shutil.ignore_patterns("__pycache__", "*.so", "*.c", "*.egg-info", ".*")
    for name in ("src", "stubs", "tests", "docs", "benchmarks"):
        shutil.copytree(SOURCE_ROOT / name, checkout / name, ignore=junk)
    env = dict(os.environ, DISPATCHTX_NO_EXTENSIONS="1")
    built = subprocess.run(
        [sys.executable, "setup.py", "-q", "sdist", "-d", str(tmp_path / "dist")],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (archive,) = (tmp_path / "dist").glob("dispatchtx-*.tar.gz")
    shutil.unpack_archive(archive, tmp_path / "unpacked")
    (unpacked,) = (tmp_path / "unpacked").iterdir()
    for needed in ("LICENSE", "tests/conftest.py", "tests/support.py", "docs/guide.md"):
        assert (unpacked / needed).is_file(), f"the sdist lacks {needed}"
    shipped_tests = {p.name for p in (unpacked / "tests").glob("*.py")}
    assert shipped_tests == {p.name for p in (SOURCE_ROOT / "tests").glob("*.py")}
    # The unpacked tests run against the installed package.
    pytest_quiet = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    ran = subprocess.run(
        [*pytest_quiet, "tests/test_core_moves.py"],
        cwd=unpacked,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert ran.returncode == 0, ran.stdout + ran.stderr


def test_an_installed_wheel_carries_the_license() -> None:
    from importlib import metadata

    try:
        distribution = metadata.distribution("dispatchtx")
    except metadata.PackageNotFoundError:
        pytest.skip("dispatchtx is not installed here")
    if distribution.read_text("WHEEL") is None:
        pytest.skip("dispatchtx is not installed from a wheel here (a source tree's egg-info)")
    files = distribution.files or []
    assert any(Path(str(f)).name == "LICENSE" for f in files), files
