"""Settings: the controls of the settings panel, the presets, deployment caps, and the one function
that turns UI values or an API settings JSON into the `EngineConfig` of each compared method.

Contract: `SPECS` lists every tunable field of `EngineConfig` the page shows (dotted key, label,
range, help); the page builds its controls from it in a loop. `build_config(values, method)`
accepts dotted keys, the short aliases of `respec.config.ALIASES` and nested JSON objects, applies
the engine's device defaults (`respec.config.device_defaults`: small trees and `tree.auto` on a CPU),
or instead the engine preset a `"preset"` key names (`respec.config.PRESETS`, e.g. "paper"), under
the given values, the app's default of 64 new tokens and the deployment caps, and raises
`ConfigError` with one clear message for anything out of range. `env_int` / `env_float` are the
app's one way to read a number from the environment: always when used (never at import), and a bad
value falls back to the default with a warning instead of stopping the app. No I/O, no Gradio.

Letters follow ALGORITHMS.md: θ_H (trigger.theta_entropy), l, λ_e, α, S0, θ_score, K, L_max, L_min,
β, τ, w.
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from respec.config import EngineConfig, flatten_settings, starting_settings
from respec.errors import ConfigError, PromptError


# ------------------------------------------------------------------------------- the environment
def _env_number(name: str, default: float, cast: Callable[[str], float], minimum: float) -> float:
    """A number from the environment, at least `minimum`; the default (with a warning naming the
    variable) when unset, empty or not a number. Never raises: a bad value must not stop the app."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return max(minimum, cast(raw))
    except ValueError:
        kind = "an integer" if cast is int else "a number"
        logging.getLogger("respec.app").warning("%s=%r is not %s; using %s", name, raw, kind, default)
        return default


def env_int(name: str, default: int) -> int:
    """A positive integer from the environment (the default when unset or not a number)."""
    return int(_env_number(name, default, int, 1))


def env_float(name: str, default: float) -> float:
    """A non-negative number from the environment (the default when unset or not a number)."""
    return float(_env_number(name, default, float, 0.0))


# ------------------------------------------------------------------------------- deployment caps
@dataclass(frozen=True)
class Caps:
    """Limits of this deployment, from the environment (read when the page is built)."""
    max_new_tokens: int          # RESPEC_MAX_NEW_TOKENS: hard cap on generated tokens per run
    default_new_tokens: int      # RESPEC_DEFAULT_NEW_TOKENS: what "{}" and the page start with
    max_tree_tokens: int         # RESPEC_MAX_TREE_TOKENS: cap on any draft tree / chain size
    time_limit_s: int            # RESPEC_TIME_LIMIT: per-event time limit (seconds)
    queue_size: int              # RESPEC_QUEUE_SIZE: waiting requests before "queue full"
    max_prompt_chars: int = 20_000   # RESPEC_MAX_PROMPT_CHARS: longer prompts are refused before tokenizing
    max_prompt_tokens: int = 2048    # RESPEC_MAX_PROMPT_TOKENS: cap on the encoded prompt (chat template included)

    @classmethod
    def from_env(cls) -> Caps:
        cap = env_int("RESPEC_MAX_NEW_TOKENS", 512)
        return cls(max_new_tokens=cap, default_new_tokens=min(cap, env_int("RESPEC_DEFAULT_NEW_TOKENS", 64)),
                   max_tree_tokens=env_int("RESPEC_MAX_TREE_TOKENS", 128),
                   time_limit_s=env_int("RESPEC_TIME_LIMIT", 600), queue_size=env_int("RESPEC_QUEUE_SIZE", 16),
                   max_prompt_chars=env_int("RESPEC_MAX_PROMPT_CHARS", 20_000),
                   max_prompt_tokens=env_int("RESPEC_MAX_PROMPT_TOKENS", 2048))

    def check_prompt(self, prompt: Any) -> None:
        """Refuse a prompt longer than this deployment allows, before any work (PromptError)."""
        if isinstance(prompt, str):
            n = len(prompt)
        elif isinstance(prompt, (list, tuple)):
            n = sum(len(m.get("content", "")) for m in prompt if isinstance(m, dict) and isinstance(m.get("content"), str))
        else:
            return
        if n > self.max_prompt_chars:
            raise PromptError(f"The prompt is {n:,} characters long; this deployment takes at most "
                              f"{self.max_prompt_chars:,} (RESPEC_MAX_PROMPT_CHARS).")


