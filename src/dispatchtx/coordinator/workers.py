"""`Strikes`: how the coordinator tells a hung worker from a late answer.

A dispatch unanswered past its deadline is discarded either way; it counts
as a strike against its worker only if that worker has answered nothing
since the dispatch was sent. A worker that keeps answering while one of its
answers is late or lost is alive (on an oversubscribed machine late answers
come in bursts, and counting each of them lost healthy workers); `strikes`
such silent misses in a row lose the worker."""

from __future__ import annotations

__all__ = ["Strikes"]


class Strikes:
    __slots__ = ("_count", "_heard", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._count: dict[int, int] = {}
        self._heard: dict[int, float] = {}

    def heard(self, worker: int, now: float) -> None:
        """The worker answered (anything, even garbled or late): not hung."""
        self._count[worker] = 0
        self._heard[worker] = now

    def missed(self, worker: int, sent_at: float | None) -> bool:
        """A dispatch sent at `sent_at` missed its deadline; whether that
        makes `limit` silent misses in a row, so the worker is lost."""
        heard = self._heard.get(worker)
        if heard is not None and sent_at is not None and heard >= sent_at:
            self._count[worker] = 0  # it answered since this one went out
            return False
        count = self._count.get(worker, 0) + 1
        self._count[worker] = count
        return count >= self.limit

    def forgive(self, worker: int) -> None:
        """A lost worker readmitted starts with a clean slate."""
        self._count[worker] = 0

    def __getitem__(self, worker: int) -> int:
        return self._count.get(worker, 0)
