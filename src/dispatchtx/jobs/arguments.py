"""Command-line checking shared by the jobs: every job refuses bad input
before it starts anything, with one line and exit status 2 (argparse's
convention), and shows each option's default in its help."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

__all__ = [
    "CONFIGURATION_ERROR",
    "JobParser",
    "directory",
    "float_between",
    "int_at_least",
    "new_file",
    "positive_float",
    "refuse",
]

# A job's own configuration error: never worth a restart (the campaign
# reads it so).
CONFIGURATION_ERROR = 2


class JobParser(argparse.ArgumentParser):
    """An ArgumentParser whose help shows the defaults and whose errors are
    one line (no usage block to read past) with exit status 2."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        kwargs.setdefault("formatter_class", DefaultsFormatter)
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    def error(self, message: str) -> NoReturn:
        refuse(self.prog, message)


def refuse(prog: str, message: str) -> NoReturn:
    """End a job that has not started: one line, exit status 2 (under
    mpiexec every rank parses the same arguments: rank 0 alone says so)."""
    if os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")) == "0":
        sys.stderr.write(f"{prog}: error: {message} (see {prog} --help)\n")
    sys.exit(CONFIGURATION_ERROR)


class DefaultsFormatter(
    argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter
):
    """Defaults on every option; descriptions keep their own line breaks."""


def int_at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {value}")
        return value

    parse.__name__ = f"int >= {minimum}"
    return parse


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
    return value


def positive_float(text: str) -> float:
    value = _float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be greater than 0, not {value:g}")
    return value


def float_between(low: float, high: float) -> Callable[[str], float]:
    def parse(text: str) -> float:
        value = _float(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g}, not {value:g}")
        return value

    parse.__name__ = f"number in [{low:g}, {high:g}]"
    return parse


def new_file(text: str) -> str:
    """A file the job will write once its work is done: checked now, so that
    the work is not lost to a path that cannot be written."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    parent = path.parent
    if not parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: directory {parent} does not exist")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text}: directory {parent} is not writable")
    if path.exists() and not os.access(path, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text} exists and is not writable")
    return text


def directory(text: str) -> str:
    """An existing, writable directory."""
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is not a directory")
    if not os.access(path, os.W_OK | os.X_OK):
        raise argparse.ArgumentTypeError(f"{text} is not writable")
    return text
