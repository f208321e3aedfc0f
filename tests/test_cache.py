"""The object cache (`dispatchtx.resources.cache`): what each message must carry,
through real `DispatchTables` moves, against whichever build of the core is
loaded."""

from __future__ import annotations

from dispatchtx import DispatchTables
from dispatchtx.resources import ObjectCache

from support import commit, send

# -- worker object cache: nothing to undo ----------------------------------------


def test_cache_an_unsent_message_leaves_the_worker_without_the_content() -> None:
    tables = DispatchTables(2)
    cache = ObjectCache(tables)
    txn = tables.prepare(0)
    assert cache.reserve(txn, ["corpus/1", "dict"]) == ["corpus/1", "dict"]
    assert len(txn) == 0  # nothing to undo: no compensation at all
    assert tables.abort(txn.id) == ()
    txn = tables.prepare(0)
    assert cache.reserve(txn, ["corpus/1", "dict"]) == ["corpus/1", "dict"]  # fault point 5
    send(tables, txn)
    assert tables.fenced_out(txn.id) == ()  # the worker got the content all the same
    txn = tables.prepare(0)
    assert cache.reserve(txn, ["corpus/1", "dict", "corpus/2"]) == ["corpus/2"]
    assert cache.leaks() == []


def test_cache_a_reported_miss_is_carried_until_a_commit_proves_delivery() -> None:
    tables = DispatchTables(2)
    cache = ObjectCache(tables)
    txn = tables.prepare(0)
    cache.reserve(txn, ["dict"])
    send(tables, txn)
    commit(tables, txn)
    cache.report_miss(0, "dict")  # the worker restarted and lost it
    for end in ("abort", "fenced_out", "commit"):
        txn = tables.prepare(0)
        assert cache.reserve(txn, ["dict"]) == ["dict"]
        assert len(txn) == 1
        if end == "abort":
            tables.abort(txn.id)
        else:
            send(tables, txn)
            if end == "fenced_out":
                tables.fenced_out(txn.id)
            else:
                commit(tables, txn)
        assert cache.to_recarry(0) == ([] if end == "commit" else ["dict"])
    assert cache.reserve(tables.prepare(0), ["dict"]) == []
    assert cache.misses == 1
