"""`rlctl serve` (OpenAI-compatible server) and `rlctl eval` (score a model on a parquet split)."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from rlctl.cli.common import emit, flag, format_option

MODEL_ARG = typer.Argument(..., help="A Hugging Face model folder, or a run folder (its latest checkpoint).",
                           show_default=False)


def _chat_template(value: Optional[Path]) -> Optional[Path]:
    """--chat-template: a file (or the name of one rlctl ships), checked to render a conversation."""
    if value is None:
        return None
    from rlctl.models.chat_template import checked_template

    return checked_template(str(value), Path.cwd(), "--chat-template")


CHAT_TEMPLATE = typer.Option(None, "--chat-template", callback=_chat_template, help="A Jinja chat template file "
                             "rendering chats instead of the model's own, as vLLM's flag (rlctl ships "
                             "smollm2-tools.jinja: SmolLM2 with tools).")


def serve(
    ctx: typer.Context,
    model: Path = MODEL_ARG,
    engine: str = typer.Option("auto", help="auto (vLLM, then SGLang, then hf), hf, vllm or sglang."),
    host: str = typer.Option("127.0.0.1", help="Address to bind; other than loopback needs --api-key or --insecure."),
    port: int = typer.Option(8000, min=0, max=65535, help="Port to listen on (0 = any free port)."),
    api_key: Optional[str] = typer.Option(None, envvar="RLCTL_API_KEY",
                                          help="Require 'Authorization: Bearer KEY' on every route but /health."),
    served_model_name: Optional[str] = typer.Option(None, help="Model name clients send (default: the folder name)."),
    max_concurrency: int = typer.Option(32, min=1, help="Most sequences decoded together in one batch."),
    insecure: bool = flag("--insecure", help="Allow a non-loopback --host without an API key."),
    dtype: str = typer.Option("auto", help="auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16, float16."),
    tensor_parallel_size: int = typer.Option(1, min=1, help="vllm/sglang: GPUs to shard the model over."),
    step: Optional[int] = typer.Option(None, min=0, help="Run folder: serve this checkpoint step (default latest)."),
    max_body_bytes: int = typer.Option(4 << 20, min=1, help="hf: larger request bodies get a 413, unread."),
    read_timeout_s: float = typer.Option(30.0, min=0.1, help="hf: seconds a client has to send a whole request "
                                         "(slower ones get a 408; idle kept-alive connections are closed)."),
    prompt_logprobs: int = typer.Option(0, "--prompt-logprobs", min=0,
                                        help="hf: answer /v1/completions' prompt_logprobs (vLLM's extension) up to this "
                                             "many top tokens, e.g. for a distillation teacher (0 = refuse)."),
    allow_remote_images: bool = flag("--allow-remote-images",
                                     help="hf: fetch http(s) image_url parts (default: data: URLs only)."),
    lora: Optional[List[str]] = typer.Option(None, "--lora", help="NAME=DIR: serve the PEFT LoRA adapter in DIR "
                                             "as model NAME (repeatable; hf and vllm)."),
    max_loras: Optional[int] = typer.Option(None, min=1, help="LoRA adapters held at once, incl. ones loaded at "
                                            "run time with /v1/load_lora_adapter (default: 4, or the --lora count)."),
    max_lora_rank: Optional[int] = typer.Option(None, min=1, help="Largest adapter rank (default: the largest "
                                                "--lora rank, at least 16; vllm: one of its allowed ranks)."),
    chat_template: Optional[Path] = CHAT_TEMPLATE,
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions).

    Words after `--` go to the vllm/sglang server unchanged. A request's `model` picks the base model or
    a LoRA adapter; a LoRA run folder serves its base model with the run's adapter under the run's name.

    Example: rlctl serve runs/grpo/merged --port 8000 --api-key secret

    Example: rlctl serve models/smollm2 --lora sql=adapters/sql --lora chat=adapters/chat
    """
    from rlctl.serve.adapters import lora_plan
    from rlctl.serve.external import LaunchSpec, gpu_count, run_external
    from rlctl.serve.server import check_bind, serve_builtin
    from rlctl.serve.source import serve_source

    chosen = _engine_for(engine, dtype, ctx.args, tensor_parallel_size)
    check_bind(host, api_key, insecure)
    with serve_source(model, step, served_model_name) as (folder, name, run_adapter):
        plan = lora_plan(chosen, lora or [], Path(folder), name, run_adapter=run_adapter, max_loras=max_loras,
                         max_rank=max_lora_rank)
        if chosen == "hf":
            code = serve_builtin(folder, host=host, port=port, model_name=name, api_key=api_key,
                                 max_concurrency=max_concurrency, dtype=dtype, prompt_logprobs=prompt_logprobs,
                                 limits={"max_body_bytes": max_body_bytes, "read_timeout_s": read_timeout_s},
                                 allow_remote_images=allow_remote_images, lora=plan, chat_template=chat_template)
        else:
            spec = LaunchSpec(str(folder), host, port, name, api_key, tensor_parallel_size, dtype, max_concurrency,
                              cpu=gpu_count() == 0, chat_template=str(chat_template or ""))
            code = run_external(chosen, spec, folder, tuple(ctx.args), plan)
    if code:
        raise typer.Exit(code)


