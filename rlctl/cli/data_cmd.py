"""`rlctl data prep` and `rlctl data inspect`: verl-compatible parquet in, a readable summary out."""

from __future__ import annotations

from pathlib import Path

import typer

from rlctl.cli.common import emit, flag, format_option
from rlctl.tasks.prep import source_help   # the built-in tasks' choices; no heavy import

data_app = typer.Typer(help="Prepare and inspect training data (verl-compatible parquet).", no_args_is_help=True)


@data_app.command("prep")
def prep(
    name: str = typer.Argument(..., metavar="SOURCE", help=source_help()),
    source: str = typer.Option(None, "--source", metavar="PATH_OR_HUB_ID",
                               help="A local file or folder (train*/test* files), or a hub dataset id. "
                                    "gsm8k/math default to the Hugging Face hub."),
    out: Path = typer.Option(None, "--out", help="Output folder (default data/<name>/)."),
    splits: str = typer.Option("", "--splits", help="Comma-separated splits to write (default: all)."),
    limit: int = typer.Option(None, "--limit", min=1, help="Keep the first N rows of each split."),
    seed: int = typer.Option(0, "--seed", help="Seed for the synthetic task and --val-fraction."),
    val_fraction: float = typer.Option(None, "--val-fraction", min=0.0, max=0.99,
                                       help="Hold out this share of train as test when the source has no "
                                            "test split (arith: 0.1 by default)."),
    on_error: str = typer.Option("fail", "--on-error", help="Bad rows: fail (show the first few) or skip "
                                                            "(drop and count them)."),
    prompt_col: str = typer.Option(None, "--prompt-col", help="Column holding the question (default: question)."),
    answer_col: str = typer.Option(None, "--answer-col", help="Column holding the answer (default: answer)."),
    system: str = typer.Option(None, "--system", help="A system message put before every prompt."),
    instruction: str = typer.Option(None, "--instruction", help="Text appended to every question (after a space)."),
    data_source: str = typer.Option(None, "--data-source",
                                    help="data_source written to each row (picks the built-in reward; "
                                         "default: the file's name)."),
    force: bool = flag("--force", help="Overwrite existing split files in --out."),
    sft: bool = flag("--sft", help="SFT data: add a `response` column (the reference solution) "
                                          "to every row; default --out data/<name>-sft/."),
    tools: str = typer.Option("", "--tools", metavar="TOOL[,TOOL]",
                              help="gsm8k/math prompts for tool use: a system message offers these built-in "
                                   "tools (python, calculator) and asks for the final answer in the reward's "
                                   "format; default --out data/<name>-<tools>/ (docs/multi-turn.md)."),
    size: int = typer.Option(None, "--size", help="reasoning-gym:TASK: distinct questions to draw (train + test; "
                                                  "default 1000); for verifiers:ID, the first N tasks."),
    args: str = typer.Option(None, "--args", metavar="JSON",
                             help="the task's config as a JSON object: reasoning-gym:TASK '{\"max_digits\": 1}' (a "
                                  "composite: {TASK: config}); for verifiers:ID the taskset's, \"env\", \"renderer\"."),
    fmt: str = format_option("text", "json", help="text or json."),
) -> None:
    """Turn a dataset into verl-compatible parquet files, one per split.

    Example: rlctl data prep arith --sft   (SFT data for the sft-arith-cpu recipe)

    Example: rlctl data prep gsm8k --source ../shared/data/gsm8k

    Example: rlctl data prep gsm8k --tools python   (for the grpo-gsm8k-python-tool recipe)

    Example: rlctl data prep jsonl --source qa.jsonl --prompt-col q --answer-col a --val-fraction 0.1

    Example: rlctl data prep code --source problems.jsonl   (rows: question + tests {"inputs", "outputs"})

    Example: rlctl data prep reasoning-gym:leg_counting --size 2000 --seed 1   (the envs extra; docs/environments.md)
    """
    from rlctl.tasks.prep import PrepOptions, prepare

    opts = PrepOptions(source=source, out=out, splits=tuple(s.strip() for s in splits.split(",") if s.strip()),
                       limit=limit, seed=seed, val_fraction=val_fraction, on_error=on_error,
                       prompt_col=prompt_col, answer_col=answer_col, system=system, instruction=instruction,
                       data_source=data_source, force=force, sft=sft, tools=_names(tools), size=size,
                       args=_json_object(args))
    report = prepare(name, opts)
    emit(report, fmt)
    if fmt == "text":
        _print_prep(report)


def _json_object(text: str | None) -> dict | None:
    """--args: a JSON object, or a one-line usage error saying what is wrong with it."""
    import json

    from rlctl.errors import UsageError

    if text is None:
        return None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise UsageError(f"--args is not JSON ({e.msg} at character {e.pos})",
                         hint='write a JSON object, e.g. --args \'{"max_digits": 1}\'.') from None
    if not isinstance(value, dict):
        raise UsageError(f"--args is a JSON {type(value).__name__}, not an object",
                         hint='write a JSON object, e.g. --args \'{"max_digits": 1}\'.')
    return value


