"""Strikes: a silent worker is lost, a late answer of a live one is not."""

from __future__ import annotations

from dispatchtx.coordinator.workers import Strikes


def test_silent_misses_in_a_row_lose_the_worker() -> None:
    strikes = Strikes(3)
    strikes.heard(0, now=1.0)
    assert not strikes.missed(0, sent_at=2.0)
    assert not strikes.missed(0, sent_at=2.5)
    assert strikes.missed(0, sent_at=3.0)


def test_a_miss_after_the_worker_answered_since_its_send_is_no_strike() -> None:
    strikes = Strikes(2)
    strikes.heard(0, now=5.0)
    for sent_at in (1.0, 2.0, 4.0, 5.0):  # all sent before (or as) it last answered
        assert not strikes.missed(0, sent_at=sent_at)
    assert strikes[0] == 0


def test_an_answer_clears_the_count_and_readmission_forgives() -> None:
    strikes = Strikes(2)
    assert not strikes.missed(1, sent_at=1.0)  # never heard from: a strike
    strikes.heard(1, now=1.5)
    assert strikes[1] == 0
    assert not strikes.missed(1, sent_at=2.0)
    assert strikes.missed(1, sent_at=2.1)
    strikes.forgive(1)
    assert strikes[1] == 0


def test_workers_are_counted_apart() -> None:
    strikes = Strikes(2)
    assert not strikes.missed(0, sent_at=1.0)
    assert not strikes.missed(1, sent_at=1.0)
    assert strikes.missed(0, sent_at=1.1)
    assert strikes[1] == 1
