"""`rlctl eval`: generate for every prompt of a parquet split and score it the way training does.

Same prompts (the chat template with the generation prompt, tokenized by training's own
`chat_prompt_ids`), same reward (a run folder's `reward.*` settings, through the training reward
sources with their timeouts), so an eval number means what the training curve means.
With n samples per prompt it also reports mean@n and the unbiased pass@k of Chen et al. (2021).
"""

from __future__ import annotations

import json
import logging
import math
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path

from rlctl.errors import DataError, UsageError

log = logging.getLogger("rlctl.eval")


@dataclass(frozen=True)
class EvalOptions:
    n: int = 1
    temperature: float | None = None  # None: 0 (greedy) for n = 1, else 1.0
    top_p: float = 1.0
    max_new_tokens: int | None = None  # None: the run's data.max_response_length (or its default)
    limit: int | None = None
    seed: int = 0
    engine: str = "auto"
    reward: str | None = None  # None: the run's reward.function (or built-ins by data_source)
    dtype: str = "auto"
    max_concurrency: int = 32
    step: int | None = None
    config: str | None = None  # an rlctl.toml whose reward and multi-turn settings replace the model's run's
    agent: str | None = None  # "file.py:name": play this agent program (its own reward: rlctl.serve.eval_turns)
    chat_template: str = ""  # the template file chats are rendered with ("": the model folder's own)


def pass_at_k(n: int, c: int, k: int) -> float:
    """P(at least one of k draws without replacement from n samples, c correct, is correct).

    = 1 - C(n-c, k) / C(n, k): unbiased, unlike 1 - (1 - c/n)^k.
    """
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def ks_for(n: int) -> list[int]:
    """1, 2, 4, ... up to n, and n itself."""
    ks = [k for k in (2**i for i in range(n.bit_length())) if k <= n]
    return ks if ks[-1] == n else ks + [n]


def summarize(scores: list[list[float]], correct: list[list[bool]], n: int,
              tool_use: list[list[bool]] | None = None, metrics: list[list[dict]] | None = None) -> dict:
    """Metrics over prompts: mean reward, accuracy, and mean@n / pass@k when n > 1; `tool_use`
    (multi-turn): the fraction of samples that called a tool; `metrics`: per sample, the reward's own
    metrics (e.g. arith_answer's `number`), each averaged over the samples that have it."""
    flat_scores = [s for row in scores for s in row]
    flat_correct = [c for row in correct for c in row]
    out = {"prompts": len(scores), "samples": len(flat_scores),
           "accuracy": sum(flat_correct) / len(flat_correct), "mean_reward": sum(flat_scores) / len(flat_scores)}
    if metrics:
        out["metrics"] = _mean_metrics([m for row in metrics for m in row])
    if tool_use is not None:
        flat_used = [u for row in tool_use for u in row]
        out["tool_use"] = sum(flat_used) / len(flat_used)
    if n > 1:
        out[f"mean@{n}"] = out["mean_reward"]
        for k in ks_for(n):
            out[f"pass@{k}"] = sum(pass_at_k(len(row), sum(row), k) for row in correct) / len(correct)
    return out


def _mean_metrics(samples: list[dict]) -> dict:
    values = defaultdict(list)
    for sample in samples:
        for name, value in sample.items():
            values[name].append(value)
    return {name: sum(v) / len(v) for name, v in sorted(values.items())}


def run_config(model_path: Path):
    """(the training config of this run folder or merged model, or None; the folder its relative
    paths resolve from)."""
    from rlctl.checkpoint.merge import TRAINING_CONFIG
    from rlctl.checkpoint.run_folder import CONFIG_FILE, is_run_folder
    from rlctl.config.loader import load_config

    resolved = model_path / CONFIG_FILE
    if is_run_folder(model_path) and resolved.is_file():
        config = load_config(resolved, strict=False).config
        return config, _project_dir(model_path, config)
    if (model_path / TRAINING_CONFIG).is_file():   # a merged folder: the run's settings (absolute paths)
        return load_config(model_path / TRAINING_CONFIG, strict=False).config, model_path.resolve()
    return None, Path.cwd()


def eval_config(path: str | Path):
    """`rlctl eval --config rlctl.toml`: (that config, its folder), for a model without the run's
    settings, e.g. the SFT stage or a base model evaluated with an RL run's tools and reward."""
    from rlctl.config.loader import load_config

    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--config {path} does not exist", hint="name an rlctl.toml, e.g. --config rl.toml")
    loaded = load_config(path, strict=False)
    return loaded.config, loaded.base_dir


