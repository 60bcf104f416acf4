import os
import sys
from pathlib import Path

import pytest

# the test harness (tests/support: the contract cases, node and cluster processes, fault
# loads, history checks, the file fuzz) is imported by name from every test directory
sys.path.insert(0, str(Path(__file__).parent / "support"))

#: fault tests that must run where CI runs them (root, namespaces, etcd): with
#: SIMSEARCH_REQUIRE_FAULT_TESTS=1 (set by .ci/run) a skip of one of them, or of its whole
#: module, is a failure
FAULT_TEST_FILES = ("test_netns.py", "test_netns_faults.py", "test_data_plane_faults.py",
                    "test_leader_changes.py", "test_long_runs.py",
                    "test_full_disk.py",
                    "test_etcd_control.py", "test_cluster.py")


#: the files that take longest (``--durations``, 2026-12-07: 215, 118, 97, 58, 51, 51, 34, 33 and
#: 31 s), handed out first: xdist gives a worker whole files (``--dist loadfile``), and a long
#: file handed out last leaves the other worker idle until it ends
LONG_FIRST = ("pyramid/test_cluster.py", "pyramid/test_data_plane_faults.py",
              "service/test_soak.py", "pyramid/test_netns_faults.py", "pyramid/test_long_runs.py",
              "service/test_request_fuzz.py", "test_auto.py", "test_concurrency.py",
              "pyramid/test_etcd_control.py")


def pytest_collection_modifyitems(config, items):
    def rank(item) -> int:
        path = Path(str(item.fspath)).as_posix()
        return next((i for i, name in enumerate(LONG_FIRST) if path.endswith("/tests/" + name)),
                    len(LONG_FIRST))

    items.sort(key=rank)  # stable: a file's tests stay together, in their order


def _fail_if_fault_test_skipped(report, path) -> None:
    if (report.skipped and os.environ.get("SIMSEARCH_REQUIRE_FAULT_TESTS")
            and Path(str(path)).name in FAULT_TEST_FILES):
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else report.longrepr
        report.outcome = "failed"
        report.longrepr = ("a fault test skipped where it must run (SIMSEARCH_REQUIRE_FAULT_TESTS "
                           f"is set): {reason}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    _fail_if_fault_test_skipped(outcome.get_result(), item.fspath)


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    _fail_if_fault_test_skipped(outcome.get_result(), collector.fspath)


@pytest.fixture(scope="module")
def node(tmp_path_factory):
    """A search node (a real process) for a module's tests."""
    from nodeproc import ServerProcess

    s = ServerProcess(tmp_path_factory.mktemp("node") / "data")
    yield s
    s.kill()


@pytest.fixture(scope="module")
def small_cluster(tmp_path_factory):
    """A local Pyramid cluster (2 shards, 1 replica, 1 coordinator) for a module's tests."""
    pytest.importorskip("grpc")
    from simsearch.pyramid.launcher import LocalCluster

    cl = LocalCluster(tmp_path_factory.mktemp("cluster"), 2, 1)
    yield cl
    cl.stop()