# ------------------------------------------------------------------------------- controls
@dataclass(frozen=True)
class Spec:
    key: str          # dotted EngineConfig key
    label: str
    section: str
    minimum: float
    maximum: float
    step: float
    help: str

    @property
    def integer(self) -> bool:
        return float(self.step).is_integer()


SECTIONS = ("Run", "EAGLE-2 tree", "ReSpec · when (entropy trigger)", "ReSpec · what (candidates)",
            "ReSpec · how (relaxed verification)", "SAM-Decoding", "SuffixDecoding")

SPECS: tuple[Spec, ...] = (
    Spec("max_new_tokens", "max new tokens", "Run", 1, 512, 1,
         "Tokens to generate per method (capped by the deployment)."),
    Spec("sampling.temperature", "temperature", "Run", 0.0, 2.0, 0.05,
         "0 = greedy with strict verification (output equals vanilla); > 0 = lossless speculative sampling."),
    Spec("sampling.seed", "seed", "Run", 0, 2**31 - 1, 1,
         "Seeds the one random generator of a run; stored in the trace."),
    Spec("tree.total_tokens", "total tokens", "EAGLE-2 tree", 1, 128, 1,
         "Root + draft nodes kept after EAGLE-2's global re-rank (paper: 60; a 2-core CPU wants 8-16); "
         "the maximum when auto is on."),
    Spec("tree.depth", "depth", "EAGLE-2 tree", 0, 12, 1,
         "Expansion rounds; the deepest draft token sits at depth + 1."),
    Spec("tree.top_k", "top-k", "EAGLE-2 tree", 1, 16, 1,
         "Children per expanded node and frontier width."),
    Spec("trigger.theta_entropy", "θ_H (nats)", "ReSpec · when (entropy trigger)", 0.0, 8.0, 0.05,
         "Retrieve iff the mean entropy H̄ of the chosen recent window is ≤ θ_H."),
    Spec("trigger.window", "l (window)", "ReSpec · when (entropy trigger)", 1, 8, 1,
         "Look back over at most l committed tokens' entropies."),
    Spec("trigger.lambda_e", "λ_e", "ReSpec · when (entropy trigger)", 0.0, 5.0, 0.05,
         "Penalty for short windows: k* = argmin_k H̄_k + λ_e / k."),
    Spec("candidates.alpha", "α (EMA rate)", "ReSpec · what (candidates)", 0.0, 1.0, 0.05,
         "S ← (1 − α)·S + α·R, R = accepted / proposed from that position."),
    Spec("candidates.s0", "S0 (initial score)", "ReSpec · what (candidates)", 0.0, 1.0, 0.05,
         "Score of a position never drafted from before."),
    Spec("candidates.theta_score", "θ_score", "ReSpec · what (candidates)", 0.0, 1.0, 0.05,
         "Only positions with S ≥ θ_score may draft; none qualifies → EAGLE-2 tree."),
    Spec("candidates.top_k", "K (positions)", "ReSpec · what (candidates)", 1, 16, 1,
         "Best-scored positions merged into one retrieval trie."),
    Spec("candidates.l_max", "L_max", "ReSpec · what (candidates)", 1, 64, 1,
         "Draft length per position = max(1, round(L_max · S))."),
    Spec("candidates.min_match", "L_min", "ReSpec · what (candidates)", 1, 16, 1,
         "Minimum suffix match length for retrieval to be considered."),
    Spec("candidates.tree_budget", "trie budget", "ReSpec · what (candidates)", 1, 128, 1,
         "Nodes of the retrieval trie, root included."),
    Spec("candidates.max_positions", "positions examined", "ReSpec · what (candidates)", 1, 256, 1,
         "Earlier match positions examined per step."),
    Spec("candidates.memory_tokens", "memory (tokens)", "ReSpec · what (candidates)", 0, 8192, 64,
         "Also retrieve from earlier answers (this deployment's runs, a Lab run's earlier questions), the "
         "newest within this many tokens; 0 = this request only (default)."),
    Spec("relax.beta", "β (top-β)", "ReSpec · how (relaxed verification)", 1, 50, 1,
         "A relaxed token must be in the target's top-β."),
    Spec("relax.tau", "τ (nats)", "ReSpec · how (relaxed verification)", 0.0, 10.0, 0.1,
         "…and within τ nats of the target's top-1 log-prob."),
    Spec("relax.lookahead", "w (look-ahead)", "ReSpec · how (relaxed verification)", 0, 8, 1,
         "…and the next w draft tokens must then match the target exactly."),
    Spec("relax.budget", "budget", "ReSpec · how (relaxed verification)", 0, 8, 1,
         "Relaxed acceptances allowed per step; 0 = lossless (strict everywhere)."),
    Spec("sam.len_threshold", "match threshold", "SAM-Decoding", 1, 16, 1,
         "SAM retrieves when the suffix match is at least this long."),
    Spec("sam.n_predicts", "chain length", "SAM-Decoding", 1, 64, 1,
         "Tokens copied per retrieval chain."),
    Spec("suffix.max_depth", "max depth", "SuffixDecoding", 1, 64, 1,
         "Most tokens a suffix draft holds (the library's max_spec_tokens)."),
    Spec("suffix.spec_factor", "spec factor", "SuffixDecoding", 0.0, 8.0, 0.1,
         "Adaptive length: at most spec factor × match length + offset tokens."),
    Spec("suffix.spec_offset", "spec offset", "SuffixDecoding", -8.0, 32.0, 0.5,
         "…plus this many (may be negative)."),
    Spec("suffix.min_prob", "min token prob", "SuffixDecoding", 0.0, 1.0, 0.01,
         "Draft tokens whose estimated probability falls below this are left out."),
    Spec("suffix.tree", "tree drafts (0/1)", "SuffixDecoding", 0, 1, 1,
         "1 = branching drafts (use_tree_spec), 0 = one chain."),
    Spec("suffix.global_cache", "global cache (0/1)", "SuffixDecoding", 0, 1, 1,
         "1 = earlier requests' answers are a second source (kept across a Lab run's questions and "
         "this deployment's runs), 0 = this request only."),
)

