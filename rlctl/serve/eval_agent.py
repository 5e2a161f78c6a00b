"""`rlctl eval --agent FILE.py:NAME`: the agent program of training, played against a model folder.

The model is loaded in this process behind the same agent endpoint as training (rlctl.agent: the hf
engine through `LocalTurns`, every episode's calls batched together), and each episode's reward is
what the agent returned, as with rollout.agent.reward = "agent". A failed episode scores 0 and is
marked in its record (`failure`); its share is the summary's `failed` metric.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rlctl.config.rollout_tables import AgentConfig


def evaluate_agent(folder: Path, rows: list[dict], opts, temperature: float, lengths: tuple[int, int],
                   agent: AgentConfig, base: Path):
    """(scores, correct, metrics, records) as eval._score returns them: [prompt][sample] each."""
    from rlctl.agent.engine import AgentEngine, EngineLimits
    from rlctl.agent.endpoint import AgentServer
    from rlctl.agent.episodes import Episode
    from rlctl.agent.runner import AgentRunner, plain
    from rlctl.serve.eval_turns import LocalTurns
    from rlctl.serve.source import load_model
    from rlctl.workers.compute.models import eos_token_ids

    model, tokenizer = load_model(folder, opts.dtype, chat_template=opts.chat_template)
    eos = eos_token_ids(str(folder), tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    turns = LocalTurns(model, pad_token_id=pad, eos_token_ids=eos, temperature=temperature, top_p=opts.top_p,
                       tokenizer=tokenizer)
    engine = AgentEngine(turns, tokenizer, eos_ids=eos, pad_id=pad,
                         limits=EngineLimits(lengths[0], lengths[1], agent.max_calls, agent.max_wait_s))
    server = AgentServer(engine)
    episodes = [Episode(index=i * opts.n + s, row=plain(row)) for i, row in enumerate(rows) for s in range(opts.n)]
    try:
        engine.begin(seed=opts.seed, mode="val")
        AgentRunner(agent, base, server, engine).run(episodes)
        if engine.error is not None:
            raise engine.error
    finally:
        server.close()
    return _records(rows, episodes, opts.n)


def _records(rows: list[dict], episodes: list, n: int):
    scores, correct, metrics, records = [], [], [], []
    for i, row in enumerate(rows):
        mine = episodes[i * n:(i + 1) * n]
        scores.append([0.0 if e.failure else float(e.reward) for e in mine])
        correct.append([not e.failure and float(e.reward) > 0 for e in mine])
        metrics.append([{**e.metrics, "failed": float(bool(e.failure)), "calls": float(len(e.calls))} for e in mine])
        for j, e in enumerate(mine):
            records.append({"index": i, "sample": j, "data_source": row["data_source"], "prompt": row["prompt"],
                            "response": e.answer, "ground_truth": row["reward_model"]["ground_truth"],
                            "score": scores[-1][j], "correct": correct[-1][j], "metrics": metrics[-1][j],
                            "failure": e.failure, "calls": len(e.calls)})
    return scores, correct, metrics, records


def agent_config(spec: str, config) -> AgentConfig:
    """--agent FILE.py:NAME with the run's other [rollout.agent] limits (or the defaults)."""
    base = config.rollout.agent if config is not None else AgentConfig()
    return dataclasses.replace(base, function=spec, command=())
