"""The documentation runs: every Python block of the README and the guide is
a complete program, run here as written (the MPI ones under `mpiexec`), and
every command the shell blocks name exists.

A block runs as `python {file}` unless the comment line just above its fence
says how: `<!-- run: mpiexec -n 3 python {file} {tmp}/store -->`, several
commands separated by ` ;; ` and run in order (`{file}` is the block written
to a file, `{tmp}` a fresh directory for the block). Each command must exit
with status 0 within its timeout.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from dispatchtx.launch import find_mpiexec
from doc_blocks import DOCUMENTS, PROJECT, Block, blocks

TIMEOUT = 120.0
_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _argv(command: str, file: Path, tmp: Path) -> list[str]:
    words = shlex.split(command.format(file=file, tmp=tmp))
    programs = {"python": sys.executable, "mpiexec": find_mpiexec()}
    return [programs.get(word, word) for word in words]


def _run(argv: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    # A job of its own process group, killed whole if it hangs: under MPICH
    # a stuck rank would otherwise outlive its launcher.
    env = dict(os.environ)
    if env.get("PYTHONPATH"):  # relative entries would not survive the change of cwd
        paths = env["PYTHONPATH"].split(os.pathsep)
        env["PYTHONPATH"] = os.pathsep.join(str(Path(path).resolve()) for path in paths)
    process = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        pytest.fail(f"{shlex.join(argv)} did not end in {TIMEOUT:.0f} s:\n{output}")
    return subprocess.CompletedProcess(argv, process.returncode, output, "")


PYTHON_BLOCKS = blocks("python")


def test_the_guide_and_the_readme_have_programs() -> None:
    documents = {block.document.name for block in PYTHON_BLOCKS}
    assert {"README.md", "guide.md"} <= documents
    assert any("mpiexec" in command for block in PYTHON_BLOCKS for command in block.commands)


@pytest.mark.parametrize("block", PYTHON_BLOCKS, ids=lambda block: block.name)
def test_python_block_runs(block: Block, tmp_path: Path) -> None:
    if any("mpiexec" in command for command in block.commands):
        pytest.importorskip("mpi4py")
    file = tmp_path / "program.py"
    file.write_text(block.code)
    for command in block.commands:
        done = _run(_argv(command, file, tmp_path), tmp_path)
        assert done.returncode == 0, (
            f"{block.name}: {command!r} exited {done.returncode}:\n{done.stdout}"
        )


def _shell_modules() -> set[str]:
    modules = set()
    for block in blocks("sh"):
        for line in block.code.splitlines():
            for match in re.finditer(r"python3? -m ([\w.]+)( [a-z][\w-]*)?", line):
                module, subcommand = match.group(1), (match.group(2) or "").strip()
                if module in ("pip", "tox"):
                    continue
                modules.add(f"{module} {subcommand}".strip())
    return modules


@pytest.mark.parametrize("program", sorted(_shell_modules()))
def test_documented_command_exists(program: str, tmp_path: Path) -> None:
    module, *subcommand = program.split()
    if module.startswith("dispatchtx.jobs.mpi_job") or module.endswith("transport_selftest"):
        pytest.importorskip("mpi4py")
    done = _run([sys.executable, "-m", module, *subcommand, "--help"], tmp_path)
    assert done.returncode == 0, (
        f"python -m {program} --help exited {done.returncode}:\n{done.stdout}"
    )


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda document: document.name)
def test_links_stay_inside_the_project(document: Path) -> None:
    for target in _LINK.findall(document.read_text()):
        if target.startswith(("http://", "https://", "#")):
            continue
        path = (document.parent / target.split("#", 1)[0]).resolve()
        assert path.is_relative_to(PROJECT), f"{document.name} links outside the project: {target}"
        assert path.exists(), f"{document.name} links to a missing file: {target}"
    assert "../shared" not in document.read_text()