SPEC_BY_KEY = {s.key: s for s in SPECS}

#: App-level keys accepted in settings next to the EngineConfig keys (true / false).
APP_KEYS = ("include_vanilla",)
#: The app-level key naming the method of the left compare column (default "respec"), and its
#: choices: a ReSpec variant or one of the retrieval peers, always against EAGLE-2 on the right.
COLUMN_A_KEY = "column_a"
COLUMN_A_METHODS = ("respec", "respec-strict", "respec-no-gate", "respec-no-feedback", "respec-no-model", "sam",
                    "suffix")
#: The settings key that names an engine preset (respec.config.PRESETS) to start from instead of
#: the device defaults: `{"preset": "paper", "theta_H": 2}`.
PRESET_KEY = "preset"
#: Tree sizes the deployment cap (RESPEC_MAX_TREE_TOKENS) bounds.
TREE_SIZE_KEYS = ("tree.total_tokens", "candidates.tree_budget", "sam.n_predicts")

#: The page's presets: "paper defaults" is the engine's "paper" preset (one definition: the
#: paper's thresholds and EAGLE-2's fixed 60/5/10 tree, tree.auto off); the others are overrides
#: over the device defaults.
PRESETS: dict[str, dict[str, Any]] = {
    "device defaults": {},
    "paper defaults": {PRESET_KEY: "paper"},
    "lossless": {"relax.budget": 0, "sampling.temperature": 0.0},
    "aggressive": {"trigger.theta_entropy": 3.0, "candidates.theta_score": 0.3, "candidates.s0": 0.6,
                   "candidates.l_max": 32, "candidates.top_k": 8, "candidates.min_match": 2,
                   "relax.budget": 4, "relax.beta": 10, "relax.tau": 3.0, "relax.lookahead": 1,
                   "sam.len_threshold": 3},
}
PRESET_HELP = {
    "device defaults": "The engine's defaults for this device (on CPU: small auto-pruned trees, θ_H 3, "
                       "L_min 2, L_max 32, chosen by the dev-split sweep in docs/benchmarks-history.md).",
    "paper defaults": "The paper's values (θ_H 1.5, window 3, L_min 3, L_max 16, S0 = θ_score 0.5, α 0.3) with "
                      "EAGLE-2's fixed 60-node tree (depth 5, top-k 10) and the cost model off: slow on a CPU.",
    "lossless": "Relaxed budget 0 and greedy: ReSpec's output equals vanilla's token for token.",
    "aggressive": "Retrieve more often, draft longer, relax more: faster on repetitive text, may drift.",
}