def reward_settings(model_path: Path, override: str | None, loaded: tuple | None = None):
    """(RewardConfig, folder its relative paths resolve from, max_response_length) for this model;
    `loaded` is run_config(model_path) when the caller has read it already."""
    from rlctl.config.schema import DataConfig, RewardConfig

    reward, config_dir, max_response = RewardConfig(), Path.cwd(), DataConfig().max_response_length
    config, folder = loaded if loaded is not None else run_config(model_path)
    if config is not None:
        reward, config_dir, max_response = config.reward, folder, config.data.max_response_length
    if override is not None:
        reward, config_dir = replace(reward, function=override), Path.cwd()
    return reward, config_dir, max_response


def _project_dir(run_dir: Path, config) -> Path:
    """The folder the run's config was in: its relative paths (reward.py) point there.

    A run folder is <project>/<run.output_dir>/<run.name>; with an absolute output_dir the
    project cannot be told from the run folder, and the run folder itself is used.
    """
    tail = (*Path(config.run.output_dir).parts, config.run.name)
    parts = run_dir.resolve().parts
    if not Path(config.run.output_dir).is_absolute() and len(parts) > len(tail) and parts[-len(tail):] == tail:
        return Path(*parts[:-len(tail)])
    return run_dir.resolve()


def _settings(model_path: Path, opts: EvalOptions):
    """(the run's or --config's config or None, the folder its paths are relative to, `opts` with --config's
    model.chat_template: a run's folders carry their template, a plain model folder may not)."""
    config, base = eval_config(opts.config) if opts.config else run_config(model_path)
    if opts.config and config.model.chat_template:
        from rlctl.models.chat_template import resolve

        opts = replace(opts, chat_template=str(resolve(config.model.chat_template, base)))
    return config, base, opts


def run_eval(model_path: str | Path, data_file: str | Path, opts: EvalOptions, out_path: Path) -> dict:
    """Generate, score, write one JSON line per sample to `out_path`; returns the summary."""
    from rlctl.data.dataset import load_rows
    from rlctl.rewards.sources import build_reward
    from rlctl.serve.source import model_folder

    model_path = Path(model_path)
    config, run_dir, opts = _settings(model_path, opts)
    image_key = config.data.image_key if config is not None else "images"
    if not Path(data_file).is_file():   # before load_rows, whose hint speaks of data.train_files
        raise DataError(f"--data {data_file} is not a file",
                        hint="pass a parquet file of prompts, e.g. data/gsm8k/test.parquet (`rlctl data prep` writes them)")
    rows = load_rows([Path(data_file)], image_key)[: opts.limit]
    if not rows:
        raise DataError(f"{data_file} has no rows to evaluate")
    reward, config_dir, default_max = reward_settings(model_path, opts.reward, (config, run_dir))
    temperature = opts.temperature if opts.temperature is not None else (0.0 if opts.n == 1 else 1.0)
    if opts.n > 1 and temperature == 0:
        raise UsageError("--n > 1 with --temperature 0 gives n identical answers",
                         hint="set --temperature (e.g. 1.0) to sample.")
    reward = _resolve_reward_model(reward, config_dir)
    kind, config, base = rollout_of(config, run_dir, opts)
    # The reward sources check themselves as they start (the function, the built-ins for these data
    # sources, the services' URLs): a bad reward stops here, before minutes of generation.
    with build_reward(reward, config_dir) as sources:
        if not kind.own_reward(config):   # e.g. an agent's own reward scores it: no reward function runs
            sources.check_data_sources({row["data_source"] for row in rows})
        played = None
        with model_folder(model_path, opts.step) as folder:
            if not kind.one_call:   # the training rollout (tool loop, agent programs) over the model here
                from rlctl.serve.eval_turns import evaluate_rollout

                samples, played = evaluate_rollout(folder, rows, opts, temperature,
                                                   opts.max_new_tokens or default_max, config, base)
            else:
                tokenizer, prompt_ids, visions = _prompts(folder, rows, image_key, opts.chat_template)
                samples = _single_turn_samples(rows, tokenizer.batch_decode(prompt_ids), _generate(
                    folder, prompt_ids, opts, temperature, opts.max_new_tokens or default_max, visions))
        if reward.model:   # loaded once the policy is done with
            sources.attach_model(_LocalRewardModel(reward))
        scores, correct, metrics, records = played if played is not None else _score(rows, samples, sources)
    _write_jsonl(out_path, records)
    by_source = defaultdict(list)
    for i, row in enumerate(rows):
        by_source[row["data_source"]].append(i)
    calls = all("tool_calls" in fields for prompt in samples for _, fields in prompt)   # the tool loop's records
    used = [[bool(fields["tool_calls"]) for _, fields in prompt] for prompt in samples] if calls else None
    summary = {"model": str(model_path), "data": str(data_file), "n": opts.n, "temperature": temperature,
               "reward": _reward_label(reward), "out": str(out_path),
               "sources": {src: summarize([scores[i] for i in idx], [correct[i] for i in idx], opts.n,
                                          [used[i] for i in idx] if used else None, [metrics[i] for i in idx])
                           for src, idx in sorted(by_source.items())},
               "all": summarize(scores, correct, opts.n, used, metrics)}
    if opts.config:
        summary["config"] = opts.config
    return summary


