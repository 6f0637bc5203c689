"""High-level helpers shared by the CLI, the benchmark and the app: build an engine for a method on
a loaded target, choose its EAGLE head, and run a text prompt to a GenerationResult with metadata.

Contract: `Runner(target, head_spec)` owns one target and one EAGLE head and builds a fresh drafter
per request (drafter state never leaks between requests; the target's KV cache is reset by every
prefill). The EAGLE head is: an explicit checkpoint (a directory, or a Hugging Face Hub id fetched
where the Hub is reachable) if given, else the head shipped in assets/ for the default model or a
built-in one (`shipped_head_dir`, respec/models/builtin.py) if present, else a seeded random head
(lossless, accepts little), and `head_info` says which. `builtin_model(spec)` and
`fetched_builtin_models()` tell the app which built-in models exist and which are already cached.

Model-head pairs: `ModelChoice.parse("MODEL=HEAD")` (each side a Hub id or a local path; "=HEAD"
optional) is how RESPEC_MODELS entries and the app's model picker name a target with its head.

`compile_later(lock)` compiles the target's forward and the head in a background thread, on a twin
target over the same weights (`HFTarget.twin`), while this runner keeps serving eagerly, then
installs the graphs between two steps (under `lock`, the app's step lock); `compile_state` says
where that stands and every result's meta says which forward ran ("forward"). What it buys: the
app's first answer does not wait minutes of compiling (respec/accel/compiled.py).

Once a runner is built and after each compile it installs, the objects alive are frozen out of the
garbage collector's full passes (respec/accel/heap.py `settle`), which otherwise stall a request at
random (~0.2 s eager, over 1 s with compiled graphs).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import platform
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
import transformers

from respec.config import METHODS, EngineConfig, device_defaults
from respec.cost import cost_max_size
from respec.drafters import make_drafter
from respec.drafters.heads.checkpoint import load_eagle_head
from respec.drafters.heads.eagle import random_head
from respec.engine import Engine
from respec.errors import ConfigError
from respec.memory import RunnerMemory
from respec.models.builtin import is_cached
from respec.models.names import ASSETS, BUILTIN_MODELS, DEFAULT_HEAD, builtin_model
from respec.prompting import encode_prompt
from respec.stream import RunStream
from respec.trace import GenerationResult

try:     # the speed machinery is optional: without respec.accel the runner serves eagerly
    from respec.accel import heap
    from respec.accel.head_compile import adopt_compiled_head, compile_head, compile_head_for
except ImportError:
    heap = adopt_compiled_head = compile_head = compile_head_for = None

log = logging.getLogger("respec")


def settle_memory() -> None:
    """The objects alive now out of the garbage collector's full passes (respec/accel/heap.py
    `settle`; nothing without respec.accel): after a model's load or compile."""
    if heap is not None:
        heap.settle()


def release_memory() -> None:
    """Before a model is dropped (the app's model switch): what `settle_memory` froze becomes
    collectable again (respec/accel/heap.py `release`)."""
    if heap is not None:
        heap.release()

DEFAULT_HEAD_DIR = ASSETS / "eagle" / DEFAULT_HEAD


def fetched_builtin_models() -> list[str]:
    """Names of the built-in models (respec/models/names.py `BUILTIN_MODELS`) already in the cache, so
    offering one costs no download (`python -m respec fetch NAME` puts one there)."""
    return [name for name, model in BUILTIN_MODELS.items() if is_cached(model)]


def shipped_head_dir(spec: str) -> Path | None:
    """The EAGLE head shipped in assets/ for a model spec ("default" or a built-in model's name), when
    its folder holds one; None for any other spec."""
    builtin = builtin_model(spec)
    folder = DEFAULT_HEAD_DIR if spec == "default" else builtin.head_dir if builtin is not None else None
    return folder if folder is not None and (folder / "config.json").is_file() else None


@dataclass(frozen=True)
class ModelChoice:
    """A target model and, optionally, its EAGLE head: "MODEL" or "MODEL=HEAD", each side a Hub id
    or a local path (MODEL may also be "default" or a .gguf). Without a head the Runner's default
    applies (the shipped head for "default", else a random one)."""
    model: str
    head: str | None = None

    @classmethod
    def parse(cls, text: str) -> "ModelChoice":
        """"m" or "m=h" -> ModelChoice (whitespace stripped); ConfigError for an empty side. The first
        "=" splits (Hub ids never contain one)."""
        model, sep, head = str(text).strip().partition("=")
        model, head = model.strip(), head.strip()
        if not model or (sep and not head):
            raise ConfigError(f"model entry {text!r} is not MODEL or MODEL=HEAD (e.g. "
                              "'lmsys/vicuna-7b-v1.3=yuhuili/EAGLE-Vicuna-7B-v1.3')")
        return cls(model, head or None)

    def __str__(self) -> str:
        return self.model if self.head is None else f"{self.model}={self.head}"

    def head_label(self) -> str:
        """Which EAGLE head a Runner will use for this choice, in words (before loading anything)."""
        if self.head:
            return f"EAGLE head {self.head}"
        if shipped_head_dir(self.model) is not None:
            return "shipped EAGLE head"
        return "random EAGLE head (none given)"


