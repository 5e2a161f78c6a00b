"""Policy losses declare the rules `rlctl config validate` applies to them (PolicyLossSpec), so
no rule compares a loss's name; a plugin loss that declares nothing gets none of them."""

from __future__ import annotations

import dataclasses

from rlctl.algorithms import RequiredParam, get_policy_loss, register_policy_loss
from rlctl.config.checks import CheckContext
from rlctl.config.schema import Config
from rlctl.workers.roles.loss_checks import check_policy_loss


@register_policy_loss("test_decl_plain")
def _plain(**_):
    raise NotImplementedError


@dataclasses.dataclass(frozen=True)
class _BetaParams:
    dro_beta: float = 0.0


@register_policy_loss("test_decl_needs_beta", params=_BetaParams,
                      required=(RequiredParam("dro_beta", "scales its penalty by dro_beta", 0.5),))
def _needs_beta(**_):
    raise NotImplementedError


def problems(**actor):
    c = Config()
    c = dataclasses.replace(c, actor=dataclasses.replace(c.actor, **actor))
    return [(p.key, p.message, p.severity) for p in check_policy_loss(c, CheckContext(base_dir=None, raw={}))]


def test_the_builtins_declare_what_their_rules_read():
    vanilla, dro = get_policy_loss("vanilla"), get_policy_loss("dro")
    assert vanilla.clip_higher and vanilla.bypass_loss and vanilla.required == ()
    assert [p.key for p in dro.required] == ["dro_beta"] and not dro.clip_higher


def test_a_required_setting_left_at_zero_is_an_error_naming_the_loss():
    [(key, message, severity)] = problems(policy_loss="test_decl_needs_beta")
    assert key == "actor.loss_params.dro_beta" and severity == "error"
    assert message == ('policy_loss = "test_decl_needs_beta" scales its penalty by dro_beta, which has no default: '
                       "set it > 0 (e.g. dro_beta = 0.5 under [actor.loss_params])")
    assert problems(policy_loss="test_decl_needs_beta", loss_params={"dro_beta": 0.1}) == []


def test_a_loss_that_declares_nothing_gets_no_clip_rule():
    assert problems(policy_loss="test_decl_plain", clip_ratio_high=0.1, clip_ratio_low=0.2) == []
    assert [k for k, _, _ in problems(policy_loss="vanilla", clip_ratio_high=0.1, clip_ratio_low=0.2)] == \
        ["actor.clip_ratio_high"]


def test_bypass_mode_warns_that_it_replaces_any_loss_but_its_own():
    def warnings(loss):
        c = Config()
        rc = dataclasses.replace(c.algorithm.rollout_correction, bypass_mode=True)
        c = dataclasses.replace(c, actor=dataclasses.replace(c.actor, policy_loss=loss),
                                algorithm=dataclasses.replace(c.algorithm, rollout_correction=rc))
        return [p.message for p in check_policy_loss(c, CheckContext(base_dir=None, raw={})) if p.severity == "warning"]

    assert warnings("vanilla") == []
    assert warnings("test_decl_plain") == ["replaces actor.policy_loss = 'test_decl_plain' by loss_type = 'ppo_clip' "
                                           "(as verl does)"]