def rollout_of(config, run_dir: Path, opts: EvalOptions):
    """(the rollout kind eval runs, the config it is built from, the folder its files are relative to): the
    run's (or --config's) kind; --agent FILE.py:NAME plays that agent program with the run's other
    [rollout.agent] limits (or the defaults) and its own reward."""
    from rlctl.config.schema import Config
    from rlctl.rollouts.table import kind_of

    if opts.agent:
        if config is None:   # a bare model folder: the defaults, with room for an agent's longer prompts
            config = Config()
            config = replace(config, data=replace(config.data, max_prompt_length=1024))
        agent = replace(config.rollout.agent, function=opts.agent, command=(), reward="agent")
        config = replace(config, rollout=replace(config.rollout, agent=agent,
                                                 multi_turn=replace(config.rollout.multi_turn, enable=False)))
        run_dir = Path.cwd()
    return kind_of(config if config is not None else Config()), config, run_dir


def _resolve_reward_model(reward, config_dir: Path):
    """reward.model through the model resolver that training uses: a folder relative to the config,
    or a hub id (DataError now, before generating, when it is neither)."""
    if not reward.model:
        return reward
    from rlctl.models.hub import resolve_model

    return replace(reward, model=resolve_model(reward.model, config_dir, key="reward.model").spec)


def _reward_label(reward) -> str:
    from rlctl.rewards.registry import configured

    return " + ".join(entry.label(reward) for entry in configured(reward))


def _prompts(folder: Path, rows: list[dict], image_key: str, chat_template: str):
    """(tokenizer, prompt ids as training renders them, per row its image arrays or None: all None
    for a text model). A vision-language model's prompts go through its processor, images checked
    and decoded as training reads them (rlctl.data.images). `chat_template`: a file replacing the
    folder's own template ("": none)."""
    from rlctl.data.dataset import chat_prompt_ids
    from rlctl.models.chat_template import use_template
    from rlctl.serve.source import load_processor_of

    processor = use_template(load_processor_of(folder), chat_template)
    if processor is None:
        from transformers import AutoTokenizer

        tokenizer = use_template(AutoTokenizer.from_pretrained(folder), chat_template)
        return tokenizer, [chat_prompt_ids(row["prompt"], tokenizer) for row in rows], [None] * len(rows)
    from rlctl.data.images import load_vision_row
    from rlctl.models.vision import encode_prompt, processor_max_pixels

    limit, visions = processor_max_pixels(processor), []
    for i, row in enumerate(rows):
        messages, images = load_vision_row(row, image_key=image_key, max_pixels=limit, index=i)
        visions.append(encode_prompt(processor, messages, images))
    return processor.tokenizer, [v["input_ids"].tolist() for v in visions], visions


