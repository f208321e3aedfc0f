"""Both tox build legs run these same tests; each leg says which build it
expects, and a leg that loaded the other build fails before any test runs."""

from __future__ import annotations

import os

import pytest

import dispatchtx


def pytest_configure(config: pytest.Config) -> None:
    expected = os.environ.get("DISPATCHTX_EXPECT_BUILD", "")
    if expected not in ("", "compiled", "pure"):
        raise pytest.UsageError(
            f"DISPATCHTX_EXPECT_BUILD must be compiled or pure, not {expected!r}"
        )
    if expected == "compiled" and dispatchtx.COMPILED is not True:
        raise pytest.UsageError(
            "this leg tests the compiled build, but dispatchtx.COMPILED is "
            f"{dispatchtx.COMPILED!r}: the extension did not load"
        )
    if expected == "pure" and dispatchtx.COMPILED is not False:
        raise pytest.UsageError(
            f"this leg tests the pure build, but dispatchtx.COMPILED is {dispatchtx.COMPILED!r}"
        )


def pytest_report_header(config: pytest.Config) -> str:
    build = "compiled" if dispatchtx.COMPILED else "pure"
    return f"dispatchtx build: {build} ({dispatchtx.DispatchTables.__module__})"