def parse_model_choices(text: str) -> list[ModelChoice]:
    """"a, b=h, c" (RESPEC_MODELS) -> ModelChoices in order, duplicates dropped; ConfigError if malformed."""
    items = [ModelChoice.parse(t) for t in str(text).split(",") if t.strip()]
    return list(dict.fromkeys(items))


class Runner:
    def __init__(self, target, head: str | None = None) -> None:
        self.target = target
        self.tokenizer = target.tokenizer
        self.memory = RunnerMemory()           # suffix trees and earlier answers across this runner's requests
        spec = target.loaded.spec if target.loaded is not None else ""
        if head:
            self.head = load_eagle_head(head, target)       # a directory, or a Hub id (resolve_head_dir)
            self.head_info = f"checkpoint {head}"
        elif (shipped := shipped_head_dir(spec)) is not None:
            self.head = load_eagle_head(shipped, target)
            self.head_info = f"shipped {shipped.relative_to(ASSETS.parent)}"
        else:
            self.head = random_head(target, seed=0)
            self.head_info = "random (untrained; lossless but accepts little)"
        # "off" | "on" | "compiling" (compile_later) | "failed: <why>" (serving stays eager)
        self.compile_state = "off"
        if target.describe_forward().compiled:     # pay the head's compiles at load, not in a first request
            self._compile_head(progress=True)
        settle_memory()                            # the model's objects out of the collector's passes

    def compile_later(self, lock=None, progress: bool = False, background: bool = True,
                      pause: Callable[[], None] | None = None) -> threading.Thread | None:
        """Compile the target's forward and the EAGLE head (see the module docstring) and return the
        background thread doing it; None when there is nothing to do (already compiled or
        compiling) or when it compiled in place: under `lock`, before this returns, when
        `background` is off or the head reads layer inputs (EAGLE-3: it shares the target's hooks).
        A failed background compile is logged and recorded in `compile_state`; the runner keeps its
        eager forward. The background thread runs at a lower OS priority (nice +10, Linux) and
        calls `pause` before each warm-up shape (the app waits there while requests run)."""
        if self.compile_state in ("on", "compiling"):
            return None
        guard = lock if lock is not None else contextlib.nullcontext()
        if self.head.feature_layers is not None or not background:
            with guard:
                self._compile_in_place(progress)
            return None
        self.compile_state = "compiling"
        thread = threading.Thread(target=self._compile_twin, args=(lock, progress, pause), name="respec-compile",
                                  daemon=True)
        thread.start()
        return thread

    def _compile_in_place(self, progress: bool) -> None:
        self.target.enable_compile(progress=progress)
        self._compile_head(progress)
        settle_memory()

    def _compile_head(self, progress: bool) -> None:
        """The head's compiles for the (compiled) target, and the target's graphs that return layer
        inputs when the head reads them (EAGLE-3)."""
        compile_head(self.head, self.target, progress=progress)
        if self.head.feature_layers is not None:
            self.target.use_features(self.head.feature_layers)
        self.compile_state = "on"

    def _compile_twin(self, lock, progress: bool, pause) -> None:
        t0 = time.perf_counter()
        with contextlib.suppress(AttributeError, OSError):      # this thread only (Linux); serving goes first
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
        if lock is not None and pause is not None:
            sys.settrace(_yield_while_locked(lock, pause))       # this thread only
        guard = lock if lock is not None else contextlib.nullcontext()
        try:
            twin = self.target.twin()
            twin.enable_compile(progress=progress, pause=pause)
            head = compile_head_for(self.head, twin, progress=progress, pause=pause)
            sys.settrace(None)                 # before taking the lock the trace function watches
            with guard:                        # between two steps of whatever runs
                self.target.adopt_compiled(twin)
                adopt_compiled_head(self.head, head, self.target)
                settle_memory()                  # the graphs' objects, before the next step runs
        except Exception as exc:  # noqa: BLE001 - serving goes on eagerly; the cause is logged and kept
            self.compile_state = f"failed: {type(exc).__name__}: {exc}"
            log.warning("compiling %s's forward failed; it stays eager: %s", self.target.name, exc, exc_info=True)
            return
        finally:
            sys.settrace(None)
        self.compile_state = "on"
        log.info("compiled %s's forward and EAGLE head in the background in %.0f s", self.target.name,
                 time.perf_counter() - t0)

    def config(self, overrides: dict | None = None, **settings) -> EngineConfig:
        """EngineConfig for this target's device: device defaults (respec.config.device_defaults),
        then `overrides` (dotted keys or aliases, as from the CLI / app settings JSON), then keyword
        settings (aliases or top-level names: `runner.config(method="sam", max_new_tokens=64)`)."""
        base = EngineConfig().with_overrides(device_defaults(self.target.device.type))
        return base.with_overrides({**dict(overrides or {}), **settings})

    @functools.cached_property
    def no_relax_ids(self) -> frozenset[int]:
        """Tokens the relaxed rule never accepts or overrides: special tokens and digit-only tokens."""
        ids = set(self.target.eos_token_ids)
        tok = self.tokenizer
        if tok is not None:
            ids.update(int(i) for i in tok.all_special_ids)
            pieces = tok.convert_ids_to_tokens(list(range(len(tok))))
            for i, p in enumerate(pieces):
                text = (p or "").lstrip("Ġ▁ ")
                if text and text.isdigit():
                    ids.add(i)
        return frozenset(ids)

    def engine(self, config: EngineConfig) -> Engine:
        if config.tree.auto and config.method != "vanilla":
            # measured once per target and size, here rather than inside the first timed run
            self.target.verify_cost_curve(max_size=cost_max_size(config))
        drafter = make_drafter(config.method, self.target, config, head=self.head, memory=self.memory)
        return Engine(self.target, drafter, config, tokenizer=self.tokenizer, no_relax_ids=self.no_relax_ids)

    def encode(self, prompt: str | list[dict], chat: bool = True, max_tokens: int | None = None) -> list[int]:
        """Prompt -> ids; PromptError if empty, not text, or over `max_tokens` (a deployment cap)."""
        return encode_prompt(self.tokenizer, prompt, chat=chat, max_tokens=max_tokens)

    def meta(self, config: EngineConfig, prompt: str | list[dict] | None = None) -> dict:
        loaded = self.target.loaded
        forward = self.target.describe_forward()
        return {"model": self.target.name if loaded is None else loaded.name,
                "model_source": "" if loaded is None else str(loaded.source),
                "device": str(self.target.device), "dtype": str(self.target.dtype).replace("torch.", ""),
                "eagle_head": self.head_info, "forward": forward.mode, "linear_layout": forward.linear_layout,
                "head_output_layer": self.head.output_layer_routes(),
                "static_buckets": list(forward.static_buckets), "eager_from_rows": forward.eager_from_rows,
                "method": config.method, "seed": config.sampling.seed,
                "prompt": prompt, "torch": torch.__version__, "transformers": transformers.__version__,
                "python": platform.python_version()}

    def generate(self, prompt: str | list[dict], config: EngineConfig | None = None, chat: bool = True,
                 **settings) -> GenerationResult:
        """Run one prompt. Without `config`, the device defaults plus keyword `settings`
        (`runner.generate(text, method="sam", max_new_tokens=64)`); an explicit EngineConfig is
        used as given (build it with `runner.config(...)` to keep the device defaults)."""
        if config is None:
            config = self.config(**settings)
        elif settings:
            config = config.with_overrides(settings)
        ids = self.encode(prompt, chat=chat)
        result = self.engine(config).generate(ids)
        result.meta.update(self.meta(config, prompt))
        self.memory.answers.add(result.tokens)
        return result

    def stream(self, prompt: str | list[dict], config: EngineConfig, chat: bool = True,
               max_prompt_tokens: int | None = None) -> RunStream:
        """One prompt's run as a `RunStream` (respec/stream.py): iterate it for the steps as they
        come, `partial()` for the result so far, `result` once exhausted, with the metadata
        `generate` gives; a run streamed to its end joins the earlier answers (`memory`). Encoding
        happens here (PromptError now); the prefill runs at the first step."""
        ids = self.encode(prompt, chat=chat, max_tokens=max_prompt_tokens)

        def finish(result: GenerationResult) -> None:
            result.meta.update(self.meta(config, prompt))
            self.memory.answers.add(result.tokens)
        return RunStream(self.engine(config), ids, finish)


