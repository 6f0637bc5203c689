"""Engine configuration: frozen, validated dataclasses, no I/O.

One `EngineConfig` object describes a run completely (method, stopping, sampling, and every threshold
of every drafter), so the UI, the CLI, the benchmark and the trace file all serialise the same thing.
Out-of-range values raise `ConfigError` at construction with a message naming the field, its allowed
range and the value given. `EngineConfig.from_dict` / `.to_dict` round-trip through plain JSON types,
and `with_overrides({"tree.total_tokens": 12, ...})` is how the CLI's `--set key=value` and the app's
settings JSON reach the engine.

Letters follow ALGORITHMS.md: θ_H (theta_entropy), λ_e, α, S0, θ_score, K, L_max, L_min, β, τ, w.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from respec.errors import ConfigError

#: Decoding methods the engine knows, with what each one is (README "Command line"). The ReSpec
#: ablations are named for the one part they remove (ALGORITHMS.md §1.8, issue 18):
METHOD_INFO: dict[str, str] = {
    "vanilla": "plain greedy / sampled decoding, one token per target forward",
    "eagle2": "EAGLE-2 dynamic tree only (ReSpec without retrieval)",
    "sam": "SAM-Decoding: suffix-automaton retrieval chain when the match is >= sam.len_threshold, "
           "else EAGLE-2",
    "respec": "full ReSpec: entropy gate, EMA-ranked candidates, relaxed verification of retrieved "
              "nodes, EAGLE-2 fallback",
    "respec-strict": "ReSpec without relaxation: every node verified strictly (lossless)",
    "respec-no-gate": "ReSpec without the entropy gate: retrieve whenever a match >= L_min exists",
    "respec-no-feedback": "ReSpec without feedback: the same candidates and K, ranked by match length "
                          "then recency, no EMA update, no score filter (every score stays S0)",
    "respec-no-model": "ReSpec without the model fallback: retrieval only, a root-only step where "
                       "ReSpec would let EAGLE-2 draft",
    "suffix": "SuffixDecoding (arctic-inference's SuffixDecodingCache): tree drafts from a suffix tree over "
              "this request's prompt and output and a global tree of earlier responses; a plain step when "
              "nothing matches (needs the arctic-inference package)",
    # Legacy ablations (kept so old traces and commands load; they swap a part for SAM's, so they
    # do not isolate one part: prefer respec-no-gate / respec-no-feedback).
    "respec-no-trigger": "legacy: the entropy gate replaced by SAM's rule (match >= sam.len_threshold)",
    "respec-no-ema": "legacy: the earliest occurrence only (SAM's min_endpos), K = 1, length L_max, "
                     "no score filter",
}
METHODS: tuple[str, ...] = tuple(METHOD_INFO)
#: Superseded ablation names, still accepted, and the method that isolates what they meant to remove.
LEGACY_METHODS: dict[str, str] = {"respec-no-trigger": "respec-no-gate", "respec-no-ema": "respec-no-feedback"}
#: Methods whose retrieval nodes are verified with the relaxed rule (lossy unless relax.budget == 0).
#: Every ReSpec variant except respec-strict; eagle2 / sam / vanilla never relax.
RELAXED_METHODS: tuple[str, ...] = ("respec", "respec-no-gate", "respec-no-feedback", "respec-no-model",
                                    "respec-no-trigger", "respec-no-ema")


def one_of(value: Any, choices: Sequence[str], what: str) -> str:
    """`value` lower-cased and stripped if it is one of `choices`; ValueError naming `what` and the
    choices otherwise (the switches read from flags and environment variables)."""
    v = str(value).strip().lower()
    if v not in choices:
        raise ValueError(f"{what} must be one of {', '.join(choices)}, got {value!r}")
    return v


COMPILE_CHOICES = ("off", "on")


def check_compile_choice(value: str) -> str:
    """--compile / RESPEC_COMPILE: 'on' | 'off' (case-insensitive); ValueError naming the choices otherwise."""
    return one_of(value, COMPILE_CHOICES, "--compile")


def is_lossless(config: "EngineConfig") -> bool:
    """True when the method must reproduce vanilla decoding (strict verification or sampling)."""
    return config.method not in RELAXED_METHODS or config.relax.budget == 0 or not config.greedy

#: Hard caps that protect a shared deployment; deployments may lower them (see app settings).
MAX_NEW_TOKENS_CAP = 8192
MAX_TREE_TOKENS_CAP = 512


@dataclass(frozen=True)
class Range:
    """The allowed values of one numeric setting: [lo, hi], integers only if `integer`, None
    allowed (meaning "off") if `allow_none`. Declared on each field (`_ranged`), so validation,
    `setting_ranges()` and the tests' bad-input matrix all read one table."""
    lo: float
    hi: float
    integer: bool = False
    allow_none: bool = False

    def text(self) -> str:
        return f"[{self.lo}, {self.hi}]"


