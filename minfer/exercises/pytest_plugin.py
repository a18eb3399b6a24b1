"""In a student build, a test that runs into an exercise not written yet is skipped, naming it.

The root ``conftest.py`` loads this plugin. A test that fails because an exercise's stub raised
``NotImplementedError("E3.1: ...")`` -- directly, through a chained exception, or quoted in a compiler's
error -- is reported as skipped: "needs exercise E3.1 (not written yet)". Every other failure stays a
failure. In the repository there are no stubs, so the plugin never acts; in a student build the test suite
is a progress report: each exercise written turns its tests from skipped to passed (or failed).

A test whose dependence on an exercise does not show as an exception (it checks that a check *passes*, say)
says so with ``@pytest.mark.needs_exercise("E3.1")``: it is skipped while that exercise is still a stub.
"""

from __future__ import annotations

import pytest

from minfer.exercises.harness import stub_in


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "needs_exercise(*ids): skipped while these exercises are still stubs")


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("needs_exercise")
    if marker is None:
        return
    from minfer.exercises.regions import find_regions
    from minfer.exercises.standin import ROOT

    stubs = sorted({r.exercise for r in find_regions(ROOT) if r.is_stub and r.exercise in marker.args})
    if stubs:
        pytest.skip(f"needs exercise {', '.join(stubs)} (not written yet)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.failed and call.excinfo is not None and (exercise := stub_in(call.excinfo.value)):
        report.outcome = "skipped"
        report.longrepr = (str(item.path), item.location[1] or 0,
                           f"Skipped: needs exercise {exercise} (not written yet: its stub raised NotImplementedError)")
