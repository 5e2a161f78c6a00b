"""verifiers environments as rlctl tasks: `rlctl data prep verifiers:ID [--args JSON] [--size N]`.

A verifiers v1 environment (an installed package exporting a `Taskset`, as `vf-init` scaffolds, or a
taskset verifiers ships: openenv, textarena, nemo-gym, harbor) is loaded here the way `vf-eval` loads
it, and its tasks become verl rows: `data_source = "verifiers/ID"`, the task's prompt as the chat
messages (what length filters and `rlctl data inspect` read), and in `extra_info.verifiers` the task's
own data and the environment's config as JSON, so the rollout (rlctl.tasks.verifiers_rollout) rebuilds
exactly that task and plays it through the environment's harness, tools and rubric.

--args is the taskset's config (`--env.taskset.*` of vf-eval, e.g. {"num_tasks": 20}); its key "env"
holds the rest of the environment's config (`--env.*`: {"agent": {"runtime": {"type": "docker"}}})
and "renderer" the train client's renderer (renderers' RendererConfig). The defaults work offline:
the subprocess runtime, the taskset's own harness or else verifiers' `null` harness (the plain chat
and tool-call loop), a renderer over the model's chat template that parses hermes tool calls.
"""

from __future__ import annotations

import json

from rlctl.data.sources import Generated, PrepSource, rule_row, seeded_splits
from rlctl.errors import DataError, UsageError
from rlctl.rollouts.table import ENVIRONMENTS

ENVIRONMENT = next(env for env in ENVIRONMENTS if env.name == "verifiers")   # its row: rows without ground truth
NAME = ENVIRONMENT.name
PREFIX = ENVIRONMENT.source_prefix
DATA_SOURCES = ()
DATA_SOURCE_PREFIXES = (PREFIX,)   # claimed so that a run scoring them with rlctl's scorer is told why not
DEFAULT_SIZE = 1000         # tasks taken from an unbounded taskset
DEFAULT_VAL_FRACTION = 0.1
OFFLINE_AGENT = {"runtime": {"type": "subprocess"}}
OFFLINE_HARNESS = "null"
DEFAULT_RENDERER = {"name": "default", "tool_parser": "qwen3"}   # <tool_call>{json}</tool_call>: hermes
OPENENV_ENV = "rlctl.tasks.openenv_verifiers"   # the Env rlctl plays OpenEnv servers with (that module)
INSTALL = "pip install 'rlctl[envs]' (verifiers 0.4)"


def require_verifiers():
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise UsageError(f"verifiers environments need the verifiers package, which is not installed ({e})",
                         hint=INSTALL) from None
    return vf