def _ranged(default: Any, lo: float, hi: float, *, integer: bool = False, allow_none: bool = False):
    """A dataclass field whose value must lie in [lo, hi] (checked by `_validate_ranges`)."""
    return field(default=default, metadata={"range": Range(lo, hi, integer, allow_none)})


def _validate_ranges(obj: object) -> None:
    """Check every `_ranged` field of `obj`; integral floats of integer fields become ints."""
    for f in dataclasses.fields(obj):
        rng = f.metadata.get("range")
        if rng is not None:
            _check_range(obj, f.name, rng)


def _check_range(obj: object, name: str, rng: Range) -> None:
    value = getattr(obj, name)
    label = f"{type(obj).__name__}.{name}"
    if value is None:
        if rng.allow_none:
            return
        raise ConfigError(f"{label} must be set, got None")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{label} must be a number, got {value!r}")
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{label} must be finite, got {value!r}")
    if rng.integer and not float(value).is_integer():
        raise ConfigError(f"{label} must be an integer, got {value!r}")
    if value < rng.lo or value > rng.hi:
        raise ConfigError(f"{label} must be in {rng.text()}, got {value!r}")
    if rng.integer and not isinstance(value, int):
        object.__setattr__(obj, name, int(value))


@dataclass(frozen=True)
class SamplingConfig:
    # 0 = greedy (strict verification); > 0 = lossless speculative sampling
    temperature: float = _ranged(0.0, 0.0, 10.0)
    # restrict sampling to the k most likely tokens (None = off)
    top_k: int | None = _ranged(None, 1, 1_000_000, integer=True, allow_none=True)
    top_p: float | None = _ranged(None, 1e-6, 1.0, allow_none=True)  # nucleus sampling mass (None = off)
    # one torch.Generator per run is built from this; never reseeded
    seed: int = _ranged(0, 0, 2**63 - 1, integer=True)

    def __post_init__(self) -> None:
        _validate_ranges(self)


@dataclass(frozen=True)
class TreeConfig:
    """EAGLE-2 dynamic tree (ALGORITHMS §4.3). Paper values 60/5/10 suit a GPU; a 2-core CPU wants
    8-16 nodes (verifying 16 tokens costs about one decode step there)."""
    top_k: int = _ranged(10, 1, 64, integer=True)  # children per frontier node, and frontier width
    depth: int = _ranged(5, 0, 32, integer=True)  # expansion rounds; max draft depth = depth + 1
    # root + (total_tokens - 1) draft nodes kept by the global re-rank
    total_tokens: int = _ranged(60, 1, MAX_TREE_TOKENS_CAP, integer=True)
    auto: bool = False           # the cost model (respec/cost.py) for EVERY drafter: per step, keep
                                 # only as many draft nodes (EAGLE tree, SAM chain, ReSpec trie) as
                                 # maximise expected tokens per second (verify-cost curve measured at
                                 # load, shifted by what this request's steps really cost, x each
                                 # drafter's calibrated acceptance), down to no draft; a head that
                                 # does not pay is switched off. The sizes below are then maxima
    depth_cut: bool = True       # with auto: grow an EAGLE tree's next layer only if it could pay
                                 # (respec/drafters/eagle2.py `_expand_rule`); false = always `depth`

    def __post_init__(self) -> None:
        _validate_switches(self, ("auto", "depth_cut"))
        _validate_ranges(self)


