"""The shared model: one target and its Runner for the whole process, loaded lazily behind a lock.

Contract: `ModelHub` never loads at import or construction; `runner(spec)` loads on first use and
raises `ModelLoadError` (the cause, one line, also kept in `load_error` for the page banner) when
the model cannot be loaded, so the app keeps serving in replay mode. Models are offered as "MODEL"
or "MODEL=HEAD" (RESPEC_MODELS entries, respec.runner.ModelChoice); `model_fits` keeps out models
too big for this machine, `choice_label` names each with its EAGLE head for the picker.
RESPEC_MODELS and RESPEC_MODEL are read when a hub is made; a malformed value is ignored with a
warning (the app then offers the default model) rather than stopping the app. Without
RESPEC_MODELS the picker offers the default model and every built-in model already fetched
(`python -m respec fetch qwen2.5-coder-1.5b`), so choosing one never starts a 1 GB download
that would hold the model lock for every user; RESPEC_MODEL=qwen2.5-coder-1.5b makes it the
start-up model (a Space's variable; fetched on its first load, or at start with `preload`).

The target holds one KV cache, so two runs must never interleave: every target forward of a run
goes through `next_step(run_id, ...)` under a lock, and a newer run (`begin_run`) supersedes older
ones. No lock is held while a handler yields.

RESPEC_COMPILE=on: after a load the hub starts `Runner.compile_later` (a background thread, at
load on ZeroGPU) with `wait_idle` as its pause, so the compile sleeps while requests run
(`IDLE_BEFORE_COMPILING_S` after their last step) instead of starving them of the GIL, and the
compiled forward is installed under the step lock; `compile_note()` tells the status line.

ZeroGPU: `preload()` loads the model at start-up in the main process; a failure leaves the app in
replay mode (banner) instead of crashing the Space. Every GPU call runs in a fresh worker, so what
a call computes is lost at its end: `no_relax_ids` (a pure tokenizer scan) is computed at start-up
and inherited; the verify-cost curve needs the GPU and is re-measured in each call; only the
start-up model is offered (another would be reloaded in every call).
"""
from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from respec import models
from respec.config import check_compile_choice
from respec.errors import ConfigError, ModelLoadError, RespecError
from respec.runner import (ModelChoice, Runner, builtin_model, fetched_builtin_models, parse_model_choices,
                           release_memory)

log = logging.getLogger("respec.app")

#: Seconds without a run step before the background compile goes on with its next shape.
IDLE_BEFORE_COMPILING_S = 5.0

#: Approximate bf16 footprint (GB) of the default model; the built-in ones carry theirs
#: (respec.runner.builtin_model), others are sized from their files.
KNOWN_MODEL_GB = {"default": 0.3}


def model_fits(spec: str) -> bool:
    """Whether a model can be held here: its estimated bf16 size (known table; a local directory's
    weight files; a .gguf x 3 for dequantisation) within 80% of the free memory of the device it
    would run on. Hub ids of unknown size are kept (their size cannot be known offline). A
    "MODEL=HEAD" spec is sized by its model."""
    spec = ModelChoice.parse(spec).model
    p = Path(spec)
    if spec in KNOWN_MODEL_GB:
        gb = KNOWN_MODEL_GB[spec]
    elif builtin_model(spec) is not None:
        gb = builtin_model(spec).bf16_gb
    elif p.is_dir():
        gb = sum(f.stat().st_size for f in p.glob("*") if f.suffix in (".safetensors", ".bin")) / 1e9
    elif p.suffix == ".gguf" and p.is_file():
        gb = 3 * p.stat().st_size / 1e9
    else:
        return True
    try:
        import torch
        if torch.cuda.is_available():
            free = torch.cuda.mem_get_info()[0] / 1e9
        else:
            import psutil
            free = psutil.virtual_memory().available / 1e9
    except Exception:  # noqa: BLE001 - no way to tell: offer it
        return True
    fits = gb <= 0.8 * free
    if not fits:
        log.warning("model %s (~%.1f GB) does not fit in %.1f GB free memory; not offered", spec, gb, free)
    return fits