def _merge(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def env_spec(env_id: str, args: dict | None) -> dict:
    """{"config": the environment's config as verifiers validates it, "renderer": the renderer config}:
    what the rows carry. UsageError (exit 2) for a missing package or an id that names no environment."""
    require_verifiers()
    from verifiers.v1.utils.loaders import default_harness_id

    args = dict(args or {})
    env_over, renderer = args.pop("env", {}) or {}, args.pop("renderer", None) or DEFAULT_RENDERER
    if not isinstance(env_over, dict) or not isinstance(renderer, dict):
        raise UsageError("--args: \"env\" and \"renderer\" must be JSON objects",
                         hint='e.g. --args \'{"num_tasks": 8, "env": {"agent": {"runtime": {"type": "docker"}}}}\'')
    _check_id(env_id)
    agent = dict(OFFLINE_AGENT)
    if default_harness_id(env_id) != env_id:   # the taskset ships no harness of its own
        agent["harness"] = {"id": OFFLINE_HARNESS}
    roles = {role: agent for role in _roles(env_id)}   # "agent" alone, or an env's own seats (openenv: "player")
    base = {"taskset": {"id": env_id, **args}, **roles}
    if env_id == "openenv":   # verifiers 0.4.0's OpenEnvEnv fails on openenv-core 0.3: rlctl's plays its tasks
        base["id"] = OPENENV_ENV
    config = _merge(base, env_over)
    return {"config": config, "renderer": renderer}


def _roles(env_id: str) -> list[str]:
    from verifiers.v1 import AgentConfig
    from verifiers.v1.utils.loaders import env_config_type

    fields = env_config_type(env_id).model_fields
    return [name for name, info in fields.items() if isinstance(info.default, AgentConfig)] or ["agent"]


def _check_id(env_id: str) -> None:
    from verifiers.v1.utils.loaders import taskset_class

    if not env_id:
        raise UsageError("verifiers needs an environment: verifiers:ID",
                         hint="e.g. rlctl data prep verifiers:my-env (an installed vf-init package) or "
                              "verifiers:openenv (docs/environments.md).")
    try:
        taskset_class(env_id)
    except ModuleNotFoundError as e:
        if f"'{env_id.replace('-', '_').lower()}'" not in str(e) and "not found (tried" not in str(e):
            raise UsageError(f"verifiers:{env_id} cannot be imported: {_first_line(e)}",
                             hint="install what it names, then run the prep again.") from None
        raise UsageError(f"verifiers:{env_id}: no such environment ({str(e).split('. ')[0]})",
                         hint="install its package (pip install -e path/to/env) or check the id; "
                              "verifiers' own tasksets are openenv, textarena, nemo_gym, harbor.") from None
    except ImportError as e:   # the environment's own dependencies (textarena: nltk, textarena)
        raise UsageError(f"verifiers:{env_id} cannot be imported: {_first_line(e)}",
                         hint="install what it names, then run the prep again.") from None
    except (TypeError, AttributeError, ValueError) as e:
        raise UsageError(f"verifiers:{env_id} is not a verifiers v1 environment: {e}",
                         hint="its package must export one Taskset subclass in __all__ (vf-init's layout).") from None


def load_env(config: dict):
    """The verifiers Env of a config; DataError (exit 3) when the environment fails to load."""
    require_verifiers()
    from verifiers.v1.utils.loaders import load_environment, resolve_env_config

    env_id = config.get("taskset", {}).get("id", "?")
    try:
        if config.get("id") == OPENENV_ENV:   # built here: verifiers' loader imports only undotted ids
            from rlctl.tasks.openenv_verifiers import RlctlOpenEnv, RlctlOpenEnvConfig

            return RlctlOpenEnv(RlctlOpenEnvConfig.model_validate({k: v for k, v in config.items() if k != "id"}))
        return load_environment(resolve_env_config(config))
    except Exception as e:   # the environment's own code or config: one line, its words
        raise DataError(f"verifiers:{env_id} failed to load: {type(e).__name__}: {_first_line(e)}",
                        hint="check --args against the taskset's config (vf-eval ID --help lists it) "
                             "and that the package imports.") from None


def _first_line(e: Exception) -> str:
    errors = getattr(e, "errors", None)
    if callable(errors):   # pydantic's ValidationError: the first field and what is wrong with it
        try:
            first = errors()[0]
            return f"{'.'.join(map(str, first['loc']))}: {first['msg']}"[:300]
        except Exception:
            pass
    text = str(e).strip().splitlines()
    return text[0][:300] if text else ""


def _tasks(env, env_id: str, size: int | None) -> list:
    taskset = env.taskset
    if size is None and not taskset.bounded:
        size = DEFAULT_SIZE
    if size is not None:
        taskset = taskset.take(size)
    try:
        tasks = list(taskset)
    except Exception as e:
        raise DataError(f"verifiers:{env_id}: loading its tasks failed: {type(e).__name__}: {_first_line(e)}",
                        hint="the taskset's load() raised; run vf-eval on it to see the traceback.") from None
    if not tasks:
        raise DataError(f"verifiers:{env_id} has no tasks", hint="check --args (e.g. num_tasks).")
    return tasks


def prompt_messages(data) -> list[dict]:
    """The task's opening messages as plain chat dicts (system prompt first): the row's `prompt`."""
    out = [{"role": "system", "content": data.system_prompt}] if data.system_prompt else []
    prompt = data.prompt
    if isinstance(prompt, str):
        out.append({"role": "user", "content": prompt})
    else:
        from verifiers.v1.types import content_text

        out += [{"role": m.role, "content": content_text(m.content)} for m in prompt or []]
    return out or [{"role": "user", "content": ""}]


def _row(env_id: str, spec: dict, task, split: str, index: int) -> dict:
    data = task.data
    messages = prompt_messages(data)
    text = data.prompt_text
    row = rule_row(PREFIX + env_id, messages, "environment", "", split, index, question=text, answer="")
    row["extra_info"]["verifiers"] = json.dumps({**spec, "task": data.model_dump(mode="json")},
                                                sort_keys=True)
    return row


def generate(env_id: str, args: dict | None, size: int | None, seed: int, val_fraction: float) -> dict:
    spec = env_spec(env_id, args)
    tasks = _tasks(load_env(spec["config"]), env_id, size)
    splits = seeded_splits(tasks, seed, val_fraction, noun="tasks",
                           hint="pass a smaller --val-fraction, or 0 to keep every task for training.")
    return {split: [_row(env_id, spec, task, split, i) for i, task in enumerate(chosen)]
            for split, chosen in splits.items()}


def arrow_schema():
    """rlctl's row schema with extra_info.verifiers (the task and the environment's config, JSON text)."""
    import pyarrow as pa

    from rlctl.data.schema import arrow_schema as base

    return base(extra_info=(("verifiers", pa.string()),))


def source(env_id: str, args: dict | None, size: int | None) -> PrepSource:
    """The PrepSource of `verifiers:ID`; UsageError (exit 2) for a missing package or an unknown id."""
    env_spec(env_id, args)   # an unknown id or missing package fails before anything is generated

    def rows_for(seed: int, fraction: float) -> dict:
        return generate(env_id, args, size, seed, fraction)

    rows = Generated(PREFIX + env_id, rows_for, DEFAULT_VAL_FRACTION, arrow_schema=arrow_schema)
    return PrepSource(f"{NAME}:{env_id}", rows, no_sft="rows hold tasks for an environment, no reference solution")


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **_):
    """verifiers rows have no rule to score: their environment's rubric rewards the episode."""
    raise UsageError(f"{data_source} rows are rewarded by their verifiers environment, not by a reward function",
                     hint='set rollout.agent.function = "verifiers" (and rollout.agent.reward = "agent") in '
                          'rlctl.toml (docs/environments.md).')


REWARDS = {"verifiers": compute_score}
PREP = ()
FAMILIES = {NAME: source}   # `rlctl data prep verifiers:ID` -> its PrepSource
