"""Target models: loading (`load_target`) and the HF adapter behind the TargetModel seam."""
from __future__ import annotations

from respec.models.base import TargetModel, TargetOutput

__all__ = ["TargetModel", "TargetOutput", "load_target"]


def load_target(spec: str = "default", device: str = "auto", dtype: str = "auto", compile: str = "off"):
    """Load a target ("default" | HF hub id | local HF dir | .gguf path) and wrap it as an HFTarget
    (tokenizer attached as `.tokenizer`, load facts as `.loaded`). `compile="on"` compiles its
    forward and warms it up before returning (respec/accel/compiled.py). Raises ModelLoadError,
    or ValueError for a bad `compile`."""
    from respec.config import check_compile_choice
    from respec.models.hf import HFTarget
    from respec.models.loading import load_model

    compile = check_compile_choice(compile)
    loaded = load_model(spec, device=device, dtype=dtype)
    target = HFTarget(loaded.model, eos_token_ids=loaded.eos_token_ids, context_length=loaded.context_length,
                      name=loaded.name, tokenizer=loaded.tokenizer)
    target.loaded = loaded
    if compile == "on":
        target.enable_compile()
    return target
