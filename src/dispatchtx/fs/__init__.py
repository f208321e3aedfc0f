"""The filesystem and the clock, behind one small interface (docs/design.md).

The store and the journal reach the disk only through `FS` and time only
through `Clock`, so that the same store and journal code runs on the real
disk, in tests, in the simulator and in the campaign. One module per part:

- `interface`: the `FS`, `AppendHandle` and `Clock` protocols, the rules of
  durability, and the temp-file names;
- `real`: `RealFS` and `RealClock`, thin over `os` and this host's clocks;
- `faults`: the one fault vocabulary (`Op` names a call, `Fault` says what
  goes wrong, a `FaultHook` such as a scripted `DiskFaultPlan` of
  `FaultRule`s picks the fault for each call, a kill raises
  `SimulatedCrash`, a BaseException);
- `simulated`: `SimulatedFS`, an in-memory disk with a volatile and a
  durable image, `crash("process" | "power")` and a fault at any call, and
  the virtual clocks `SimulatedClock` on a shared `SimulatedTime`;
- `faulty`: `FaultyFS`, any `FS` (the real disk in the campaign) with faults
  at chosen calls and an injectable kill, and `RandomDiskFaults`.

Errors are the `OSError` subclasses `os` raises, so that store and journal
code handles a real and a simulated failure alike.
"""

from __future__ import annotations

from dispatchtx.fs.faults import (
    Call,
    DiskFaultPlan,
    Fault,
    FaultHook,
    FaultKind,
    FaultNotApplicable,
    FaultRule,
    FiredFault,
    Op,
    SimulatedCrash,
)
from dispatchtx.fs.faulty import (
    DISK_FAULTS,
    JOURNAL_DISK_FAULTS,
    FaultyAppendHandle,
    FaultyFS,
    KillAction,
    RandomDiskFaults,
    sigkill_self,
)
from dispatchtx.fs.interface import FS, TEMP_PREFIX, AppendHandle, Clock, is_temp_name
from dispatchtx.fs.real import RealAppendHandle, RealClock, RealFS
from dispatchtx.fs.simulated import (
    DEFAULT_WALL_START,
    CrashKind,
    SimulatedAppendHandle,
    SimulatedClock,
    SimulatedFS,
    SimulatedTime,
    UnsyncedTail,
)

__all__ = [
    "DEFAULT_WALL_START",
    "DISK_FAULTS",
    "FS",
    "JOURNAL_DISK_FAULTS",
    "TEMP_PREFIX",
    "AppendHandle",
    "Call",
    "Clock",
    "CrashKind",
    "Fault",
    "FaultHook",
    "FaultKind",
    "FaultNotApplicable",
    "DiskFaultPlan",
    "FaultRule",
    "FaultyAppendHandle",
    "FaultyFS",
    "FiredFault",
    "KillAction",
    "Op",
    "RandomDiskFaults",
    "RealAppendHandle",
    "RealClock",
    "RealFS",
    "SimulatedAppendHandle",
    "SimulatedClock",
    "SimulatedCrash",
    "SimulatedFS",
    "SimulatedTime",
    "UnsyncedTail",
    "is_temp_name",
    "sigkill_self",
]