def _yield_while_locked(lock, pause: Callable[[], None]):
    """A trace function for the background compile's thread: at each Python call it makes, while
    `lock` is held (a step of a request is running), it calls `pause` (which sleeps, releasing the
    GIL, until the model is idle). Without it the compile, pure Python for minutes, holds the GIL:
    beside it the app's respec answered at 0.7 tok/s, and beside a spinning pure-Python thread an
    eager one-token forward of the default model took 6,054 ms instead of 36.9 ms (2-core Intel
    Xeon, commit f9a8ce1 of 2026-12-03, throwaway scripts; BENCHMARKS.md). With it the compile takes longer (a
    trivial trace function cost the tiny model's compile 60%)."""
    locked = lock.locked

    def trace(frame, event, arg):
        if locked():
            pause()
        return None
    return trace


def parse_methods(text: str | Sequence[str], allowed: Sequence[str] | None = None) -> list[str]:
    """"a,b" or a list -> method names in order without duplicates, each one of `allowed` (default:
    the engine's methods). Raises ConfigError."""
    allowed = tuple(allowed or METHODS)
    items = [m.strip() for m in (text.split(",") if isinstance(text, str) else text) if m.strip()]
    if not items:
        raise ConfigError("no methods given")
    for m in items:
        if m not in allowed:
            raise ConfigError(f"unknown method {m!r}; choose from {', '.join(allowed)}")
    return list(dict.fromkeys(items))
