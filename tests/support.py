"""Test helpers shared by the core tests and the resource adapters' tests."""

from __future__ import annotations

from dataclasses import dataclass, field

from dispatchtx import Compensation, DispatchTables, Transaction


@dataclass
class Recorder:
    """Declares compensations whose callables log (resource, side, arg)."""

    log: list[tuple[str, str, object]] = field(default_factory=list)
    failing: set[tuple[str, str]] = field(default_factory=set)
    interrupting: set[tuple[str, str]] = field(default_factory=set)
    exiting: set[tuple[str, str]] = field(default_factory=set)

    def _call(self, resource: str, side: str, arg: object) -> None:
        self.log.append((resource, side, arg))
        if (resource, side) in self.interrupting:
            raise KeyboardInterrupt(f"{resource}.{side}")
        if (resource, side) in self.exiting:
            raise SystemExit(f"{resource}.{side}")
        if (resource, side) in self.failing:
            raise RuntimeError(f"{resource}.{side} failed")

    def compensation(
        self, tables: DispatchTables, name: str, *, on_commit: bool = True
    ) -> Compensation[object]:
        def before(arg: object) -> None:
            self._call(name, "before", arg)

        def after(arg: object) -> None:
            self._call(name, "after", arg)

        def release(arg: object) -> None:
            self._call(name, "commit", arg)

        return tables.compensation(name, before, after, release if on_commit else None)

    def sides(self) -> list[str]:
        return [side for _, side, _ in self.log]

    def clear(self) -> None:
        self.log.clear()


def add_three(tables: DispatchTables, recorder: Recorder, worker: int = 0) -> int:
    """Prepare a dispatch holding compensations a, b, c with args 1, 2, 3."""
    txn = tables.prepare(worker)
    for name, arg in (("a", 1), ("b", 2), ("c", 3)):
        txn.add(recorder.compensation(tables, name), arg)
    return txn.id


def table_state(tables: DispatchTables) -> list[tuple[int, int, str]]:
    """What every table holds, for "nothing moved" checks."""
    return [(txn.id, txn.worker, txn.phase.name) for txn in tables.in_flight()]


def require_mpi() -> None:
    """Skip where there is no MPI, unless DISPATCHTX_REQUIRE_MPI says the MPI
    tests must run (tox sets it: a skipped MPI leg is no leg)."""
    import os

    import pytest

    try:
        import mpi4py  # noqa: F401

        from dispatchtx.launch import find_mpiexec

        find_mpiexec()
    except Exception as error:
        if os.environ.get("DISPATCHTX_REQUIRE_MPI"):
            raise
        pytest.skip(f"no MPI here: {error}")


# -- resource adapters ----------------------------------------------------------

#: The stages the algorithm selector tests (and the world of adapters) use.
STAGES = ("det", "havoc", "splice")


def send(tables: DispatchTables, txn: Transaction, now: float = 1.0) -> None:
    tables.sent(txn.id, now)


def commit(tables: DispatchTables, txn: Transaction) -> None:
    """Fence, then finish with no failure."""
    tables.fence_passed(txn.id)
    assert tables.finished(txn.id) == ()
