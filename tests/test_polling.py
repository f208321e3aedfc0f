"""The polling policy of every rank (`dispatchtx.transport.Backoff`): yield
while messages flow, back off once idle."""

from __future__ import annotations

import math
from typing import Any

import pytest

from dispatchtx.transport import MAX_BACKOFF, MIN_BACKOFF, Backoff, interface


class FakeTime:
    """The clock and the two ways to wait that `Backoff` uses, recorded."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []
        self.yields = 0
        where = interface.__name__
        monkeypatch.setattr(f"{where}.time.monotonic", lambda: self.now)
        monkeypatch.setattr(f"{where}.time.sleep", self.sleeps.append)
        monkeypatch.setattr(f"{where}.os.sched_yield", self._yield)

    def _yield(self) -> None:
        self.yields += 1


def test_it_yields_for_its_spin_then_backs_off_doubling_to_the_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeTime(monkeypatch)
    backoff = Backoff(spin=0.001)
    for _ in range(5):
        backoff.sleep()
    assert (clock.yields, clock.sleeps) == (5, [])
    clock.now += 0.001
    for _ in range(14):
        backoff.sleep()
    assert clock.yields == 5
    assert clock.sleeps[:3] == [MIN_BACKOFF, 2 * MIN_BACKOFF, 4 * MIN_BACKOFF]
    assert clock.sleeps[-1] == MAX_BACKOFF
    assert max(clock.sleeps) == MAX_BACKOFF


def test_a_message_brings_back_the_spin(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime(monkeypatch)
    backoff = Backoff(spin=0.001)
    clock.now += 0.01
    backoff.sleep()
    backoff.sleep()
    assert clock.sleeps == [MIN_BACKOFF, 2 * MIN_BACKOFF]
    backoff.reset()
    backoff.sleep()
    assert clock.yields == 1 and len(clock.sleeps) == 2
    clock.now += 0.01
    backoff.sleep()
    assert clock.sleeps[-1] == MIN_BACKOFF  # the back-off starts over as well


def test_no_spin_backs_off_at_once_and_an_endless_spin_never_sleeps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = FakeTime(monkeypatch)
    Backoff(spin=0.0).sleep()
    assert clock.sleeps == [MIN_BACKOFF] and clock.yields == 0
    endless = Backoff(spin=math.inf)
    clock.now += 1e9
    for _ in range(100):
        endless.sleep()
    assert clock.yields == 100 and clock.sleeps == [MIN_BACKOFF]


def test_a_sleep_never_outlasts_its_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = FakeTime(monkeypatch)
    backoff = Backoff(spin=0.0)
    for _ in range(20):
        backoff.sleep(limit=5e-5)
    assert max(clock.sleeps) == 5e-5


@pytest.mark.parametrize("spin", [-1e-6, math.nan, -math.inf])
def test_a_spin_that_is_no_duration_is_refused(spin: float) -> None:
    with pytest.raises(ValueError, match="spin"):
        Backoff(spin)


class _DoneRequest:
    def Test(self) -> bool:
        return True


class _QuietComm:
    """Rank 0 of two ranks where no result ever arrives; sends complete at once."""

    def Get_rank(self) -> int:
        return 0

    def Get_size(self) -> int:
        return 2

    def Improbe(self, source: int, tag: int, status: object) -> None:
        return None

    def Isend(self, data: bytes, rank: int, tag: int) -> _DoneRequest:
        return _DoneRequest()


def test_an_idle_coordinator_stays_backed_off_from_one_poll_to_the_next(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("mpi4py")
    from dispatchtx.transport import MPITransport, Work

    yields = 0

    def counting_yield() -> None:
        nonlocal yields
        yields += 1

    monkeypatch.setattr(f"{interface.__name__}.os.sched_yield", counting_yield)
    transport = MPITransport(_QuietComm(), spin=0.001)  # type: ignore[arg-type]
    assert transport.poll(0.003) == []  # spins its first ms, then sleeps
    assert yields > 0
    yields = 0
    assert transport.poll(0.003) == []
    assert transport.poll(0.003) == []
    assert yields == 0  # idle since long before: no spin at each poll
    transport.send(0, Work(1, "item", 1, None, {}))
    assert transport.poll(0.003) == []
    assert yields > 0  # a message went out: its answer is due soon
    transport.close()


class _Status:
    def __init__(self) -> None:
        self.count = 0
        self.source = 0

    def Get_count(self, datatype: object = None) -> int:
        return self.count

    def Get_source(self) -> int:
        return self.source


class _Message:
    def __init__(self, data: bytes) -> None:
        self.data = data

    def Recv(self, buffer: bytearray) -> None:
        buffer[:] = self.data


class _TricklingComm(_QuietComm):
    """Results that are all on their way, but each probe makes progress for
    one of them only on every other call (as MPICH's ch4 devices did here)."""

    def __init__(self, results: list[bytes]) -> None:
        self.waiting = list(results)
        self.probes = 0

    def Improbe(  # type: ignore[override]
        self, source: int, tag: int, status: Any
    ) -> _Message | None:
        self.probes += 1
        if not self.waiting or self.probes % 2:
            return None
        data = self.waiting.pop(0)
        status.count, status.source = len(data), 1
        return _Message(data)


def test_a_poll_takes_every_result_on_its_way_not_only_the_first() -> None:
    pytest.importorskip("mpi4py")
    from dispatchtx.transport import MPITransport, Result
    from dispatchtx.transport.messages import _encode_result

    results = [_encode_result(Result(n, f"item-{n}", 1, b"r", 0.0)) for n in range(8)]
    comm = _TricklingComm(results)
    transport = MPITransport(comm, spin=0.001)  # type: ignore[arg-type]
    arrived = transport.poll(0.05)
    assert [message.dispatch_id for _, message in arrived] == list(range(8))  # type: ignore[union-attr]
    assert comm.waiting == []
    assert transport.poll(0.0) == []
    transport.close()
