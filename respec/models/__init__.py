"""Target models: loading (`load_target`) and the HF adapter behind the TargetModel seam."""
from __future__ import annotations

from respec.models.base import TargetModel, TargetOutput

__all__ = ["TargetModel", "TargetOutput", "load_target"]


def load_target(spec: str = "default", device: str = "auto", dtype: str = "auto"):
    """Load a target ("default" | HF hub id | local HF dir | .gguf path) and wrap it as an HFTarget
    (tokenizer attached as `.tokenizer`, load facts as `.loaded`). Raises ModelLoadError."""
    from respec.models.hf import HFTarget
    from respec.models.loading import load_model

    loaded = load_model(spec, device=device, dtype=dtype)
    target = HFTarget(loaded.model, eos_token_ids=loaded.eos_token_ids, context_length=loaded.context_length,
                      name=loaded.name, tokenizer=loaded.tokenizer)
    target.loaded = loaded
    return target
