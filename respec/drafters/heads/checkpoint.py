"""EAGLE head checkpoints: find, read and write them in the published layout, either kind.

Contract: `load_eagle_head(path_or_hub_id, target, dtype=None)` reads a directory with `config.json`
and `pytorch_model.bin` or `model.safetensors` (or a Hugging Face Hub id, fetched where the Hub is
reachable) and returns an `EagleHead` (respec/drafters/heads/eagle.py) or, for an EAGLE-3
checkpoint, an `Eagle3Head` (respec/drafters/heads/eagle3.py), on the target's device; every
mismatch is one ModelLoadError naming it. `save_eagle_head(head, path, max_shard_bytes=None)` writes
either kind in its published layout (config.json + model.safetensors, a `d2t` draft vocabulary where
the head has one); with `max_shard_bytes`, weights over that size go into shards
`model-0000i-of-0000n.safetensors` with Hugging Face's `model.safetensors.index.json` (whole tensors
per shard, so a shard exceeds the bound only when one tensor does), which loading reads as well: a
Space takes no file over 10 MiB without LFS.
This module imports both head modules; neither imports it.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from transformers import LlamaConfig

from respec.drafters.heads.eagle import _HEAD_KEYS, EagleHead, _to_target, head_config, load_weights
from respec.drafters.heads.eagle3 import build_eagle3_head, eagle3_state_and_config
from respec.errors import ModelLoadError
from respec.models.base import TargetModel
from respec.models.names import HUB_ID

SHARD_INDEX = "model.safetensors.index.json"
HEAD_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", SHARD_INDEX, "model-*.safetensors")


def resolve_head_dir(spec: str | Path) -> Path:
    """An EAGLE head spec -> a local checkpoint directory: an existing directory as is; otherwise a
    Hugging Face Hub id, fetched (config + weights only) with huggingface_hub into its cache.
    Raises ModelLoadError when it is neither, or the Hub cannot provide it (e.g. offline)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    text = str(spec).strip()
    if text.startswith((".", "/", "~")) or path.suffix in (".bin", ".safetensors", ".json") or not HUB_ID.match(text):
        raise ModelLoadError(f"EAGLE head {text!r} not found: {path.resolve()} is not a directory, and it is not "
                             "a Hugging Face Hub id either. Pass a checkpoint directory (config.json + weights) or a "
                             "Hub id such as yuhuili/EAGLE-Vicuna-7B-v1.3.")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(repo_id=text, allow_patterns=list(HEAD_FILES)))
    except Exception as exc:  # noqa: BLE001 - offline, unknown repo, gated, rate limited: one message
        reason = " ".join(str(exc).split())[:300]
        raise ModelLoadError(
            f"EAGLE head {text!r}: no local directory of that name, and the Hugging Face Hub could not provide it "
            f"({type(exc).__name__}: {reason}). Where the Hub is unreachable, download the head elsewhere and "
            "pass its directory.") from None


def _eagle3_reason(raw: dict, state: dict, hidden: int) -> str | None:
    """Why this checkpoint is an EAGLE-3 head (None if it is not): EAGLE-3 fuses three target
    layers' features (fc: 3H -> H), names its layer `midlayer` and brings its own lm_head."""
    if any(k.startswith("midlayer.") for k in state):
        return "its decoder layer is named `midlayer`"
    if any("eagle3" in str(a).lower() for a in raw.get("architectures") or []):
        return f"its config names the architecture {raw['architectures'][0]}"
    fc = state.get("fc.weight")
    if fc is not None and fc.ndim == 2 and fc.shape[1] == 3 * hidden:
        return f"its fc takes {fc.shape[1]} = 3 x {hidden} inputs (fused low/mid/high-layer features)"
    return None


def _build_eagle_head(raw: dict, state: dict[str, torch.Tensor], target: TargetModel, where: str) -> EagleHead:
    """An EAGLE-1/2 head from a published config.json (`raw`) and weights (`state`); ModelLoadError
    on any mismatch, naming the first."""
    cfg = LlamaConfig(**{k: v for k, v in raw.items() if k in _HEAD_KEYS})
    if cfg.hidden_size != target.hidden_size:
        raise ModelLoadError(f"EAGLE head at {where} has hidden size {cfg.hidden_size}, "
                             f"but the target has {target.hidden_size}")
    state = {k: v for k, v in state.items() if not k.startswith("embed_tokens") and k not in ("t2d", "d2t")}
    head = EagleHead(cfg, qkv_bias="layers.0.self_attn.q_proj.bias" in state, fc_bias="fc.bias" in state)
    return load_weights(head, state, f"EAGLE head at {where}")


