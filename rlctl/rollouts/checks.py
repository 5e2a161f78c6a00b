"""Config checks of the run's rollout kind, from what its row in the rollout table declares
(rlctl.rollouts.table): one kind at a time, the rollout modes and partial rollouts it is built for,
the algorithms whose extra rows or token-level model it cannot give, and in the machine pass the
modes and engines it carries a vision-language policy's images in, the rows an environment
library's task wrote played by that environment's agent, and a built-in agent's own prompt template. No rule names a kind or an environment.

Checks keep the contract of rlctl.config.checks: `check(config, ctx) -> list[Problem]`.
"""

from __future__ import annotations

from rlctl.config.checks import CheckContext
from rlctl.config.loader import Problem
from rlctl.config.schema import Config
from rlctl.rollouts.table import ENVIRONMENTS, RolloutKind, builtin_agent, environment_of, selected_kinds

# (the RolloutKind capability, the algorithm's Needs field that asks for it, what the algorithm does)
NEEDS = (("greedy_baseline", "greedy_baseline", "takes a greedy rollout of each prompt as its baseline"),
         ("reference_pairs", "real_response", "pairs each generated answer with the data's reference answer"),
         ("implicit_prm", "implicit_prm", "trains an implicit PRM on the response tokens the policy sampled"))


def check_rollout_kind(c: Config, ctx: CheckContext) -> list[Problem]:
    kinds = selected_kinds(c)
    kind = kinds[-1]
    problems = [Problem(other.key, f"{other.title} and {kind.title} are two ways to generate a batch and a run "
                        f"uses one ({kind.title} run their own loop): turn {other.key} off")
                for other in kinds[1:-1]]
    ro = c.rollout
    if ro.mode not in kind.modes:
        problems.append(Problem("rollout.mode", f"rollout.mode = {ro.mode!r} is not built with {kind.title} yet; "
                                f"use rollout.mode = {_choices(kind.modes)}"))
    elif ro.mode == "async" and ro.partial_rollout and not kind.partial:
        problems.append(Problem("rollout.partial_rollout", f"partial rollouts of {kind.title} are not built yet; "
                                "set it to false"))
    if c.algorithm.use_pf_ppo and not kind.resampled_groups:
        problems.append(Problem("algorithm.use_pf_ppo", f"PF-PPO resamples a group's rows, and {kind.title} may "
                                "make several rows of one sample; set algorithm.use_pf_ppo = false"))
    return problems + _needs_problems(c, kind)


def _needs_problems(c: Config, kind: RolloutKind) -> list[Problem]:
    from rlctl import algorithms

    try:
        needs = algorithms.run_needs(c)
    except Exception:   # an unknown name is check_registered's to report
        return []
    return [Problem(kind.key, f"algorithm {c.algorithm.name!r} {what}, which {kind.title} do not give: use another "
                    f"algorithm (grpo, rloo, reinforce_plus_plus, gae) or turn {kind.key} off")
            for capability, need, what in NEEDS if getattr(needs, need) and not getattr(kind, capability)]


def check_rollout_images(c: Config, ctx: CheckContext) -> list[Problem]:
    """Machine pass: a vision-language model.path in the modes and engines the kind carries images in."""
    from rlctl.models.checks import model_config

    kind = selected_kinds(c)[-1]
    engines_ok = not kind.image_engines or c.rollout.engine in kind.image_engines
    if c.rollout.mode in kind.image_modes and engines_ok:
        return []
    hf = model_config(c, ctx)
    if hf is None or hf.get("vision_config") is None:   # unreadable (check_model says so) or a text model
        return []
    if not kind.image_modes:
        return [Problem(kind.key, f"{kind.title} do not carry a vision-language model's images ({c.model.path} has a "
                        "vision tower): the rows they get and the endpoint's calls are text only; use a text model, "
                        "or rlctl's tool loop (rollout.multi_turn), which carries them")]
    engines = f" with rollout.engine = {_choices(kind.image_engines)}" if kind.image_engines else ""
    return [Problem(kind.key, f"{kind.title} of a vision-language model are built for rollout.mode = "
                    f"{_choices(kind.image_modes)}{engines} only, not {c.rollout.mode!r} / {c.rollout.engine!r} "
                    f"(the other paths do not carry a sample's images between calls yet); set those, or turn "
                    f"{kind.key} off")]


def check_environment_rows(c: Config, ctx: CheckContext) -> list[Problem]:
    """Machine pass: rows an environment library's task wrote (rlctl.rollouts.table.ENVIRONMENTS) need
    its built-in agent to play them, and without a ground truth its reward (rlctl's scorers have none)."""
    sources = _data_sources(c, ctx)
    problems, ag = [], c.rollout.agent
    for env in ENVIRONMENTS:
        ours = sorted(s for s in sources if environment_of(s) is env)
        if not ours:
            continue
        if ag.function != env.agent:
            problems.append(Problem("rollout.agent.function", f"the data holds {', '.join(ours[:3])} rows, which "
                                    f"their {env.name} environment plays and rewards: set rollout.agent.function = "
                                    f"\"{env.agent}\" (docs/environments.md)"))
        elif not env.ground_truth and ag.reward != "agent" and c.reward.function in ("", env.name):
            problems.append(Problem("rollout.agent.reward", f"rollout.agent.reward = {ag.reward!r} scores {ours[0]} "
                                    "rows with rlctl's built-in scorer, which has none for them: use \"agent\" "
                                    "(the environment's reward)"))
    return problems


def check_agent_template(c: Config, ctx: CheckContext) -> list[Problem]:
    """model.chat_template does not reach a built-in agent that renders its prompts itself."""
    env = builtin_agent(c.rollout.agent.function)
    if not c.model.chat_template or env is None or not env.own_template:
        return []
    return [Problem("model.chat_template", f"does not reach the built-in {env.name} agent, which renders its "
                                           "prompts with its environment library's own template for the model; "
                                           "leave it out")]


def _data_sources(c: Config, ctx: CheckContext) -> set:
    from rlctl.config.checks import resolve_path

    try:
        import pyarrow.parquet as pq

        return {ds for p in (*c.data.train_files, *c.data.val_files)
                for ds in pq.read_table(resolve_path(ctx.base_dir, p), columns=["data_source"])
                .column("data_source").to_pylist()}
    except Exception:   # a missing or broken file is check_data_files' to report
        return set()


def _choices(values: tuple[str, ...]) -> str:
    return " or ".join(f'"{v}"' for v in values)
