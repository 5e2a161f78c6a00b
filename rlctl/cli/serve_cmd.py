"""`rlctl serve` (OpenAI-compatible server) and `rlctl eval` (score a model on a parquet split)."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from rlctl.cli.common import emit

MODEL_ARG = typer.Argument(..., help="A Hugging Face model folder, or a run folder (its latest checkpoint).",
                           show_default=False)


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
    insecure: bool = typer.Option(False, "--insecure", help="Allow a non-loopback --host without an API key."),
    dtype: str = typer.Option("auto", help="auto (bfloat16 on GPU, float32 on CPU), float32, bfloat16, float16."),
    tensor_parallel_size: int = typer.Option(1, min=1, help="vllm/sglang: GPUs to shard the model over."),
    step: Optional[int] = typer.Option(None, min=0, help="Run folder: serve this checkpoint step (default latest)."),
) -> None:
    """Serve a model over an OpenAI-compatible HTTP API (/v1/chat/completions, /v1/completions).

    Words after `--` go to the vllm/sglang server unchanged.

    Example: rlctl serve runs/grpo/merged --port 8000 --api-key secret
    """
    import logging

    from rlctl.errors import UsageError
    from rlctl.serve.external import LaunchSpec, build_command, pick_engine, run_child
    from rlctl.serve.server import check_bind, serve_builtin
    from rlctl.serve.source import DTYPES, model_folder

    if dtype not in DTYPES:
        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(DTYPES)}")
    check_bind(host, api_key, insecure)
    chosen = pick_engine(engine, tensor_parallel_size=tensor_parallel_size)
    if chosen == "hf" and ctx.args:
        raise UsageError(f"extra arguments {' '.join(ctx.args)} only apply to --engine vllm or sglang")
    if chosen == "hf" and tensor_parallel_size > 1:
        raise UsageError("--tensor-parallel-size > 1 needs --engine vllm or sglang")
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    name = served_model_name or model.resolve().name
    with model_folder(model, step) as folder:
        if chosen == "hf":
            code = serve_builtin(folder, host=host, port=port, model_name=name, api_key=api_key,
                                 max_concurrency=max_concurrency, dtype=dtype)
        else:
            spec = LaunchSpec(str(folder), host, port, name, api_key, tensor_parallel_size, dtype, max_concurrency)
            code = run_child(build_command(chosen, spec, tuple(ctx.args)))
    if code:
        raise typer.Exit(code)


def register(app: typer.Typer) -> None:
    app.command("serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})(serve)
