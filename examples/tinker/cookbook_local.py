"""Run a tinker-cookbook recipe, unmodified, against `rlctl tinker` on a machine without the hub.

    .venv-tinker/bin/python examples/tinker/cookbook_local.py --data-dir data/cookbook --tokenizer models/smollm2 \\
        tinker_cookbook.recipes.rl_loop base_url=http://127.0.0.1:8765 \\
        model_name=HuggingFaceTB/SmolLM2-135M-Instruct log_path=runs/cookbook/rl batch_size=4 ...

The recipe module runs as `python -m MODULE KEY=VALUE...` would run it (its own `__main__` block, its
own chz arguments). Before that, three things change in this process only, none in the cookbook
(and a fourth when asked):

1. `datasets.load_dataset(ID, ...)` reads `DATA_DIR/ID/<split>.jsonl` (every such file becomes the
   split of its name; a config name such as gsm8k's "main" is ignored) instead of the hub. An ID
   with no folder there fails with its name. `cookbook_data.py` writes the recipes' three.
2. The recipe's `model_name` gets its tokenizer from the local `--tokenizer` folder, through the
   cookbook's own hook (`tokenizer_utils.register_tokenizer`), not from the hub.
3. The cookbook's model registry (`model_info`, which picks a recipe's chat renderer by model name)
   knows only its own service's models; `model_name` is added to it with `--renderer` (default
   `qwen3_instruct`: plain ChatML, `<|im_start|>role\\n...<|im_end|>`, which is SmolLM2-Instruct's
   own template token for token when the conversation has a system message; SmolLM2's template
   adds a default one when it has none, the renderer does not).
4. `--start-from STATE` (a saved state's `tinker://.../weights/NAME`, or an earlier recipe run's
   log folder, whose last checkpoint is taken): writes `LOG_PATH/checkpoints.jsonl` with one record,
   batch 0 at that state, so the recipe's own resume (`checkpoint_utils.get_last_checkpoint`, then
   `create_training_client_from_state_with_optimizer`) starts its first batch from it: e.g.
   `rl_loop` from what `sl_loop` learned. Refused when LOG_PATH already lists checkpoints (the
   recipe would resume its own run instead).
"""

from __future__ import annotations

import argparse
import functools
import json
import runpy
import sys
from pathlib import Path
from typing import NoReturn


def local_datasets(data_dir: Path) -> None:
    """`datasets.load_dataset(hub id)` answered from DATA_DIR/<hub id>/<split>.jsonl."""
    import datasets

    hub_load = datasets.load_dataset

    def load_dataset(path: str, name: str | None = None, *_, split: str | None = None, **__):
        folder = data_dir / path
        files = {p.stem: str(p) for p in sorted(folder.glob("*.jsonl"))}
        if not files:
            raise FileNotFoundError(f"dataset {path!r}: no local copy ({folder}/<split>.jsonl); the hub is not "
                                    f"reachable here: write one in the hub's columns (cookbook_data.py makes three)")
        return hub_load("json", data_files=files, split=split)

    datasets.load_dataset = load_dataset


def local_model(model_name: str, tokenizer_dir: Path, renderer: str) -> None:
    """The served model's tokenizer from its local folder and a renderer in the cookbook's registry."""
    from tinker_cookbook import model_info, tokenizer_utils

    @functools.cache
    def tokenizer():
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(tokenizer_dir))

    tokenizer_utils.register_tokenizer(model_name, tokenizer)
    known = model_info.get_model_attributes
    org, _, version = model_name.rpartition("/")
    ours = model_info.ModelAttributes(organization=org, version_str=version, size_str=version, is_chat=True,
                                      recommended_renderers=(renderer,))

    def get_model_attributes(name: str):
        return ours if name.split(":", 1)[0] == model_name else known(name)

    model_info.get_model_attributes = get_model_attributes


def start_state(value: str) -> str:
    """The tinker:// state path --start-from names: given, or the last one a recipe's log folder lists."""
    if value.startswith("tinker://"):
        if "/weights/" not in value:
            fail(f"--start-from {value}: not a training state (tinker://MODEL/weights/NAME, from save_state); "
                 f"a sampler_weights path has no optimizer state to resume")
        return value
    listed = Path(value) / "checkpoints.jsonl"
    states = [r["state_path"] for r in map(json.loads, listed.read_text().splitlines() if listed.is_file() else [])
              if r.get("state_path")]
    if not states:
        fail(f"--start-from {value}: neither a tinker://.../weights/NAME path nor a recipe log folder whose "
             f"checkpoints.jsonl lists a state_path")
    return states[-1]


def start_from(log_path: Path, state_path: str) -> None:
    """LOG_PATH/checkpoints.jsonl naming `state_path` at batch 0: the record the recipe resumes from."""
    listed = log_path / "checkpoints.jsonl"
    if listed.is_file() and listed.read_text().strip():
        fail(f"--start-from: {listed} already lists checkpoints, so the recipe would resume its own run "
             f"from them; give a new log_path")
    log_path.mkdir(parents=True, exist_ok=True)
    listed.write_text(json.dumps({"name": "start-from", "batch": 0, "state_path": state_path}) + "\n")


def fail(message: str) -> NoReturn:
    print(f"cookbook_local.py: {message}", file=sys.stderr)
    raise SystemExit(2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="local copies of the hub data sets: ID/<split>.jsonl")
    ap.add_argument("--tokenizer", type=Path, required=True, help="the served model's local folder")
    ap.add_argument("--renderer", default="qwen3_instruct", help="the cookbook renderer for model_name")
    ap.add_argument("--start-from", metavar="STATE", help="start the recipe from this saved state (tinker://"
                    ".../weights/NAME, or an earlier run's log folder): its resume record at batch 0 in LOG_PATH")
    ap.add_argument("module", help="the recipe, e.g. tinker_cookbook.recipes.sl_loop")
    ap.add_argument("recipe_args", nargs=argparse.REMAINDER, help="the recipe's own KEY=VALUE arguments")
    args = ap.parse_args()
    names = [a.split("=", 1)[1] for a in args.recipe_args if a.startswith("model_name=")]
    if not names:
        ap.error("give the recipe model_name=NAME (the name `rlctl tinker --model NAME=FOLDER` serves)")
    if args.start_from:
        logs = [a.split("=", 1)[1] for a in args.recipe_args if a.startswith("log_path=")]
        if not logs:
            fail("--start-from needs the recipe's log_path=DIR (where its resume record goes)")
        start_from(Path(logs[-1]), start_state(args.start_from))
    local_datasets(args.data_dir)
    local_model(names[-1], args.tokenizer, args.renderer)
    sys.argv = [args.module, *args.recipe_args]
    runpy.run_module(args.module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
