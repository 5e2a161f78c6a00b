"""model.chat_template and `rlctl serve --chat-template`: a template file replaces the model's own wherever
the policy's tokenizer renders a chat; a missing file or one that cannot render a conversation is one line
and exit 2. (SmolLM2 with the shipped smollm2-tools.jinja: test_chat_template_smollm2.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from support.cli import rlctl_here

from rlctl.config.schema import Config, ModelConfig
from rlctl.controller.paths import resolve_paths
from rlctl.models import chat_template as ct

TEMPLATE = ("{%- for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{%- endfor %}"
            "{%- if add_generation_prompt %}[assistant] {%- endif %}")
BROKEN = "{%- for m in messages %}{{ m['content'].nope() }}{%- endfor %}"
TOOLS_BROKEN = "{%- if tools %}{{ tools[0]['function']['name'].missing() }}{%- endif %}{{ messages[0]['content'] }}"
TOML = """
[model]
path = "{model}"
chat_template = "{template}"
[data]
train_files = ["train.parquet"]
batch_size = 4
max_prompt_length = 64
max_response_length = 32
[rollout]
n = 2
"""


def _project(tmp_path: Path, model: Path, template: str) -> Path:
    pq.write_table(pa.table({"data_source": ["x"] * 8}), tmp_path / "train.parquet")
    (tmp_path / "rlctl.toml").write_text(TOML.format(model=model, template=template))
    return tmp_path


def test_a_template_renders_training_s_prompts_and_merge_s_tokenizer_saves_it(tmp_path, tiny_model_dir):
    from rlctl.data.dataset import chat_prompt_ids
    from rlctl.models.loading import load_tokenizer, policy_tokenizer

    (tmp_path / "mine.jinja").write_text(TEMPLATE)
    config = resolve_paths(Config(model=ModelConfig(path=str(tiny_model_dir), chat_template="mine.jinja")), tmp_path)
    assert config.model.chat_template == str((tmp_path / "mine.jinja").resolve())   # absolute for the workers
    tok = policy_tokenizer(config.model)
    ids = chat_prompt_ids([{"role": "user", "content": "hi"}], tok)
    assert tok.decode(ids) == "[user] hi[assistant]"
    own = load_tokenizer(tiny_model_dir)
    assert tok.decode(chat_prompt_ids([{"role": "user", "content": "hi"}], own)) != "[user] hi[assistant]"
    tok.save_pretrained(tmp_path / "merged")   # what rlctl merge does with the policy's tokenizer
    assert load_tokenizer(tmp_path / "merged").chat_template == TEMPLATE


def test_a_shipped_template_is_found_by_its_name(tmp_path):
    path = ct.resolve("smollm2-tools.jinja", tmp_path)
    assert path.name == "smollm2-tools.jinja" and path.is_file() and ct.render_error(path.read_text()) is None
    (tmp_path / "smollm2-tools.jinja").write_text(TEMPLATE)   # a file beside rlctl.toml wins
    assert ct.resolve("smollm2-tools.jinja", tmp_path) == tmp_path / "smollm2-tools.jinja"
    assert not ct.resolve("other.jinja", tmp_path).is_file()


@pytest.mark.parametrize("template, words", [
    (None, "does not exist (a Jinja chat template file; rlctl ships: smollm2-tools.jinja)"),
    (BROKEN, "fails to render a short conversation"),
    (TOOLS_BROKEN, "fails to render a conversation with a tool call"),
])
def test_validate_refuses_a_missing_or_broken_template_in_one_line(tmp_path, tiny_model_dir, template, words):
    if template is not None:
        (tmp_path / "t.jinja").write_text(template)
    project = _project(tmp_path, tiny_model_dir, "t.jinja")
    out = rlctl_here("config", "validate", "--format", "json", cwd=project)
    report = json.loads(out.stdout)
    assert out.returncode == 2 and len(report["errors"]) == 1, report
    assert report["errors"][0].startswith("rlctl.toml:4: model.chat_template: ") and words in report["errors"][0]
    (tmp_path / "t.jinja").write_text(TEMPLATE)
    assert rlctl_here("config", "validate", cwd=project).returncode == 0


def test_serve_refuses_a_bad_chat_template_before_loading(tmp_path, tiny_model_dir):
    (tmp_path / "bad.jinja").write_text(BROKEN)
    for name, words in (("missing.jinja", "does not exist"), ("bad.jinja", "fails to render")):
        out = rlctl_here("serve", tiny_model_dir, "--engine", "hf", "--chat-template", name, cwd=tmp_path)
        assert out.returncode == 2 and words in out.stderr, out.stderr
        assert len(out.stderr.strip().splitlines()) == 1, out.stderr


@pytest.mark.slow
def test_serve_renders_chats_with_the_chat_template(tmp_path, tiny_model_dir):
    import signal

    import openai
    from support.servers import ServerProcess

    from rlctl.models.loading import load_tokenizer

    (tmp_path / "mine.jinja").write_text(TEMPLATE)
    srv = ServerProcess([str(tiny_model_dir), "--engine", "hf", "--port", "0", "--served-model-name", "tiny",
                         "--chat-template", str(tmp_path / "mine.jinja")])
    try:
        client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
        r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
        expected = load_tokenizer(tiny_model_dir)("[user] hi[assistant]", add_special_tokens=False)["input_ids"]
        assert r.usage.prompt_tokens == len(expected)
    finally:
        assert srv.stop(signal.SIGTERM) == 0, "".join(srv.stderr_lines[-20:])


def test_vllm_and_sglang_get_the_template_as_their_own_flag():
    from rlctl.serve.external import LaunchSpec, build_command

    for engine in ("vllm", "sglang"):
        argv = build_command(engine, LaunchSpec("m", "127.0.0.1", 8000, "m", chat_template="/t/x.jinja"))
        assert argv[argv.index("--chat-template") + 1] == "/t/x.jinja"


@pytest.mark.slow   # the reward runner's process starts, though the agent's own reward scores
def test_eval_with_a_config_renders_a_plain_model_s_chats_with_its_template(tmp_path, tiny_model_dir):
    """`rlctl eval MODEL --config rlctl.toml --agent ...`: the agent's calls are rendered with the config's
    template (the agent reports the prompt tokens the endpoint counted)."""
    from rlctl.data.schema import arrow_schema
    from rlctl.models.loading import load_tokenizer
    from rlctl.serve.eval import EvalOptions, run_eval

    row = {"data_source": "t", "prompt": [{"role": "user", "content": "hi"}], "ability": "x",
           "reward_model": {"style": "rule", "ground_truth": "1"}, "extra_info": {}}
    pq.write_table(pa.Table.from_pylist([row], schema=arrow_schema()), tmp_path / "rows.parquet")
    (tmp_path / "mine.jinja").write_text(TEMPLATE)
    _project(tmp_path, tiny_model_dir, "mine.jinja")
    (tmp_path / "agent.py").write_text(
        "async def run(client, row):\n"
        "    r = await client.chat.completions.create(model='m', messages=row['prompt'], max_tokens=1)\n"
        "    return float(r.usage.prompt_tokens)\n")
    opts = EvalOptions(engine="hf", max_new_tokens=1, config=str(tmp_path / "rlctl.toml"),
                       agent=f"{tmp_path / 'agent.py'}:run")
    run_eval(tiny_model_dir, tmp_path / "rows.parquet", opts, tmp_path / "out.jsonl")
    expected = load_tokenizer(tiny_model_dir)("[user] hi[assistant]", add_special_tokens=False)["input_ids"]
    assert json.loads((tmp_path / "out.jsonl").read_text())["score"] == len(expected)


def test_a_vision_language_model_s_template_is_refused_until_its_processor_takes_it(tmp_path, tiny_vlm_dir):
    from rlctl.config.checks import CheckContext

    (tmp_path / "mine.jinja").write_text(TEMPLATE)
    config = Config(model=ModelConfig(path=str(tiny_vlm_dir), chat_template="mine.jinja"))
    [problem] = ct.check_chat_template(config, CheckContext(base_dir=tmp_path, raw={}))
    assert problem.key == "model.chat_template" and "vision-language" in problem.message


def test_the_verifiers_agent_s_own_rendering_is_not_silently_left_with_another_template(tmp_path, tiny_model_dir):
    from rlctl.config.checks import CheckContext
    from rlctl.config.rollout_tables import AgentConfig
    from rlctl.config.schema import RolloutConfig
    from rlctl.rollouts.checks import check_agent_template

    (tmp_path / "mine.jinja").write_text(TEMPLATE)
    config = Config(model=ModelConfig(path=str(tiny_model_dir), chat_template="mine.jinja"),
                    rollout=RolloutConfig(agent=AgentConfig(function="verifiers")))
    [problem] = check_agent_template(config, CheckContext(base_dir=tmp_path, raw={}))
    assert problem.key == "model.chat_template" and "verifiers agent" in problem.message