def _validate_switches(obj: object, names: Sequence[str]) -> None:
    """Boolean settings: true/false (0/1 become booleans), anything else one ConfigError."""
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, bool):
            if isinstance(value, (int, float)) and value in (0, 1):
                object.__setattr__(obj, name, bool(value))
            else:
                raise ConfigError(f"{type(obj).__name__}.{name} must be true or false, got {value!r}")


@dataclass(frozen=True)
class SamConfig:
    """SAM-Decoding baseline (ALGORITHMS §3.4): retrieval chain when the dynamic suffix-automaton
    match is at least `len_threshold`, else the EAGLE-2 tree."""
    # max chain length (draft tokens after the root)
    n_predicts: int = _ranged(40, 1, MAX_TREE_TOKENS_CAP - 1, integer=True)
    len_threshold: int = _ranged(5, 1, 1024, integer=True)  # minimum match length to draft by retrieval

    def __post_init__(self) -> None:
        _validate_ranges(self)


@dataclass(frozen=True)
class SuffixConfig:
    """SuffixDecoding (arXiv 2411.04975) through arctic-inference: a draft of at most
    min(max_depth, spec_factor x match length + spec_offset) tokens whose estimated probability
    stays >= min_prob, a tree with `tree` (use_tree_spec), from this request's suffix tree or the
    global tree of earlier responses (kept across the requests of one runner: a CLI bench, a Lab
    run, the app's model) when `global_cache`."""
    max_depth: int = _ranged(24, 1, 64, integer=True)         # max_spec_tokens (the library's trees keep 64)
    spec_factor: float = _ranged(1.0, 0.0, 16.0)              # max_spec_factor
    spec_offset: float = _ranged(0.0, -16.0, 64.0)            # max_spec_offset
    min_prob: float = _ranged(0.1, 0.0, 1.0)                  # min_token_prob
    tree: bool = True                                          # use_tree_spec
    global_cache: bool = True                                  # earlier responses as a second source

    def __post_init__(self) -> None:
        _validate_switches(self, ("tree", "global_cache"))
        _validate_ranges(self)


@dataclass(frozen=True)
class TriggerConfig:
    """ReSpec WHEN (ALGORITHMS §1.3)."""
    window: int = _ranged(3, 1, 64, integer=True)  # l: max look-back over committed-token entropies
    theta_entropy: float = _ranged(1.5, 0.0, 20.0)  # θ_H, nats; retrieve iff the chosen window mean is <= θ_H
    lambda_e: float = _ranged(1.0, 0.0, 20.0)  # λ_e: penalty for short windows in C_k = H̄_k + λ_e / k

    def __post_init__(self) -> None:
        _validate_ranges(self)


#: How ReSpec's trie spends its node budget on the chosen candidates (`candidates.trie_order`).
TRIE_ORDERS: dict[str, str] = {
    "probability": "most probable nodes first: the continuation rate shared among siblings by their "
                   "candidates' EMA scores, so lower-ranked candidates branch off (default)",
    "rank": "candidates in rank order, each drafted in full before the next (the earlier insertion: "
            "the best candidate's chain fills the budget)",
}