def _generate(folder: Path, prompt_ids: list[list[int]], opts: EvalOptions, temperature: float,
              max_new: int, visions: list):
    from rlctl.api.requests import SamplingParams
    from rlctl.serve.external import LaunchSpec, build_command, engine_env, gpu_count, pick_engine
    from rlctl.serve.generate import external_server, generate_local, generate_remote
    from rlctl.serve.source import context_room, load_model, load_processor_of
    from rlctl.utils.net import free_port

    engine = pick_engine(opts.engine)
    params = [SamplingParams(max_tokens=min(max_new, room), temperature=temperature, top_p=opts.top_p,
                             n=opts.n, seed=opts.seed + i)
              for i, room in enumerate(context_room(folder, prompt_ids))]
    progress = _progress_printer()
    log.info("generating %d x %d samples with the %s engine", len(prompt_ids), opts.n, engine)
    if engine == "hf":
        model, tokenizer = load_model(folder, opts.dtype)
        return generate_local(model, tokenizer, prompt_ids, params, max_concurrency=max(opts.max_concurrency, opts.n),
                              progress=progress, visions=visions, processor=load_processor_of(folder))
    if any(v is not None and "pixel_values" in v for v in visions):
        raise UsageError(f"rlctl eval of image prompts runs on the hf engine, not {engine}",
                         hint="pass --engine hf (vLLM's image path is not wired into eval yet).")
    port = free_port("127.0.0.1")
    spec = LaunchSpec(str(folder), "127.0.0.1", port, "eval", dtype=opts.dtype, cpu=gpu_count() == 0)
    with external_server(build_command(engine, spec), f"http://127.0.0.1:{port}", env=engine_env(engine, folder)) as url:
        return generate_remote(url, "eval", prompt_ids, params, concurrency=opts.max_concurrency,
                               progress=progress)


def _progress_printer():
    last = [0.0]

    def show(done: int, total: int) -> None:
        if done == total or done / total - last[0] >= 0.1:
            last[0] = done / total
            log.info("generated %d/%d prompts", done, total)

    return show


def _single_turn_samples(rows, prompts: list[str], generated):
    """[prompt][sample] (reward item, record fields) of single-turn generations, for _score."""
    return [[({"data_source": row["data_source"], "solution_str": s.text,
               "ground_truth": row["reward_model"]["ground_truth"], "extra_info": row.get("extra_info"),
               "prompt_str": prompt, "messages": row["prompt"]},
              {"finish_reason": s.finish_reason, "response_tokens": s.tokens}) for s in row_samples]
            for row, prompt, row_samples in zip(rows, prompts, generated)]


def _score(rows, samples, sources):
    """Scores [prompt][sample], correctness (the reward's `acc` if it gives one, else score > 0), the reward's own
    metrics [prompt][sample], records.

    samples[prompt][sample] is (the reward's item, the record's engine-specific fields), single- or multi-turn."""
    result = sources.score([item for row_samples in samples for item, _ in row_samples])
    acc = result.extras.get("acc")
    scores, correct, metrics, records, k = [], [], [], [], 0
    for i, (row, row_samples) in enumerate(zip(rows, samples)):
        scores.append([]), correct.append([]), metrics.append([])
        for j, (item, fields) in enumerate(row_samples):
            score = float(result.scores[k])
            ok = bool(acc[k] > 0) if acc is not None and not math.isnan(acc[k]) else score > 0
            scores[-1].append(score), correct[-1].append(ok), metrics[-1].append(_sample_metrics(result.extras, k))
            records.append({"index": i, "sample": j, "data_source": row["data_source"], "prompt": row["prompt"],
                            "response": item["solution_str"], "ground_truth": item["ground_truth"],
                            "score": score, "correct": ok, "metrics": metrics[-1][-1], **fields})
            k += 1
    return scores, correct, metrics, records


def _sample_metrics(extras: dict, k: int) -> dict:
    """The reward's numeric metrics of sample k (NaN = the reward gave none for it)."""
    out = {}
    for name, values in extras.items():
        try:
            value = float(values[k])
        except (TypeError, ValueError, IndexError):
            continue
        if not math.isnan(value):
            out[name] = value
    return out


class _LocalRewardModel:
    """reward.model (resolved) in this process: eval scores one batch, so no worker group (nor Ray) is started."""

    def __init__(self, reward):
        from rlctl.config.schema import Config
        from rlctl.workers.roles.reward_model import RewardModelWorker

        self.worker = RewardModelWorker(Config(reward=reward))

    def compute_rm_scores(self, batch):
        return self.worker.compute_rm_scores(batch)


def _write_jsonl(path: Path, records: list[dict]) -> None:
    from rlctl.utils.atomic_files import atomic_write_text

    atomic_write_text(path, "".join(json.dumps(record, ensure_ascii=False, default=str) + "\n" for record in records))