class ModelHub:
    """One target model and its Runner for the whole process, loaded on first use (never at
    import), behind a lock.

    The target holds one KV cache, so two runs must never interleave. The queue already runs one
    engine event at a time (concurrency group "gpu"); on top of that every target forward of a run
    goes through `next_step(run_id, ...)` under a lock, and a newer run (`begin_run`) supersedes
    older ones: a run cancelled by Stop or a closed tab, whose thread may still be finishing a
    forward, stops at its next step instead of touching the cache again. No lock is held while a
    handler yields, so a cancelled run can never block the next one."""

    def __init__(self, spec: str | None = None, factory: Callable[[str], Any] | None = None,
                 choices: Sequence[str] | None = None) -> None:
        env_models = [str(c) for c in _from_env("RESPEC_MODELS", parse_model_choices, [])]
        offered = choices or env_models or ["default", *fetched_builtin_models()]
        self.choices = [m for m in offered if model_fits(m)] or ["default"]
        env_model = _from_env("RESPEC_MODEL", ModelChoice.parse, None)
        self.spec = str(ModelChoice.parse(spec or env_model or self.choices[0]))
        if self.spec not in self.choices:
            self.choices.insert(0, self.spec)
        self._factory = factory or _default_factory
        self._runner = None
        self._runner_spec: str | None = None
        self._load_lock = threading.Lock()
        self._step_lock = threading.Lock()
        self._owner = 0
        self._last_active = 0.0                # monotonic time of the last run step (wait_idle)
        self.load_error: str | None = None     # why the last load failed (shared: it is the model's state)
        self.per_call_workers = False          # ZeroGPU: each GPU call is a fresh worker (preload sets it)

    def preload(self, per_call_workers: bool = True) -> bool:
        """Load the start-up model now, in this (main) process, and whatever a GPU-call worker would
        otherwise recompute on every call (`no_relax_ids`); offer only this model (ZeroGPU). A load
        failure is recorded for the banner (replay mode), never raised. Returns whether it loaded."""
        self.per_call_workers = per_call_workers
        self.choices = [self.spec]
        try:
            runner = self.runner()
        except RespecError:
            return False                        # load_error is set: the page opens in replay mode
        no_relax = getattr(type(runner), "no_relax_ids", None)
        if isinstance(no_relax, functools.cached_property):
            runner.no_relax_ids                 # noqa: B018 - cached on the runner, inherited by workers
        return True

    def begin_run(self) -> int:
        """Start a run: it owns the target from now on (older runs stop at their next step)."""
        with self._step_lock:
            self._owner += 1
            self._last_active = time.monotonic()
            return self._owner

    def next_step(self, run_id: int, steps_iter):
        """One target forward of run `run_id` (raises StopIteration at the end, like next())."""
        with self._step_lock:
            if run_id != self._owner:
                raise RespecError("this run was superseded by a newer one")
            try:
                return next(steps_iter)
            finally:
                self._last_active = time.monotonic()

    @contextlib.contextmanager
    def exclusive(self):
        """Hold the model for one long unit of work (a Lab record): any other run's next step waits,
        and runs started before it stop at their next step."""
        with self._step_lock:
            self._owner += 1
            try:
                yield
            finally:
                self._last_active = time.monotonic()

    def _compile_pause(self, runner) -> None:
        """The background compile's pause for `runner`: wait_idle, or stop it (an error the compile
        thread logs) once another model has replaced `runner`."""
        if self._runner is not runner:
            raise RespecError("another model was loaded: this model's background compile stops")
        self.wait_idle()

    def wait_idle(self, idle_s: float = IDLE_BEFORE_COMPILING_S, poll_s: float = 0.5) -> None:
        """Return once no run has stepped for `idle_s` seconds and none holds the model: where the
        background compile (RESPEC_COMPILE=on) waits before each shape, so that it competes with
        requests for the CPU (and Python's GIL) as little as it can. A shape already compiling
        (tens of seconds on a CPU) is not interrupted."""
        while True:
            left = self._last_active + idle_s - time.monotonic()
            if left <= 0 and not self._step_lock.locked():
                return
            time.sleep(max(poll_s, left))

    @property
    def loaded(self) -> bool:
        return self._runner is not None

    def runner(self, spec: str | None = None):
        spec = spec or self.spec
        if spec not in self.choices:
            raise ConfigError(f"model {spec!r} is not offered here; choose one of {', '.join(self.choices)}")
        with self._load_lock:
            if self._runner is None or self._runner_spec != spec:
                if self._runner is not None:
                    release_memory()                     # its frozen objects collectable again (respec/runner.py)
                self._runner = None                      # free the old model before loading another
                t0 = time.perf_counter()
                try:
                    self._runner = self._factory(spec)
                except Exception as exc:  # noqa: BLE001 - any load failure leaves the app in replay mode
                    self.load_error = _load_failure(spec, exc)
                    log.warning("model %s failed to load: %s", spec, self.load_error, exc_info=not isinstance(exc, RespecError))
                    raise ModelLoadError(self.load_error) from None
                self._runner_spec = spec
                self.load_error = None
                if compile_setting() == "on":
                    # answers run eagerly until the compiled forward is installed between two steps;
                    # a ZeroGPU worker keeps nothing a background thread builds: compile at load there
                    self._last_active = time.monotonic()          # the request that loaded it runs next
                    self._runner.compile_later(self._step_lock, progress=True, background=not self.per_call_workers,
                                               pause=functools.partial(self._compile_pause, self._runner))
                log.info("loaded model %s in %.1f s (EAGLE head: %s)", spec, time.perf_counter() - t0,
                         getattr(self._runner, "head_info", "?"))
            return self._runner

    def banner(self) -> str:
        """The page banner while the model cannot be loaded ("" when all is well)."""
        if not self.load_error:
            return ""
        return (f"⚠ **The model could not be loaded**: {self.load_error}  \n"
                "The explorer is in **replay mode**: open a recorded trace or upload one under "
                "*Trace files*. Run tries loading the model again.")

    def compile_note(self) -> str:
        """What the status line adds while RESPEC_COMPILE=on's background compile is not done
        (Runner.compile_state), "" otherwise."""
        state = str(getattr(self._runner, "compile_state", "off"))
        if state == "compiling":
            return " · eager forward: the compiled one is being built in the background (minutes on a CPU)"
        if state.startswith("failed"):
            return " · eager forward: compiling failed (see the server log)"
        return ""

    @property
    def current_spec(self) -> str:
        """The model that is loaded (or, before any load, the start-up choice)."""
        return self._runner_spec or self.spec

    @property
    def tokenizer(self):
        return getattr(self._runner, "tokenizer", None) if self._runner is not None else None

    def device(self) -> str:
        if self._runner is not None:
            return str(self._runner.target.device)
        try:
            import torch
            return "cuda" if torch.cuda.is_available() else "cpu"
        except Exception:  # noqa: BLE001 - torch missing means CPU
            return "cpu"


