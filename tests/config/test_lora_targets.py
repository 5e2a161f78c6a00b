"""model.lora.target_modules must fit the model: `rlctl config validate` reads the
architecture from model.path's config.json (meta device, no weights) and refuses a list with a
name that matches no layer, saying what the model's layers are called; the actor refuses it
again at start for models validate could not see (a hub id)."""

from __future__ import annotations

import json
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlctl.config.schema import LoraConfig
from rlctl.errors import ConfigError
from rlctl.models.tiny import build_tiny_model
from support.cli import rlctl_here

LLAMA_NAMES = '["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]'
TOML = """
[model]
path = "{model}"
[model.lora]
rank = 8
alpha = 16
[data]
train_files = ["train.parquet"]
batch_size = 4
max_prompt_length = 64
max_response_length = 32
[actor]
lr = 1e-5
[rollout]
n = 2
"""


@pytest.fixture(scope="module")
def phi3_dir(tmp_path_factory):
    return build_tiny_model(tmp_path_factory.mktemp("phi3"), arch="phi3", hidden=32, layers=2)["path"]


def _project(tmp_path, model):
    pq.write_table(pa.table({"data_source": ["x"] * 8}), tmp_path / "train.parquet")
    (tmp_path / "rlctl.toml").write_text(TOML.format(model=model))
    return tmp_path


def _validate(project, *overrides):
    return rlctl_here("config", "validate", *overrides, "--format", "json", cwd=project)


def test_validate_refuses_names_phi3_does_not_have(tmp_path, phi3_dir):
    project = _project(tmp_path, phi3_dir)
    ok = _validate(project)                                   # the default, all-linear
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = _validate(project, f"model.lora.target_modules={LLAMA_NAMES}")
    report = json.loads(bad.stdout)
    assert bad.returncode == 2 and len(report["errors"]) == 1
    error = report["errors"][0]
    assert error.startswith("overrides: model.lora.target_modules: q_proj, k_proj, v_proj, gate_proj, up_proj "
                            "match no layer of Phi3ForCausalLM (only o_proj, down_proj would get adapters")
    assert "its linear layers are o_proj, qkv_proj, gate_up_proj, down_proj" in error
    assert "did you mean qkv_proj, gate_up_proj" in error and "\n" not in error
    fixed = _validate(project, 'model.lora.target_modules=["qkv_proj", "o_proj", "gate_up_proj", "down_proj"]')
    assert fixed.returncode == 0, fixed.stdout


@pytest.mark.parametrize("targets,needle", [
    ('["nope"]', "nope match no layer of Qwen2ForCausalLM (its linear layers are q_proj, k_proj, v_proj, o_proj, "
                 "gate_proj, up_proj, down_proj); use [\"all-linear\"]"),
    ('["all-linear", "lm_head"]', '"all-linear" already covers every linear layer'),
])
def test_validate_refuses_other_bad_lists(tmp_path, tiny_model_dir, targets, needle):
    bad = _validate(_project(tmp_path, tiny_model_dir), f"model.lora.target_modules={targets}")
    assert bad.returncode == 2 and needle in json.loads(bad.stdout)["errors"][0]


def test_a_subset_that_all_matches_is_fine(tmp_path, tiny_model_dir):
    ok = _validate(_project(tmp_path, tiny_model_dir), 'model.lora.target_modules=["q_proj", "self_attn.v_proj"]')
    assert ok.returncode == 0, ok.stdout


def test_the_actor_refuses_at_start_what_validate_could_not_see(phi3_dir):
    from rlctl.config.schema import Config, ModelConfig
    from rlctl.workers.roles.actor import ActorRolloutRefWorker

    names = tuple(json.loads(LLAMA_NAMES))
    config = Config(model=ModelConfig(path=phi3_dir, lora=LoraConfig(rank=8, target_modules=names)))
    with pytest.raises(ConfigError, match="match no layer of Phi3ForCausalLM") as err:
        ActorRolloutRefWorker(config)
    assert err.value.exit_code == 2