def load_eagle_head(path: str | Path, target: TargetModel, dtype: torch.dtype | None = None) -> EagleHead:
    """Load a published-format EAGLE-1/2 or EAGLE-3 checkpoint (a directory with config.json + pytorch_model.bin
    or model.safetensors, or a Hub id: see resolve_head_dir) and cast it to the target's device and
    dtype (`dtype`, e.g. float32 for fine-tuning, overrides the latter). An EAGLE-3 checkpoint
    comes back as an Eagle3Head; checkpoints of another shape raise ModelLoadError."""
    path = resolve_head_dir(path)
    cfg_file = path / "config.json"
    tried = [str(path / n) for n in ("pytorch_model.bin", "model.safetensors", SHARD_INDEX)]
    if not cfg_file.is_file():
        raise ModelLoadError(f"EAGLE head: no config.json in {path}")
    try:
        raw = json.loads(cfg_file.read_text())
        if (path / "pytorch_model.bin").is_file():
            state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        elif (path / "model.safetensors").is_file():
            from safetensors.torch import load_file
            state = load_file(str(path / "model.safetensors"))
        elif (path / SHARD_INDEX).is_file():
            from safetensors.torch import load_file
            state = {}
            for name in sorted(set(json.loads((path / SHARD_INDEX).read_text())["weight_map"].values())):
                state.update(load_file(str(path / name)))
        else:
            raise ModelLoadError(f"EAGLE head: no weights found; tried {', '.join(tried)}")
    except ModelLoadError:
        raise
    except Exception as exc:  # torch.load / safetensors raise many types on corrupt files
        raise ModelLoadError(f"EAGLE head at {path} could not be read: {type(exc).__name__}: {exc}") from None
    d2t = state.get("d2t")
    if _eagle3_reason(raw, state, int(raw.get("hidden_size") or target.hidden_size)):
        head: EagleHead = build_eagle3_head(raw, state, target, str(path))
    else:
        head = _build_eagle_head(raw, state, target, str(path))
    if d2t is not None:
        vocab = torch.arange(d2t.numel()) + d2t.reshape(-1).long()
        n = target.model.get_output_embeddings().weight.shape[0]
        if vocab.numel() == 0 or int(vocab.min()) < 0 or int(vocab.max()) >= n or vocab.unique().numel() != vocab.numel():
            raise ModelLoadError(f"EAGLE head at {path}: its d2t draft vocabulary is not a set of distinct "
                                 f"ids of the target's {n}-token vocabulary")
        if head.feature_layers is not None and vocab.numel() != head.lm_head.weight.shape[0]:
            raise ModelLoadError(f"EAGLE-3 head at {path}: d2t has {vocab.numel()} entries, its lm_head "
                                 f"{head.lm_head.weight.shape[0]} rows")
        head.draft_vocab = vocab
    return _to_target(head, target, dtype)


def save_eagle_head(head: EagleHead, path: str | Path, max_shard_bytes: int | None = None) -> None:
    """Write `head` in the published layout: config.json + model.safetensors (no embed, no lm_head;
    an Eagle3Head in the EAGLE-3 layout, with its own norm, lm_head, d2t and t2d); weights over
    `max_shard_bytes` in shards with an index (the module contract). Earlier weight files in `path`
    are replaced."""
    if head.feature_layers is not None:
        state, cfg = eagle3_state_and_config(head)
    else:
        cfg = head_config(head, "LlamaForCausalLM")
        cfg.update({"bias": head.fc.bias is not None, "qkv_bias": head.qkv_bias})
        state = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()
                 if not k.startswith("rotary")}
        if head.draft_vocab is not None:
            vocab = head.draft_vocab.detach().to("cpu").long()
            state["d2t"] = (vocab - torch.arange(vocab.numel())).contiguous()
            cfg["draft_vocab_size"] = int(vocab.numel())
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    write_weights(state, path, max_shard_bytes)


def write_weights(state: dict[str, torch.Tensor], path: Path, max_shard_bytes: int | None = None) -> None:
    """`state` as model.safetensors, or, above `max_shard_bytes`, as shards of whole tensors (sorted by
    name, each shard filled up to the bound) with model.safetensors.index.json; weight files already
    in `path` are removed first."""
    from safetensors.torch import save_file
    for old in [*path.glob("model*.safetensors"), path / SHARD_INDEX]:
        old.unlink(missing_ok=True)
    size = {k: t.numel() * t.element_size() for k, t in state.items()}
    if not max_shard_bytes or sum(size.values()) <= max_shard_bytes:
        save_file(state, str(path / "model.safetensors"))
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    filled = 0                                          # bytes in shards[-1]
    for k in sorted(state):
        if shards[-1] and filled + size[k] > max_shard_bytes:
            shards.append({})
            filled = 0
        shards[-1][k] = state[k]
        filled += size[k]
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        name = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(path / name))
        weight_map.update(dict.fromkeys(shard, name))
    (path / SHARD_INDEX).write_text(json.dumps({"metadata": {"total_size": sum(size.values())},
                                                "weight_map": weight_map}, indent=2))
