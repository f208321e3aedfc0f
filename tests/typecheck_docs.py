"""mypy --strict over every Python program of the README and docs/: what
the documents show a typed user must type-check as written (run by tox's
mypy leg, after the check of the sources)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from doc_blocks import PROJECT, blocks


def main() -> int:
    programs = blocks("python")
    if not programs:
        print("no Python blocks found in the documents", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as directory:
        files = []
        for block in programs:
            name = f"{block.document.stem.lower()}_{block.line}.py"
            (Path(directory) / name).write_text(block.code)
            files.append(name)
        env = dict(os.environ)
        env["MYPYPATH"] = os.pathsep.join([str(PROJECT / "src"), str(PROJECT / "stubs")])
        command = [sys.executable, "-m", "mypy", "--strict", "--no-incremental", *files]
        done = subprocess.run(command, cwd=directory, env=env, check=False)
        for block, name in zip(programs, files, strict=True):
            print(f"{name}: {block.name}")
        return done.returncode


if __name__ == "__main__":
    sys.exit(main())
