"""Worker groups on real Ray actors with a real gloo process group (CPU).

One embedded Ray session for the module (4 logical CPUs on this 2-core machine) keeps it fast. Warm
ranks are off here: these tests are about a group's ranks ending with it (tests/runtime/test_warm_ranks.py
has the other way).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

import runtime_test_roles as roles
from rlctl.config.schema import ResourcesConfig
from rlctl.errors import CheckpointError, ConfigError, UsageError, WorkerDiedError
from rlctl.runtime import Batch

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(roles)  # ship the test roles to the workers by value

from rlctl.runtime.ray_env import ray_session  # noqa: E402
from rlctl.runtime.resource_pool import ResourcePool  # noqa: E402
from rlctl.runtime.worker_group import WorkerGroup  # noqa: E402


@pytest.fixture(scope="module")
def session():
    with pytest.MonkeyPatch.context() as patch, ray_session(num_cpus=4) as s:
        patch.delenv("RLCTL_WARM_RANKS", raising=False)
        yield s


@pytest.fixture(scope="module")
def pair(session):
    """Two ranks, each holding an `echo` and an `other` role (co-located)."""
    group = WorkerGroup(ResourcePool(ResourcesConfig(workers=2)),
                        {"echo": (roles.EchoWorker, {"tag": "t"}), "other": (roles.OtherWorker, {"offset": 1})},
                        name="pair")
    yield group
    group.shutdown()


def _gone(pids, within=10.0):
    import psutil

    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return True
        time.sleep(0.2)
    return False


@pytest.mark.slow
def test_ranks_form_one_process_group(pair):
    info = pair.role("echo").whoami()
    assert [i["rank"] for i in info] == [0, 1] and {i["world"] for i in info} == {2}
    assert {i["threads"] for i in info} == {1} and {i["omp"] for i in info} == {"1"}  # cpus_per_worker
    assert pair.role("echo").rank_sum() == 3.0           # gloo all_reduce of 1 + 2, rank 0's answer


@pytest.mark.slow
def test_workers_start_without_progress_bars_whatever_the_driver_has(session, monkeypatch):
    """transformers' and huggingface_hub's bars in workers would fill Ray's logs (and the terminal under
    RLCTL_DEBUG=1), so workers start with them off even when the driver never switched them off."""
    monkeypatch.delenv("HF_HUB_DISABLE_PROGRESS_BARS", raising=False)
    group = WorkerGroup(ResourcePool(ResourcesConfig(workers=1)), {"echo": (roles.EchoWorker, {})}, name="quiet")
    try:
        assert group.role("echo").progress_bars() == [{"env": "1", "hub": False, "transformers": False}]
    finally:
        group.shutdown()


@pytest.mark.slow
def test_dp_splits_and_joins_in_input_order(pair):
    echo = pair.role("echo")
    out = echo.tag_rows(Batch({"x": np.arange(5.0)}, {"step": 3}), scale=2.0)
    assert out["x"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0]
    assert out["rank"].tolist() == [0, 0, 0, 1, 1] and out.meta == {"step": 3}
    assert echo.count_rows(Batch({"x": np.arange(5)})) == [3, 2]   # uneven inference split: handled
    timing = pair.timing["echo.tag_rows"]
    assert timing["calls"] == 1 and timing["wall_s"] >= timing["worker_s"] > 0


@pytest.mark.slow
def test_dp_train_stripes_and_rejects_uneven(pair):
    echo = pair.role("echo")
    out = echo.global_sum(Batch({"x": np.arange(8)}, {"mini_batches": 2}))
    assert out == {"sum": 28.0, "rows": [0, 1, 4, 5]}   # rank 0: first half of each mini-batch
    with pytest.raises(ConfigError, match="do not split evenly over 2 workers"):
        echo.global_sum(Batch({"x": np.arange(7)}))
    assert echo.rank_sum() == 3.0                        # a rejected call never reached the ranks


@pytest.mark.slow
def test_unregistered_methods_are_refused(pair):
    with pytest.raises(AttributeError, match="not a worker method"):
        pair.role("echo").not_remote
    with pytest.raises(KeyError, match="has no role 'critic'"):
        pair.role("critic")


@pytest.mark.slow
def test_colocated_roles_share_a_process_separate_groups_do_not(pair):
    assert pair.role("other").pid() == pair.pids()
    with WorkerGroup(ResourcePool(ResourcesConfig(workers=1, cpus_per_worker=2)),
                     {"echo": (roles.EchoWorker, {})}, name="apart") as apart:
        info = apart.role("echo").whoami()[0]
        assert info["pid"] not in pair.pids() and info["threads"] == 2 and info["world"] == 1


@pytest.mark.slow
def test_a_worker_exception_names_role_and_rank(session):
    group = WorkerGroup(ResourcePool(ResourcesConfig(workers=1)), {"echo": (roles.EchoWorker, {})}, name="exc")
    raw = None
    try:
        raw = ray.get(group._actors[0].call.remote("echo", "fail_on", 0))
    except Exception as err:  # noqa: BLE001 - the real RayTaskError, kept for the debug check below
        raw = err
    from rlctl.runtime.failures import worker_error

    plain = worker_error(raw, role="echo", rank=0, method="fail_on")
    assert "echo worker rank 0 raised ValueError in fail_on: boom" in str(plain)
    assert 'raise ValueError("boom' not in str(plain) and "RLCTL_DEBUG=1" in str(plain)
    os.environ["RLCTL_DEBUG"] = "1"
    try:
        debug = str(worker_error(raw, role="echo", rank=0, method="fail_on"))
        assert 'in fail_on\n    raise ValueError("boom' in debug and "\x1b[" not in debug  # remote traceback
    finally:
        del os.environ["RLCTL_DEBUG"]
    with pytest.raises(CheckpointError, match="echo worker rank 0: checkpoint step_3 is missing") as known:
        group.role("echo").fail_on(0, known=True)
    assert known.value.exit_code == 3                    # a known error keeps its exit code
    with pytest.raises(WorkerDiedError, match="down after an earlier failure"):
        group.role("echo").whoami()
    assert _gone(group.pids())


@pytest.mark.slow
def test_an_exception_ray_cannot_pickle_still_reaches_the_controller_as_one_line(session):
    group = WorkerGroup(ResourcePool(ResourcesConfig(workers=1)), {"echo": (roles.EchoWorker, {})}, name="pickle")
    with pytest.raises(WorkerDiedError) as died:
        group.role("echo").fail_unpicklable()
    assert died.value.exit_code == 4 and "\n" not in str(died.value)
    assert died.value.message == ("echo worker rank 0 raised HoldsALock in fail_unpicklable: the model's config "
                                  "is invalid: max_model_len 4096 > 512"), died.value.message
    assert "isn't serializable" not in str(died.value)


@pytest.mark.slow
def test_killed_worker_stops_the_controller_within_seconds(session):
    group = WorkerGroup(ResourcePool(ResourcesConfig(workers=2)), {"echo": (roles.EchoWorker, {})}, name="kill")
    victim = group.pids()[1]
    # Rank 1 sleeps inside the call, rank 0 waits for it in a gloo barrier: without failure
    # handling this call would hang forever once rank 1 is gone.
    threading.Timer(1.0, os.kill, (victim, signal.SIGKILL)).start()
    start = time.monotonic()
    with pytest.raises(WorkerDiedError, match="echo worker rank 1 died during stall") as died:
        group.role("echo").stall(1, 60.0)
    assert time.monotonic() - start < 10.0
    assert died.value.exit_code == 4
    assert _gone(group.pids())                           # rank 0, stuck in the barrier, was killed too


@pytest.mark.slow
def test_a_peer_s_death_is_named_over_the_error_of_the_rank_that_noticed_it(session):
    """Rank 0's collective fails first ("Connection closed by peer"), rank 1's death reaches Ray a moment
    later: the report names the dead rank, the cause, not the symptom."""
    group = WorkerGroup(ResourcePool(ResourcesConfig(workers=2)), {"echo": (roles.EchoWorker, {})}, name="peer")
    with pytest.raises(WorkerDiedError, match="echo worker rank 1 died during peer_dies"):
        group.role("echo").peer_dies(1, 0.3)
    assert _gone(group.pids())


@pytest.mark.slow
def test_a_pool_the_cluster_cannot_hold_fails_clearly(session):
    pool = ResourcePool(ResourcesConfig(workers=3, cpus_per_worker=3))
    with pytest.raises(UsageError, match="need 1 node\\(s\\) with 9 CPU each, but Ray has 1 node\\(s\\) with 4 CPU"):
        pool.ready(timeout_s=1.0)
    with pytest.raises(ConfigError, match="does not spread evenly"):
        ResourcePool(ResourcesConfig(workers=3, nodes=2))
    with pytest.raises(ConfigError, match="does not match nodes x gpus_per_node"):
        ResourcePool(ResourcesConfig(workers=3, gpus_per_node=2))


def test_a_pool_resolves_auto_gpus_like_start_up():
    """A Config built in code may still say gpus_per_node = "auto": the pool resolves it with the
    same rule as start-up (this machine's GPUs), and refuses it for a cluster address."""
    from rlctl.runtime.resource_pool import visible_gpus

    pool = ResourcePool(ResourcesConfig(workers=1, gpus_per_node="auto"))
    assert pool.use_gpu == (visible_gpus() > 0)
    with pytest.raises(ConfigError, match="says nothing about the nodes of the Ray cluster"):
        ResourcePool(ResourcesConfig(workers=1, gpus_per_node="auto", address="ray://head:10001"))
