"""A saved state's adapter folder names its base and merges on its own, for every adapter on a
shared base, not only the first (in-process: no server)."""

from __future__ import annotations

import json

from rlctl.checkpoint.adapter_merge import merge_folder
from rlctl.tinker import state
from rlctl.tinker.base import BaseModel, LoraSpec


def test_each_adapter_of_a_shared_base_saves_a_folder_that_merges(tiny_model_dir, tmp_path):
    base = BaseModel(str(tiny_model_dir), tiny_model_dir)
    for name, seed in (("first", 0), ("second", 1)):
        params = base.add_adapter(name, LoraSpec(4, seed=seed))
        for p in params:   # a trained adapter: lora_B is no longer zero
            p.data.normal_(0, 0.05)
    path = state.save(tmp_path / "states", "s-x:train:1", "weights", "mid", adapter_state=base.adapter_state("second"),
                      adapter_config=base.adapter_config("second"), meta={"base_model": base.name, "steps": 2},
                      optimizer=None)
    folder = state.folder_of(tmp_path / "states", path)
    assert json.loads((folder / "adapter_config.json").read_text())["base_model_name_or_path"] == str(tiny_model_dir.resolve())
    result = merge_folder(folder, tmp_path / "merged")
    assert result.step == 2 and result.verification["merge_max_abs_diff"] <= result.verification["tolerance"]