#: The compare view's columns in display order, and the method each runs in a compare (a replayed
#: trace may hold another there, e.g. SAM-Decoding in the ReSpec column).
COLUMN_METHODS: dict[str, str] = {"respec": "respec", "eagle": "eagle2", "vanilla": "vanilla"}


def method_label(method: str) -> str:
    """A method's name on the page ("EAGLE-2", "ReSpec (strict)", ...; unknown methods as they are)."""
    return {"respec": "ReSpec", "respec-strict": "ReSpec (strict)", "respec-no-gate": "ReSpec (no gate)",
            "respec-no-feedback": "ReSpec (no feedback)", "respec-no-model": "ReSpec (no model)",
            "respec-no-trigger": "ReSpec (SAM trigger, legacy)", "respec-no-ema": "ReSpec (earliest only, legacy)",
            "sam": "SAM-Decoding", "suffix": "SuffixDecoding", "eagle2": "EAGLE-2",
            "vanilla": "vanilla"}.get(method, method)


# ------------------------------------------------------------------------------- values <-> config
def parse_settings_json(text: str | None) -> dict[str, Any]:
    """Settings JSON (API) -> flat dict. Empty / "{}" means defaults. Raises ConfigError."""
    if text is None or not str(text).strip():
        return {}
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"settings_json is not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    if not isinstance(data, Mapping):
        raise ConfigError(f"settings_json must be a JSON object like {{\"theta_H\": 1.5}}, got {type(data).__name__}")
    flat = flatten_settings(data)
    if "method" in flat:
        raise ConfigError("settings_json cannot choose the method: /compare always runs ReSpec and EAGLE-2 "
                          "(and vanilla with \"include_vanilla\": true)")
    if PRESET_KEY in flat:
        _preset_name(flat[PRESET_KEY])
    return flat


def _preset_name(value: Any) -> str:
    """A `"preset"` value checked against the engine's presets (ConfigError naming the choices)."""
    starting_settings("cpu", value)
    return value


