"""Cluster mode: a two-node Ray cluster simulated on this machine (ray.cluster_utils.Cluster).

rlctl joins it by address (not embedded) and spreads a 2-rank group over both nodes, one rank
per node; the ranks meet in a real gloo all-reduce across the two raylets.
"""

from __future__ import annotations

import numpy as np
import pytest

import runtime_test_roles as roles
from rlctl.config.schema import ResourcesConfig
from rlctl.runtime import Batch

ray = pytest.importorskip("ray")
ray.cloudpickle.register_pickle_by_value(roles)

from ray.cluster_utils import Cluster  # noqa: E402

from rlctl.runtime.ray_env import ray_session  # noqa: E402
from rlctl.runtime.resource_pool import ResourcePool  # noqa: E402
from rlctl.runtime.worker_group import WorkerGroup  # noqa: E402

pytestmark = pytest.mark.slow   # starts Ray, trains a run or starts a subprocess


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    c.add_node(num_cpus=1)
    c.wait_for_nodes()
    yield c
    c.shutdown()


def test_a_group_spans_two_nodes(cluster):
    with ray_session(cluster.address) as session:
        assert not session.embedded and session.owned and session.nodes == 2
        group = WorkerGroup(ResourcePool(ResourcesConfig(nodes=2, workers=2)), {"echo": (roles.EchoWorker, {})},
                            name="spread")
        nodes = group.node_ids()
        assert len(set(nodes)) == 2                       # STRICT_SPREAD: one rank per node
        info = group.role("echo").whoami()
        assert [i["node_id"] for i in info] == nodes and {i["world"] for i in info} == {2}
        assert group.role("echo").rank_sum() == 3.0       # gloo all-reduce between the nodes
        out = group.role("echo").tag_rows(Batch({"x": np.arange(4.0)}))
        assert out["rank"].tolist() == [0, 0, 1, 1]
    assert not ray.is_initialized()                        # disconnected; the cluster keeps running
    assert len([n for n in cluster.list_all_nodes()]) == 2
