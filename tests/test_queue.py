"""coordinator.queue: the one work queue the workloads share."""

from __future__ import annotations

import pytest

from dispatchtx.coordinator import QueueState, WorkQueue


def test_items_are_taken_in_order_and_given_back_to_the_end() -> None:
    queue = WorkQueue(["a", "b", "c"])
    assert queue.take() == "a"
    assert queue.take() == "b"
    queue.give_back("a")
    assert [queue.take(), queue.take(), queue.take()] == ["c", "a", None]
    assert queue.state("a") is QueueState.TAKEN
    assert queue.remaining() == 3


def test_done_and_dropped_are_final_and_skipped() -> None:
    queue = WorkQueue(["a", "b", "c"])
    assert queue.done("b") is True
    assert queue.drop("c") is True
    assert queue.done("b") is False and queue.drop("b") is False
    assert queue.done("unknown") is False
    queue.give_back("b")  # not TAKEN: left as it is
    assert queue.state("b") is QueueState.DONE
    assert queue.state("c") is QueueState.DROPPED
    assert [queue.take(), queue.take()] == ["a", None]
    assert queue.remaining() == 1
    queue.done("a")
    assert queue.remaining() == 0
    assert queue.items() == ["a", "b", "c"] and len(queue) == 3 and "a" in queue


def test_adding_an_id_twice_adds_nothing() -> None:
    queue = WorkQueue(["a"])
    with pytest.raises(ValueError, match="'a' was added before"):
        queue.add(["b", "a"])
    with pytest.raises(ValueError, match="'c' was added before"):
        queue.add(["c", "c"])
    assert queue.items() == ["a"] and queue.remaining() == 1
    with pytest.raises(KeyError):
        queue.state("b")


def test_a_new_incarnation_gets_the_taken_items_back_in_order() -> None:
    queue = WorkQueue(["a", "b", "c", "d"])
    assert [queue.take(), queue.take(), queue.take()] == ["a", "b", "c"]
    queue.done("b")
    assert queue.give_back_taken() == 2
    assert [queue.take(), queue.take(), queue.take(), queue.take()] == ["d", "a", "c", None]
