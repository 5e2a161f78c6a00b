"""rlctl.toml loading: every problem at once, typed overrides, hostile files -> one line, exit 2."""

from __future__ import annotations

import pytest
from support.cli import rlctl_here

from rlctl.config.loader import load_config, parse_override
from rlctl.errors import ConfigError, UsageError

GOOD = """
[model]
path = "some/model"

[data]
train_files = ["train.parquet"]
batch_size = 4

[rollout]
n = 4
"""


def write(tmp_path, text, name="rlctl.toml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def problems_of(path, overrides=()):
    with pytest.raises(ConfigError) as e:
        load_config(path, overrides)
    return e.value.problems


def test_good_config_has_defaults_filled(tmp_path):
    loaded = load_config(write(tmp_path, GOOD))
    c = loaded.config
    assert c.model.path == "some/model" and c.data.train_files == ("train.parquet",)
    assert c.rollout.n == 4 and c.actor.clip_ratio_low == 0.2 and c.model.lora.rank == 0


def test_all_problems_reported_at_once_with_lines(tmp_path):
    text = GOOD + """
[acter]
lr = 1e-6

[actor]
lr = -1.0
clip_ratio_low = "big"
loss_agg_mode = "token_mean"

[algorithm]
name = "grp"
"""
    problems = problems_of(write(tmp_path, text))
    joined = "\n".join(problems)
    assert len(problems) == 4, joined           # algorithm.name is checked against the registry by validate
    assert "acter.lr: unknown key (did you mean 'actor.lr'?)" in joined
    assert "actor.lr: must be > 0, got -1.0" in joined
    assert "actor.clip_ratio_low: expected a number, got str 'big'" in joined
    assert "'token-mean'" in joined and "did you mean" in joined
    # file:line prefixes point at the offending lines
    lines = text.splitlines()
    for p in problems:
        file_line = p.split(": ", 1)[0]
        no = int(file_line.rsplit(":", 1)[1])
        key = p.split(": ")[1].split(".")[-1]
        assert key.split(" ")[0] in lines[no - 1], (p, lines[no - 1])


def test_unknown_dotted_key_suggests_full_key(tmp_path):
    problems = problems_of(write(tmp_path, GOOD + "\n[actor]\nlrr = 1e-6\n"))
    assert problems == [f"{tmp_path / 'rlctl.toml'}:13: actor.lrr: unknown key (did you mean 'actor.lr'?)"]


def test_missing_required_keys(tmp_path):
    problems = problems_of(write(tmp_path, "[run]\nname = 'x'\n"))
    assert any("model.path: missing required key" in p for p in problems)
    assert any("data.train_files: missing required key" in p for p in problems)


def test_overrides_are_typed_by_schema(tmp_path):
    path = write(tmp_path, GOOD)
    c = load_config(path, ["actor.lr=1e-6", "rollout.n=8", 'data.train_files=["a.parquet","b.parquet"]',
                           "model.lora.rank=16", "model.dtype=bfloat16", "run.name=my run"]).config
    assert c.actor.lr == 1e-6 and c.rollout.n == 8 and c.model.lora.rank == 16
    assert c.data.train_files == ("a.parquet", "b.parquet") and c.model.dtype == "bfloat16"
    assert c.run.name == "my run"
    problems = problems_of(path, ["acter.lr=1e-6", "rollout.n=eight"])
    assert any("acter.lr: unknown key (did you mean 'actor.lr'?)" in p for p in problems)
    assert any("rollout.n: expected an integer, got str 'eight'" in p for p in problems)
    # the file sets actor.lr on a line of its own, but this error is the override's: no file line
    path = write(tmp_path, GOOD + "\n[actor]\nlr = 1e-6\n")
    assert problems_of(path, ["actor.lr=-1"]) == [f"{path}: actor.lr: must be > 0, got -1.0"]


def test_override_syntax():
    assert parse_override("a.b=1") == ("a.b", 1)
    assert parse_override("a.b=true") == ("a.b", True)
    assert parse_override("a.b=path/to/x") == ("a.b", "path/to/x")
    with pytest.raises(UsageError):
        parse_override("nonsense")
    with pytest.raises(UsageError):
        parse_override("lr=1")


@pytest.mark.parametrize("content,needle", [
    (b"[model\npath = 1\n", "invalid TOML"),
    (b"\x00\x01\x02binary", "binary file"),
    (b"\xff\xfe[model]\n", "not UTF-8"),
    (b"[model]\npath='x'\n[data]\ntrain_files=['a']\nbatch_size = 99999999999999999999999\n", "batch_size"),
])
def test_hostile_files_give_one_line(tmp_path, content, needle):
    p = tmp_path / "rlctl.toml"
    p.write_bytes(content)
    with pytest.raises(UsageError) as e:
        load_config(p)
    text = str(e.value) + " ".join(getattr(e.value, "problems", []))
    assert needle in text


def test_huge_file_and_directory(tmp_path):
    big = tmp_path / "big.toml"
    big.write_bytes(b"# x\n" * (50 * 2**20 // 4))
    with pytest.raises(UsageError, match="MiB"):
        load_config(big)
    with pytest.raises(UsageError, match="is a folder"):
        load_config(tmp_path)
    with pytest.raises(UsageError, match="not found"):
        load_config(tmp_path / "missing.toml")


@pytest.mark.parametrize("content", [b"[model\n", b"\x00\x00", b"x = 1\n" * 10])
def test_cli_errors_are_one_line_exit_2(tmp_path, content):
    p = tmp_path / "rlctl.toml"
    p.write_bytes(content)
    out = rlctl_here("config", "validate", p)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("error: ")


def test_debug_env_shows_traceback(tmp_path, monkeypatch):
    p = tmp_path / "rlctl.toml"
    p.write_bytes(b"[model\n")
    monkeypatch.setenv("RLCTL_DEBUG", "1")
    out = rlctl_here("config", "validate", p)
    assert out.returncode == 2 and "Traceback" in out.stderr


def test_string_keys_take_any_override_text():
    """Overrides are typed by the schema: a string key gets the text as written, even when it
    would read as a TOML number, boolean or date; other keys keep the TOML reading."""
    assert parse_override("run.name=123") == ("run.name", "123")
    assert parse_override("run.name=2024-01-01") == ("run.name", "2024-01-01")
    assert parse_override("model.path=true") == ("model.path", "true")
    assert parse_override('run.name="quoted"') == ("run.name", "quoted")
    assert parse_override("rollout.n=8") == ("rollout.n", 8) and parse_override("actor.lr=1e-6") == ("actor.lr", 1e-6)


def test_reward_weights_inline_table_round_trips_through_the_resolved_config(tmp_path):
    import tomlkit

    from rlctl.config.loader import config_to_dict

    cfg = tmp_path / "rlctl.toml"
    cfg.write_text('[model]\npath = "m"\n[data]\ntrain_files = ["t.parquet"]\n'
                   '[reward]\nremote_url = "http://127.0.0.1:5000/r"\nweights = { function = 1, remote = 0.5 }\n')
    loaded = load_config(cfg)
    assert loaded.config.reward.weights == {"function": 1.0, "remote": 0.5}
    again = tmp_path / "config.resolved.toml"
    again.write_text(tomlkit.dumps(config_to_dict(loaded.config)))
    assert load_config(again).config == loaded.config
    assert load_config(cfg, ["reward.weights.judge=0.1"]).config.reward.weights["judge"] == 0.1
    with pytest.raises(ConfigError) as err:
        load_config(cfg, ['reward.weights={ remot = 1 }'])
    assert "did you mean 'remote'" in str(err.value.problems)
    with pytest.raises(ConfigError) as err:
        load_config(cfg, ['reward.weights={ judge = "high" }'])
    assert "not a finite number" in str(err.value.problems)


@pytest.mark.parametrize("toml_value,expected", [('"auto"', "auto"), ("0", 0), ("8", 8)])
def test_gpus_per_node_is_an_int_or_auto(tmp_path, toml_value, expected):
    path = write(tmp_path, GOOD + f"\n[resources]\ngpus_per_node = {toml_value}\n")
    assert load_config(path).config.resources.gpus_per_node == expected
    assert load_config(write(tmp_path, GOOD, "bare.toml")).config.resources.gpus_per_node == "auto"  # the default
    override = load_config(path, [f"resources.gpus_per_node={toml_value.strip(chr(34))}"])
    assert override.config.resources.gpus_per_node == expected   # an override 2 is the number 2, not "2"


@pytest.mark.parametrize("value,needle", [
    ('"all"', "expected an integer >= 0 or \"auto\", got str 'all'"),
    ('"2"', "expected an integer >= 0 or \"auto\", got str '2'"),
    ("-1", "must be >= 0, got -1"),
    ("1.5", "expected an integer >= 0 or \"auto\", got float 1.5"),
    ("true", "expected an integer >= 0 or \"auto\", got bool True"),
])
def test_gpus_per_node_rejects_anything_else(tmp_path, value, needle):
    problems = problems_of(write(tmp_path, GOOD + f"\n[resources]\ngpus_per_node = {value}\n"))
    assert len(problems) == 1 and "resources.gpus_per_node" in problems[0] and needle in problems[0], problems


def test_json_schema_takes_an_int_or_auto():
    from rlctl.config.jsonschema import config_json_schema

    gpus = config_json_schema()["properties"]["resources"]["properties"]["gpus_per_node"]
    assert gpus["default"] == "auto"
    assert gpus["anyOf"] == [{"type": "integer", "minimum": 0}, {"const": "auto"}]