def _as_bool(key: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false", "1", "0", "yes", "no"):
        return value.strip().lower() in ("true", "1", "yes")
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    raise ConfigError(f"setting {key!r} must be true or false, got {value!r}")


def split_app_options(values: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Separate app-level keys (include_vanilla, column_a, preset) from EngineConfig keys."""
    flat = flatten_settings(values)
    flat.pop("method", None)            # the page chooses each column's method
    app: dict[str, Any] = {k: _as_bool(k, flat.pop(k)) for k in APP_KEYS if k in flat}
    if COLUMN_A_KEY in flat:
        method = flat.pop(COLUMN_A_KEY)
        if method not in COLUMN_A_METHODS:
            raise ConfigError(f"{COLUMN_A_KEY} {method!r} is not a method the left column runs; choose one of "
                              f"{', '.join(COLUMN_A_METHODS)}")
        app[COLUMN_A_KEY] = method
    if PRESET_KEY in flat:
        app[PRESET_KEY] = _preset_name(flat.pop(PRESET_KEY))
    return flat, app


def device_type(device: str) -> str:
    return "cuda" if str(device).startswith("cuda") else "cpu"


def base_values(device: str = "cpu", preset: str | None = None) -> dict[str, Any]:
    """The app's starting point: the engine's device defaults (small trees and `tree.auto` on a
    CPU), or the named engine preset instead (respec.config.starting_settings)."""
    return dict(starting_settings(device_type(device), preset))


def build_config(values: Mapping[str, Any], method: str, device: str = "cpu", caps: Caps | None = None) -> EngineConfig:
    """UI values / API settings -> the EngineConfig of one method. Raises ConfigError.
    Order: device defaults (or the preset a "preset" key names), then the given values (explicit
    settings always win), then the app's default max_new_tokens if none was given; then the
    deployment caps."""
    caps = caps or Caps.from_env()
    flat, app = split_app_options(values)
    flat = {**base_values(device, app.get(PRESET_KEY)), **flat}
    flat.setdefault("max_new_tokens", caps.default_new_tokens)
    # 1. Validate everything (ranges, unknown keys, types) through the engine's own config.
    config = EngineConfig().with_overrides({**flat, "method": method})
    # 2. Deployment caps, stricter than the engine's.
    if config.max_new_tokens > caps.max_new_tokens:
        raise ConfigError(f"max_new_tokens {config.max_new_tokens} is above this deployment's cap of "
                          f"{caps.max_new_tokens} (RESPEC_MAX_NEW_TOKENS)")
    for key, value in (("tree.total_tokens", config.tree.total_tokens),
                       ("candidates.tree_budget", config.candidates.tree_budget),
                       ("sam.n_predicts", config.sam.n_predicts)):
        if value > caps.max_tree_tokens:
            raise ConfigError(f"{key} {value} is above this deployment's cap of {caps.max_tree_tokens} "
                              f"tree tokens (RESPEC_MAX_TREE_TOKENS)")
    return config


def preset_values(name: str, device: str = "cpu", caps: Caps | None = None) -> dict[str, Any]:
    """Every control's value (and tree.auto) under a preset, on this device."""
    if name not in PRESETS:
        raise ConfigError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    caps = caps or Caps.from_env()
    values = dict(PRESETS[name])
    if PRESET_KEY in values:            # an engine preset's tree sizes, within this deployment's cap
        start = base_values(device, values[PRESET_KEY])
        values.update({k: min(start[k], caps.max_tree_tokens) for k in TREE_SIZE_KEYS if k in start})
    config = build_config(values, "eagle2", device, caps)
    flat = flatten_settings(config.to_dict())
    return {k: flat[k] for k in [s.key for s in SPECS] + ["tree.auto"]}


def non_default(values: Mapping[str, Any], device: str = "cpu", caps: Caps | None = None) -> dict[str, Any]:
    """The settings that differ from the app's defaults on this device: what a user pastes into
    `settings_json` to reproduce the page's settings."""
    base = preset_values("device defaults", device, caps)
    flat, _app = split_app_options(values)
    out = {k: v for k, v in flat.items() if k in base and not _num_eq(base[k], v)}
    for k, v in out.items():
        spec = SPEC_BY_KEY.get(k)
        if spec is not None and spec.integer and isinstance(v, float) and v.is_integer():
            out[k] = int(v)
    return out


def _num_eq(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return bool(a) == bool(b)
    try:
        return abs(float(a) - float(b)) < 1e-9
    except (TypeError, ValueError):
        return a == b