def _engine_for(engine: str, dtype: str, extra: list[str], tensor_parallel_size: int) -> str:
    """The engine `serve` runs, once --dtype and the engine's own options make sense for it."""
    from rlctl.errors import UsageError
    from rlctl.serve.external import pick_engine
    from rlctl.serve.source import DTYPES

    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    chosen = pick_engine(engine, tensor_parallel_size=tensor_parallel_size)
    if chosen == "hf" and extra:
        raise UsageError(f"extra arguments {' '.join(extra)} only apply to --engine vllm or sglang")
    if chosen == "hf" and tensor_parallel_size > 1:
        raise UsageError("--tensor-parallel-size > 1 needs --engine vllm or sglang")
    return chosen


def eval_cmd(
    model: Path = MODEL_ARG,
    data: Path = typer.Option(..., "--data", help="A parquet split (verl schema), e.g. data/gsm8k/test.parquet."),
    n: int = typer.Option(1, "--n", min=1, help="Samples per prompt; n > 1 adds mean@n and pass@k."),
    temperature: Optional[float] = typer.Option(None, min=0, help="Sampling temperature (default 0 for n = 1, else 1.0)."),
    top_p: float = typer.Option(1.0, min=0, max=1, help="Nucleus sampling mass."),
    limit: Optional[int] = typer.Option(None, min=1, help="Only the first N prompts."),
    max_new_tokens: Optional[int] = typer.Option(None, min=1,
                                                 help="Tokens per answer (default: the run's data.max_response_length, else 512)."),
    engine: str = typer.Option("auto", help="auto (vLLM, then SGLang, then hf), hf, vllm or sglang."),
    reward: Optional[str] = typer.Option(None, help="Reward function: \"file.py:fn\", a built-in name, or \"\" for "
                                                    "built-ins by data_source (default: the run's reward.function)."),
    seed: int = typer.Option(0, help="Sampling seed (prompt i uses seed + i: reproducible in any batch)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Generations jsonl (default: eval-<data name>.jsonl)."),
    dtype: str = typer.Option("auto", help="auto, float32, bfloat16 or float16."),
    max_concurrency: int = typer.Option(32, min=1, help="Sequences generated together."),
    step: Optional[int] = typer.Option(None, min=0, help="Run folder: evaluate this checkpoint step (default latest)."),
    config: Optional[Path] = typer.Option(None, "--config", help="An rlctl.toml whose reward and [rollout.multi_turn] "
                                          "tools/interaction to use instead of the model's run's (e.g. an SFT model "
                                          "with the RL run's tools)."),
    agent: Optional[str] = typer.Option(None, "--agent", help="\"file.py:name\": play this agent program (async "
                                        "run(client, row)) against the model; its rewards are the scores."),
    fmt: str = format_option("text", "json", help="text or json."),
) -> None:
    """Score a model on a parquet split with the training prompts and reward function.

    Prints accuracy and mean reward per data source (mean@n and pass@k when --n > 1) and writes every generation with its score to a jsonl.

    Example: rlctl eval runs/grpo --data data/gsm8k/test.parquet --n 4 --limit 200

    Example: rlctl eval models/smollm2 --data data/arith/test.parquet --agent revise.py:run
    """
    from rlctl.errors import UsageError
    from rlctl.serve.eval import EvalOptions, run_eval
    from rlctl.serve.source import DTYPES

    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    opts = EvalOptions(n=n, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, limit=limit,
                       seed=seed, engine=engine, reward=reward, dtype=dtype, max_concurrency=max_concurrency,
                       step=step, config=str(config) if config else None, agent=agent)
    summary = run_eval(model, data, opts, out or Path(f"eval-{data.stem}.jsonl"))
    emit(summary, fmt, text=_eval_table(summary))


def _eval_table(summary: dict) -> str:
    """One row per data source and `all`; the reward's own metrics (e.g. `number`) as extra columns."""
    keys = [k for k in summary["all"] if k not in ("prompts", "samples", "metrics")]
    extra = list(summary["all"].get("metrics", {}))
    rows = [("data_source", "prompts", "samples", *keys, *extra)]
    for name, m in [*summary["sources"].items(), ("all", summary["all"])]:
        own = m.get("metrics", {})
        rows.append((name, str(m["prompts"]), str(m["samples"]), *(f"{m[k]:.4f}" for k in keys),
                     *(f"{own[k]:.4f}" if k in own else "-" for k in extra)))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in rows]
    lines.append(f"n={summary['n']} temperature={summary['temperature']:g} reward={summary['reward']}; "
                 f"generations written to {summary['out']}")
    return "\n".join(lines)


def register(app: typer.Typer) -> None:
    app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(serve)
    app.command("eval")(eval_cmd)