@dataclass(frozen=True)
class CandidateConfig:
    """ReSpec WHAT (ALGORITHMS §1.4)."""
    alpha: float = _ranged(0.3, 0.0, 1.0)  # α: EMA rate, S <- (1 - α) S + α R
    s0: float = _ranged(0.5, 0.0, 1.0)  # S0: score of a never-seen position
    theta_score: float = _ranged(0.5, 0.0, 1.0)  # θ_score: minimum score to draft from
    top_k: int = _ranged(4, 1, 64, integer=True)  # K: positions merged into one trie
    l_max: int = _ranged(16, 1, 256, integer=True)  # L_max: draft length = max(1, round(L_max * S))
    tree_budget: int = _ranged(60, 1, MAX_TREE_TOKENS_CAP, integer=True)  # trie nodes, root included
    min_match: int = _ranged(3, 1, 64, integer=True)  # L_min: minimum match length to consider retrieval
    max_positions: int = _ranged(64, 1, 4096, integer=True)  # end positions examined per step
    trie_order: str = "probability"  # which trie nodes are kept first (TRIE_ORDERS)
    # cross-request memory: also retrieve from the newest earlier answers of the same runner (a
    # bench's or Lab run's earlier questions, the app's earlier runs) within this many tokens; 0 = off
    memory_tokens: int = _ranged(0, 0, 65536, integer=True)

    def __post_init__(self) -> None:
        _validate_ranges(self)
        if not isinstance(self.trie_order, str) or self.trie_order not in TRIE_ORDERS:
            raise ConfigError(f"CandidateConfig.trie_order must be one of {', '.join(TRIE_ORDERS)}, "
                              f"got {self.trie_order!r}")


#: Readings of the paper's "look-ahead tolerance" (ALGORITHMS.md §1.6), the rule `relax.mode`
#: chooses; respec/verify.py implements each. Every mode relaxes retrieved nodes only, never a
#: special or digit-only token, at most `budget` times per path, and needs the next `w` draft
#: tokens to match the target exactly after a relaxed one.
RELAX_MODES: dict[str, str] = {
    "lookahead": "Spec-Verification: the token is in the target's top-β and within τ nats of its "
                 "top-1 (the reconstructed rule, default)",
    "fly": "FLy's deferred window [F, T x w]: any mismatch the next w tokens re-synchronise after, "
           "no top-β / τ test",
    "shift": "insert tolerance: the mismatched token is an extra one; the next draft token is the "
             "target's top-1 at its position (the skip half needs a second forward and is not offered)",
}


@dataclass(frozen=True)
class RelaxConfig:
    """ReSpec HOW, applied to retrieval nodes only (ALGORITHMS §1.6). budget = 0 is lossless."""
    beta: int = _ranged(5, 1, 1000, integer=True)  # β: a relaxed token must be in the target's top-β
    tau: float = _ranged(2.0, 0.0, 50.0)  # τ: nats, max log-prob gap to the target's top-1
    lookahead: int = _ranged(3, 0, 64, integer=True)  # w: strict matches required after a relaxed token
    budget: int = _ranged(2, 0, 64, integer=True)  # relaxed acceptances allowed per step
    mode: str = "lookahead"  # which reading of "look-ahead tolerance" (RELAX_MODES); β, τ apply to "lookahead" only

    def __post_init__(self) -> None:
        if not isinstance(self.mode, str) or self.mode not in RELAX_MODES:
            raise ConfigError(f"RelaxConfig.mode must be one of {', '.join(RELAX_MODES)}, got {self.mode!r}")
        _validate_ranges(self)


_SECTIONS = {"sampling": SamplingConfig, "tree": TreeConfig, "sam": SamConfig, "suffix": SuffixConfig,
             "trigger": TriggerConfig, "candidates": CandidateConfig, "relax": RelaxConfig}

#: Short aliases accepted by `with_overrides` (the names the UI and issues use).
ALIASES: dict[str, str] = {
    "temperature": "sampling.temperature", "seed": "sampling.seed",
    "total_tokens": "tree.total_tokens", "depth": "tree.depth", "auto": "tree.auto",
    "theta_H": "trigger.theta_entropy", "theta_entropy": "trigger.theta_entropy",
    "l": "trigger.window", "lambda_e": "trigger.lambda_e",
    "alpha": "candidates.alpha", "S0": "candidates.s0", "s0": "candidates.s0",
    "theta_score": "candidates.theta_score", "K": "candidates.top_k",
    "L_max": "candidates.l_max", "L_min": "candidates.min_match",
    "beta": "relax.beta", "tau": "relax.tau", "w": "relax.lookahead", "budget": "relax.budget",
    "relax_mode": "relax.mode",
}