def _from_env(name: str, parse: Callable[[str], Any], default: Any) -> Any:
    """An environment variable parsed, or `default` when it is unset, empty or malformed (with a
    warning naming the variable: a bad value must not stop the app)."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return parse(raw)
    except ConfigError as exc:
        log.warning("%s=%r is ignored: %s", name, raw, exc)
        return default


def _load_failure(spec: str, exc: BaseException) -> str:
    """One line naming the model and the cause (our message as is; others with their type)."""
    msg = str(exc) if isinstance(exc, RespecError) else f"{type(exc).__name__}: {exc}"
    msg = " ".join(msg.split())[:500]
    return msg if spec in msg else f"{spec}: {msg}"


def _default_factory(spec: str):
    """"MODEL" or "MODEL=HEAD" -> a Runner (the head: a directory or a Hub id; none = the Runner's default)."""
    choice = ModelChoice.parse(spec)
    # Runner.engine measures tree.auto's cost curve outside run timing; ModelHub.runner compiles
    return Runner(models.load_target(choice.model), head=choice.head)   # looked up per call: tests swap it


def compile_setting() -> str:
    """RESPEC_COMPILE: "on" compiles each loaded model's forward and EAGLE head
    (respec/accel/compiled.py: minutes on a CPU) in the background while the model serves eagerly
    (`Runner.compile_later`; at load on ZeroGPU), "off" (the default, and for a malformed value,
    with a warning) keeps the eager forward."""

    def parse(raw: str) -> str:
        try:
            return check_compile_choice(raw)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    return _from_env("RESPEC_COMPILE", parse, "off")


def choice_label(spec: str) -> str:
    """The model picker's label for a choice: the model and the EAGLE head it runs with."""
    choice = ModelChoice.parse(spec)
    return f"{choice.model} · {choice.head_label()}"