def _names(words: str) -> tuple[str, ...]:
    """"a, b,a" -> ("a", "b"): comma-separated names, blanks and repeats dropped, order kept."""
    return tuple(dict.fromkeys(w.strip() for w in words.split(",") if w.strip()))


def _print_prep(report: dict) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    # Titles and cells are rich markup: paths, data_source and column names come from the user
    # and may hold "[...]", so each is escaped.
    title = f"{report['source']} -> {report['out']}  (data_source {report['data_source']})"
    table = Table(title=escape(title))
    for column in ("split", "rows", "skipped", "file"):
        table.add_column(column, justify="right" if column == "rows" else "left")
    for split, info in report["splits"].items():
        skipped = ", ".join(f"{kind}: {n}" for kind, n in info["skipped"].items()) or "-"
        if info["over_limit"]:
            skipped += f" (+{info['over_limit']} past --limit)"
        table.add_row(escape(split), f"{info['rows']:,}", escape(skipped), escape(info["file"]))
    console = Console()
    console.print(table)
    for example in report["skipped_examples"]:
        console.print(f"  skipped {example}", markup=False)
    for note in report["notes"]:
        console.print(f"  note: {note}", markup=False)


@data_app.command("inspect")
def inspect(
    file: Path = typer.Argument(..., help="A parquet file written by `rlctl data prep` (or by verl)."),
    model: str = typer.Option(None, "--model", metavar="ID_OR_PATH",
                              help="Tokenizer for prompt lengths in tokens (after the chat template)."),
    max_prompt_length: int = typer.Option(None, "--max-prompt-length", min=1,
                                          help="Count prompts longer than this many tokens (needs --model)."),
    samples: int = typer.Option(3, "--samples", min=0, help="Rows to show."),
    image_key: str = typer.Option("images", "--image-key", help="Vision data: the images column (data.image_key)."),
    fmt: str = format_option("text", "json", help="text or json."),
) -> None:
    """Check a data file's schema (and images) and show its rows, sources, image sizes and prompt lengths.

    Example: rlctl data inspect data/gsm8k/train.parquet --model models/tiny --max-prompt-length 512
             rlctl data inspect data/shapes/train.parquet --model models/tiny-vl
    """
    from rlctl.data.inspect import inspect_file
    from rlctl.errors import UsageError

    if max_prompt_length is not None and model is None:
        raise UsageError("--max-prompt-length needs --model", hint="lengths are counted in the model's tokens.")
    report = inspect_file(file, model=model, max_prompt_length=max_prompt_length, samples=samples,
                          image_key=image_key)
    emit(report, fmt)
    if fmt == "text":
        _print_inspect(report)


def _print_inspect(report: dict) -> None:
    from rich.console import Console
    from rich.markup import escape

    console = Console()
    console.print(f"[bold]{escape(report['file'])}[/]: schema ok, {report['rows']:,} rows, "
                  f"columns {escape(', '.join(report['columns']))}", highlight=False)
    for label, key in (("data sources", "data_sources"), ("abilities", "abilities"), ("splits", "splits")):
        if report[key]:
            console.print(f"  {label}: " + ", ".join(f"{k} ({n:,})" for k, n in report[key].items()), markup=False)
    if report["empty_ground_truth"]:
        console.print(f"  [yellow]warning[/]: {report['empty_ground_truth']} row(s) have an empty ground truth")
    for i, sample in enumerate(report["samples"]):
        console.print(f"  [{i}] {'+'.join(sample['roles'])}: {sample['prompt']!r} -> {sample['ground_truth']!r}",
                      markup=False)
    if "images" in report:
        _print_images(console, report["images"])
    if "prompt_tokens" in report:
        _print_lengths(console, report["prompt_tokens"])


def _print_images(console, images: dict) -> None:
    line = (f"  images ({images['column']}): {images['images']:,} in {images['rows_with_images']:,} row(s), "
            f"{images['per_row']['min']}-{images['per_row']['max']} per row")
    if "width" in images:
        w, h = images["width"], images["height"]
        line += f"; width {w['min']}-{w['max']} (mean {w['mean']}), height {h['min']}-{h['max']} (mean {h['mean']})"
    console.print(line, markup=False, highlight=False)


def _print_lengths(console, tokens: dict) -> None:
    how = "after the chat template" if tokens["chat_template"] else "no chat template: contents joined"
    pct = "  ".join(f"{k} {v}" for k, v in tokens["percentiles"].items())
    console.print(f"  prompt tokens ({tokens['model']}, {how}): min {tokens['min']}  mean {tokens['mean']}  "
                  f"{pct}  max {tokens['max']}", markup=False)
    peak = max(b["count"] for b in tokens["histogram"]) or 1
    for b in tokens["histogram"]:
        bar = "█" * round(40 * b["count"] / peak)
        console.print(f"  {b['lo']:>6}-{b['hi']:<6} {bar} {b['count']:,}", markup=False, highlight=False)
    if "over_limit" in tokens:
        style = "red" if tokens["over_limit"] else "green"
        console.print(f"  [{style}]{tokens['over_limit']:,} row(s) ({tokens['over_limit_share']:.1%}) exceed "
                      f"--max-prompt-length {tokens['max_prompt_length']}[/]")


def register(app: typer.Typer) -> None:
    app.add_typer(data_app, name="data")
