"""dispatchtx: every dispatch from an MPI coordinator to a worker rank as a
compensating transaction.

This is the one import point that chooses the build of the core: the
compiled extension `dispatchtx._core` when it is there, else the pure-Python
twin `dispatchtx._core_py`. `COMPILED` says which one is loaded; setting
`DISPATCHTX_NO_EXTENSIONS=1` forces the pure one at import time too.
"""

from __future__ import annotations

import os
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

COMPILED: Final[bool] = _loaded_compiled
del _loaded_compiled
