"""Run by test_ray_env.py in a subprocess: start Ray + a worker group, then leave by `mode`
("ok", "error", or "sigint": Ctrl-C while the controller waits on a worker).

Writes the pids of every process Ray started for it (descendants + the worker) to argv[2].
"""

import json
import os
import signal
import sys
import threading

import psutil
import ray

import runtime_test_roles as roles
from rlctl.config.schema import ResourcesConfig
from rlctl.runtime.ray_env import ray_session
from rlctl.runtime.resource_pool import ResourcePool
from rlctl.runtime.worker_group import WorkerGroup

ray.cloudpickle.register_pickle_by_value(roles)
mode, out = sys.argv[1], sys.argv[2]
# A child inherits its parent's ignored signals and blocked-signal mask (a pytest run may have
# either at the moment it starts this script); the test is about a terminal's Ctrl-C, which
# meets Python's default handler. Note what was inherited, for the report, then reset it.
inherited = {"sigint_ignored": signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
             "sigint_blocked": signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])}
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
signal.signal(signal.SIGINT, signal.default_int_handler)
with ray_session(num_cpus=1) as session:
    group = WorkerGroup(ResourcePool(ResourcesConfig(workers=1)), {"echo": (roles.EchoWorker, {})})
    pids = sorted({p.pid for p in psutil.Process().children(recursive=True)} | set(group.pids()))
    with open(out, "w") as f:
        json.dump({"pids": pids, "embedded": session.embedded, "inherited": inherited}, f)
    if mode == "error":
        raise RuntimeError("the controller failed")
    if mode == "sigint":
        threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        group.role("echo").stall(0, 60.0)   # Ctrl-C arrives while the controller waits on a worker
print("done")