#: Settings whose values are names, not numbers (never parsed by `_coerce`).
STRING_SETTINGS: frozenset[str] = frozenset({"method", "relax.mode", "candidates.trie_order"})


@dataclass(frozen=True)
class EngineConfig:
    method: str = "eagle2"
    max_new_tokens: int = _ranged(128, 1, MAX_NEW_TOKENS_CAP, integer=True)  # demo default; Spec-Bench uses 1024
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    tree: TreeConfig = field(default_factory=TreeConfig)
    sam: SamConfig = field(default_factory=SamConfig)
    suffix: SuffixConfig = field(default_factory=SuffixConfig)
    trigger: TriggerConfig = field(default_factory=TriggerConfig)
    candidates: CandidateConfig = field(default_factory=CandidateConfig)
    relax: RelaxConfig = field(default_factory=RelaxConfig)

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"unknown method {self.method!r}; choose one of {', '.join(METHODS)}")
        _validate_ranges(self)
        for name, cls in _SECTIONS.items():
            if not isinstance(getattr(self, name), cls):
                raise ConfigError(f"EngineConfig.{name} must be a {cls.__name__}")

    @property
    def greedy(self) -> bool:
        return self.sampling.temperature == 0.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> EngineConfig:
        """Build from plain JSON types; unknown keys raise ConfigError (typos must not pass)."""
        if not isinstance(data, Mapping):
            raise ConfigError(f"settings must be a JSON object, got {type(data).__name__}")
        return cls().with_overrides(flatten_settings(data))

    def with_overrides(self, overrides: Mapping[str, Any]) -> EngineConfig:
        """Return a copy with dotted keys replaced, e.g. {"tree.total_tokens": 12, "method": "sam"}.
        Short aliases (ALIASES) are accepted. Values given as strings are parsed as numbers."""
        top: dict[str, Any] = {}
        sections: dict[str, dict[str, Any]] = {}
        for raw_key, value in overrides.items():
            key = ALIASES.get(raw_key, raw_key)
            if "." in key:
                section, _, name = key.partition(".")
                cls = _SECTIONS.get(section)
                if cls is None or name not in {f.name for f in dataclasses.fields(cls)}:
                    raise ConfigError(f"unknown setting {raw_key!r}")
                sections.setdefault(section, {})[name] = coerce_setting(key, value, raw_key)
            elif key in ("method", "max_new_tokens"):
                top[key] = coerce_setting(key, value, raw_key)
            else:
                raise ConfigError(f"unknown setting {raw_key!r}")
        try:
            for section, values in sections.items():
                top[section] = dataclasses.replace(getattr(self, section), **values)
            return dataclasses.replace(self, **top)
        except TypeError as exc:  # e.g. a list where a number belongs
            raise ConfigError(f"bad settings: {exc}") from None


def setting_ranges() -> dict[str, Range]:
    """Every numeric setting's dotted name (as `with_overrides` takes it) -> its Range."""
    out = {f.name: f.metadata["range"] for f in dataclasses.fields(EngineConfig) if "range" in f.metadata}
    for section, cls in _SECTIONS.items():
        out.update({f"{section}.{f.name}": f.metadata["range"] for f in dataclasses.fields(cls)
                    if "range" in f.metadata})
    return out


