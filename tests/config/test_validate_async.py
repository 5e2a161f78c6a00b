"""`rlctl config validate` for rollout.mode = "async": staleness > 1 needs a trust-region loss
(an error: exit 2), sync_every must leave the schedule able to progress, what is not built yet is
refused with one line each, and async keys in another mode are warned about."""

from __future__ import annotations

from test_validate import check, project  # noqa: F401  (the fixture)

ASYNC = ["rollout.mode=async", "resources.gpus_per_node=0", "resources.workers=1"]


def test_async_rules(project):  # noqa: F811
    assert check(project, *ASYNC, machine=False)[0] == []
    assert check(project, *ASYNC, "algorithm.dynamic_sampling.enable=true", machine=False)[0] == []
    assert check(project, *ASYNC, "rollout.max_staleness=3", "actor.policy_loss=decoupled_ppo",
                 "rollout.sync_every=4", "rollout.staleness_strategy=drop", machine=False)[0] == []
    errors = check(project, *ASYNC, "rollout.max_staleness=3", "actor.policy_loss=gpg", machine=False)[0]
    assert any(e.startswith("rollout.max_staleness: 3 with actor.policy_loss = 'gpg'") for e in errors), errors
    rc = "algorithm.rollout_correction"
    errors = check(project, *ASYNC, "rollout.max_staleness=2", f"{rc}.bypass_mode=true", f"{rc}.loss_type=reinforce",
                   machine=False)[0]
    assert any(e.startswith("rollout.max_staleness: 2 with loss_type = 'reinforce'") for e in errors), errors
    errors = check(project, *ASYNC, "rollout.max_staleness=1", "rollout.sync_every=3", machine=False)[0]
    assert any(e.startswith("rollout.sync_every: 3") and "<= max_staleness + 1 = 2" in e for e in errors), errors
    assert check(project, *ASYNC, "rollout.partial_rollout=true", "rollout.partial_chunk=4", machine=False)[0] == []
    assert check(project, *ASYNC, "rollout.partial_rollout=true", "rollout.partial_chunk=4",   # a pool per rank
                 "resources.rollout_workers=2", machine=False)[0] == []
    assert check(project, *ASYNC, "rollout.partial_rollout=true", "rollout.partial_chunk=4",   # rounds filtered
                 "algorithm.dynamic_sampling.enable=true", machine=False)[0] == []
    warnings = check(project, *ASYNC, "rollout.partial_rollout=true", "rollout.partial_chunk=100000", machine=False)[1]
    assert any(w.startswith("rollout.partial_chunk: 100000 >= data.max_response_length") for w in warnings), warnings
    multi_turn = ["rollout.multi_turn.enable=true", "rollout.multi_turn.tools=[\"calculator\"]"]
    assert check(project, *ASYNC, *multi_turn, "rollout.max_staleness=2", "actor.policy_loss=decoupled_ppo",
                 machine=False)[0] == []
    # partial multi-turn rollouts: a round is one turn (rlctl.controller.async_turns), partial_chunk plays no part
    errors, warnings, _ = check(project, *ASYNC, *multi_turn, "rollout.partial_rollout=true",
                                "rollout.max_staleness=2", "actor.policy_loss=decoupled_ppo",
                                "rollout.partial_chunk=100000", machine=False)
    assert errors == [] and not any(w.startswith("rollout.partial_chunk") for w in warnings), (errors, warnings)
    assert check(project, *ASYNC, *multi_turn, "rollout.partial_rollout=true", "rollout.max_staleness=2",   # pool on
                 "actor.policy_loss=decoupled_ppo", "resources.rollout_workers=2", machine=False)[0] == []  # the controller
    errors = check(project, *ASYNC, "actor.policy_loss=decoupled_ppo", f"{rc}.rollout_is=token", machine=False)[0]
    assert any(e.startswith(f"{rc}.rollout_is: ") and "twice" in e for e in errors), errors
    vllm = ["rollout.engine=vllm", "rollout.partial_rollout=true", "rollout.partial_chunk=4"]
    assert check(project, *ASYNC, *vllm, machine=False)[0] == []   # vLLM rollout group, partial rollouts too
    errors = check(project, *ASYNC, "rollout.engine=sglang", machine=False)[0]
    assert any(e.startswith("rollout.mode: \"async\": rollout.engine = 'sglang'") for e in errors), errors
    warnings = check(project, "rollout.max_staleness=2", machine=False)[1]
    assert any(w.startswith("rollout.max_staleness: ") and "ignored" in w for w in warnings), warnings
