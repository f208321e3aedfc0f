"""dispatchtx: every dispatch from an MPI coordinator to a worker rank as a
compensating transaction.

This is the one import point that chooses the build of the core: the
compiled extension `dispatchtx._core` when it is there, else the pure-Python
twin `dispatchtx._core_py`. `COMPILED` says which one is loaded; setting
`DISPATCHTX_NO_EXTENSIONS=1` forces the pure one at import time too.

A pure build that nobody asked for (the compiler failed when the wheel was
built, and pip may have cached that wheel) warns once at import, with a
`RuntimeWarning` that says how to rebuild.
"""

from __future__ import annotations

import importlib
import os
import warnings
from typing import TYPE_CHECKING, Final

from dispatchtx.errors import (
    CompensationError,
    CompensationFailure,
    DispatchError,
    Failures,
    IllegalMove,
    Phase,
    Side,
    UnknownDispatch,
    WorkerBusy,
    WrongWorker,
    raise_failures,
)

__all__ = [
    "COMPILED",
    "Compensation",
    "CompensationError",
    "CompensationFailure",
    "DispatchError",
    "DispatchTables",
    "Failures",
    "IllegalMove",
    "Phase",
    "Side",
    "Transaction",
    "UnknownDispatch",
    "WorkerBusy",
    "WrongWorker",
    "raise_failures",
]

__version__ = "0.1.0"


def _extensions_disabled() -> bool:
    return os.environ.get("DISPATCHTX_NO_EXTENSIONS", "") not in ("", "0")


def _pure_build_requested() -> bool:
    """Whether the installed wheel was built with DISPATCHTX_NO_EXTENSIONS
    set (setup.py records it); a source tree has no record: not requested."""
    try:
        build = importlib.import_module("dispatchtx._build")
    except ImportError:
        return False
    return getattr(build, "PURE_BUILD_REQUESTED", False) is True


_UNREQUESTED_PURE_BUILD = (
    "dispatchtx loaded its pure-Python core: the compiled extension "
    "dispatchtx._core is missing or failed to import, and the build did not "
    "ask for the pure one (DISPATCHTX_NO_EXTENSIONS was unset). The pure core "
    "works but costs several times more per dispatch. To rebuild with a C "
    "compiler and Cython present: pip install --force-reinstall --no-cache-dir "
    "--no-binary dispatchtx dispatchtx (or pip install --force-reinstall "
    "--no-cache-dir . in a checkout). Set DISPATCHTX_NO_EXTENSIONS=1 to ask "
    "for the pure core and silence this warning."
)


if TYPE_CHECKING:
    # Both builds present the API that stubs/dispatchtx/_core.pyi describes.
    from dispatchtx._core import Compensation, DispatchTables, Transaction

    _loaded_compiled: bool = True
else:
    _loaded_compiled = False
    if not _extensions_disabled():
        try:
            from dispatchtx._core import Compensation, DispatchTables, Transaction

            _loaded_compiled = True
        except ImportError:
            pass
    if not _loaded_compiled:
        from dispatchtx._core_py import Compensation, DispatchTables, Transaction

        if not _extensions_disabled() and not _pure_build_requested():
            warnings.warn(_UNREQUESTED_PURE_BUILD, RuntimeWarning, stacklevel=1)

COMPILED: Final[bool] = _loaded_compiled
del _loaded_compiled
