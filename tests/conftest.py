import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # lets tests import the shared `contract` cases

#: fault tests that must run where CI runs them (root, namespaces, etcd): with
#: SIMSEARCH_REQUIRE_FAULT_TESTS=1 (set by .ci/run) a skip of one of them is a failure
FAULT_TEST_FILES = ("test_netns.py", "test_netns_faults.py", "test_data_plane_faults.py",
                    "test_etcd_control.py", "test_cluster.py")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if (report.skipped and os.environ.get("SIMSEARCH_REQUIRE_FAULT_TESTS")
            and Path(str(item.fspath)).name in FAULT_TEST_FILES):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = (f"a fault test skipped where it must run "
                           f"(SIMSEARCH_REQUIRE_FAULT_TESTS is set): {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    """The same for a fault-test module skipped as a whole (a missing package at import)."""
    outcome = yield
    report = outcome.get_result()
    if (report.skipped and os.environ.get("SIMSEARCH_REQUIRE_FAULT_TESTS")
            and Path(str(collector.fspath)).name in FAULT_TEST_FILES):
        report.outcome = "failed"
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.longrepr = (f"a fault-test module skipped where it must run "
                           f"(SIMSEARCH_REQUIRE_FAULT_TESTS is set): {reason}")
