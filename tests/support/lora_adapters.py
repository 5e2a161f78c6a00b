"""PEFT LoRA adapter folders for a tiny base model, made in the test (B initialised non-zero, so each
adapter changes the model's answers)."""

from __future__ import annotations

import json
from pathlib import Path


def make_adapter(base_dir: Path, out: Path, *, rank: int, targets, seed: int, **extra) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    peft_model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=16, target_modules=targets,
                                                  init_lora_weights=False, **extra))
    peft_model.save_pretrained(out)
    return out


def edit_config(folder: Path, out: Path, **changes) -> Path:
    """A copy of an adapter folder with adapter_config.json fields changed."""
    import shutil

    shutil.copytree(folder, out)
    cfg = json.loads((out / "adapter_config.json").read_text())
    cfg.update(changes)
    (out / "adapter_config.json").write_text(json.dumps(cfg))
    return out


def peft_greedy(base_dir: Path, adapter_dir: Path | None, prompt: str, max_new_tokens: int) -> str:
    """The reference answer: peft's own model (adapter unmerged), greedy, as text."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(base_dir)
    model = AutoModelForCausalLM.from_pretrained(base_dir)
    if adapter_dir is not None:
        model = PeftModel.from_pretrained(model, adapter_dir)
    ids = torch.tensor([tok(prompt, add_special_tokens=False)["input_ids"]])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                             do_sample=False)
    return tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
