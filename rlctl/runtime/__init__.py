"""The distributed substrate: Ray lifecycle, the Batch container, worker groups and dispatch.

Light to import (numpy only): Ray is imported when a session or a group is actually started.

    from rlctl.runtime import Batch, Dispatch, register
    from rlctl.runtime.ray_env import ray_session, resolve_address
    from rlctl.runtime.resource_pool import ResourcePool
    from rlctl.runtime.worker_group import WorkerGroup
"""

from rlctl.runtime.batch import Batch
from rlctl.runtime.dispatch import Dispatch, register

__all__ = ["Batch", "Dispatch", "register"]