def device_defaults(device_type: str) -> dict[str, Any]:
    """Settings that suit a device better than the paper's GPU values, applied under the user's own
    (explicit settings always win). A 2-core CPU verifies 8-16 tokens for about the cost of one
    decode step but 64 for about three, so trees are small there; `tree.auto` then prunes each tree
    to what pays, down to no draft (respec/cost.py). The same holds for SAM's chains and ReSpec's
    tries: `tree.auto` is the one cost model of every drafter."""
    if device_type == "cuda":
        return {"tree.auto": True}
    # ReSpec on the CPU default model (49k vocabulary, copy runs that start after 1-3-token
    # matches): θ_H = 3, L_min = 2, L_max = 32 beat the paper's 1.5 / 3 / 16 in the dev-split sweep
    # recorded in docs/benchmarks-history.md §3 (respec-strict 1.44x vs 1.28x overall).
    return {"tree.auto": True, "tree.total_tokens": 16, "tree.depth": 4, "tree.top_k": 4,
            "sam.n_predicts": 16, "candidates.tree_budget": 16,
            "trigger.theta_entropy": 3.0, "candidates.min_match": 2, "candidates.l_max": 32}


#: Named starting points applied INSTEAD of the device defaults (user settings still win), one
#: definition for the CLI (`--preset`), the app's preset list and `/compare`'s `"preset"` key.
#: "paper": the paper's thresholds (θ_H 1.5, window 3, L_min 3, L_max 16, S0 = θ_score = 0.5;
#: ALGORITHMS.md §1.3-1.4) with EAGLE-2's published fixed tree (60 nodes, depth 5, top-k 10, no
#: cost model) and the budgets the paper implies (60-node trie, SAM's 40-token chain). These are
#: EngineConfig's own defaults; listing them makes the preset independent of any device default.
PRESETS: dict[str, dict[str, Any]] = {
    "paper": {
        "tree.auto": False, "tree.total_tokens": 60, "tree.depth": 5, "tree.top_k": 10,
        "trigger.theta_entropy": 1.5, "trigger.window": 3, "trigger.lambda_e": 1.0,
        "candidates.min_match": 3, "candidates.l_max": 16, "candidates.s0": 0.5,
        "candidates.theta_score": 0.5, "candidates.alpha": 0.3, "candidates.top_k": 4,
        "candidates.tree_budget": 60, "candidates.max_positions": 64,
        "sam.n_predicts": 40, "sam.len_threshold": 5,
    },
}
#: The name of the default starting point (the device defaults) where a preset name is expected.
DEVICE_PRESET = "device"


def preset_names() -> tuple[str, ...]:
    return (DEVICE_PRESET, *PRESETS)


def starting_settings(device_type: str, preset: str | None = None) -> dict[str, Any]:
    """The settings a run starts from before the user's own: the device defaults (preset None or
    "device") or a named preset from PRESETS, which replaces them. ConfigError for an unknown name."""
    if preset is None or preset == DEVICE_PRESET:
        return device_defaults(device_type)
    if not isinstance(preset, str) or preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; choose one of {', '.join(preset_names())}")
    return dict(PRESETS[preset])


def flatten_settings(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings -> dotted keys, aliases resolved:
    {"tree": {"depth": 4}, "theta_H": 1} -> {"tree.depth": 4, "trigger.theta_entropy": 1}."""
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ConfigError(f"setting names must be strings, got {key!r}")
        if isinstance(value, Mapping):
            out.update(flatten_settings(value, f"{prefix}{key}."))
        else:
            full = f"{prefix}{key}"
            out[ALIASES.get(full, full)] = value
    return out


def coerce_setting(key: str, value: Any, label: str | None = None) -> Any:
    """A setting's value as given on a command line or in a grid: names (STRING_SETTINGS, after
    aliases) stay strings, everything else goes through `_coerce`."""
    key = ALIASES.get(key, key)
    if key in STRING_SETTINGS:
        return value.strip() if isinstance(value, str) else value
    return _coerce(label or key, value)


def _coerce(key: str, value: Any) -> Any:
    """Parse CLI strings ("12", "0.5", "none") into numbers; leave other types to validation."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text in ("none", "null"):
            return None
        if text in ("true", "on", "yes"):
            return True
        if text in ("false", "off", "no"):
            return False
        try:
            number = float(text)
        except ValueError:
            raise ConfigError(f"setting {key!r} must be a number, got {value!r}") from None
        return int(number) if number.is_integer() and "." not in text and "e" not in text else number
    return value
