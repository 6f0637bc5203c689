"""Traces: per-step records and run results, and the versioned trace file.

Contract: every target forward of a run yields one `StepTrace`; a finished run is a
`GenerationResult` (tokens, text, steps, stats, config, metadata). `result_to_json` /
`result_from_json` round-trip exactly (dataclass equality), and loading validates the schema name,
its version, and the internal consistency of every step (tree shape, accepted path, token counts),
raising `TraceFormatError` with one clear message otherwise. The UI, CLI and bench all use this
file format; replay needs no model.

Token accounting (see respec/verify.py for the glossary): the prefill's choice is the first
generated token. Step s feeds its root (the last generated token so far) plus the draft, and its
`new_tokens` are the accepted draft tokens followed by the bonus/recovered token, so
`len(new_tokens) == num_accepted + 1` and generated tokens = [first token] + all new_tokens
(the last step truncated at a stop token or at max_new_tokens).
Mean accepted length = mean over steps of (num_accepted + 1): it COUNTS the bonus token.
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Mapping

from respec._io import atomic_write_text
from respec.config import EngineConfig
from respec.drafters.base import Decision
from respec.errors import ConfigError, TraceFormatError
from respec.tree import DraftTree
from respec.verify import Verdict

SCHEMA = "respec-trace"
SCHEMA_VERSION = 1


@dataclass(frozen=True)
class StepTrace:
    step: int                               # 0-based index of the target forward after prefill
    source: str                             # "retrieval" | "eagle" | "none" (root only)
    tree: DraftTree
    verdict: Verdict
    new_tokens: tuple[int, ...]             # accepted draft tokens + bonus/recovered token
    entropies: tuple[float, ...]            # nats, target distribution at each path node (root first)
    margins: tuple[float, ...]              # top-1 minus top-2 logit at each path node
    draft_ms: float
    verify_ms: float
    decision: Decision | None = None
    candidates: tuple[dict, ...] = ()        # Candidate.to_dict() records (respec/drafters/base.py)
    node_ranks: tuple[int, ...] = ()        # [n + 1] target rank of each node's token after its parent (root 0)
    node_probs: tuple[float, ...] = ()      # [n + 1] target probability of each node's token (root 1.0)
    at_ms: float = 0.0                      # ms from the run's start (its prefill included) to this step's report

    @property
    def num_accepted(self) -> int:
        return self.verdict.num_accepted

    @property
    def num_draft(self) -> int:
        return self.tree.num_draft

    def to_dict(self) -> dict:
        return {"step": self.step, "source": self.source, "tree": self.tree.to_dict(),
                "verdict": self.verdict.to_dict(), "new_tokens": list(self.new_tokens),
                "entropies": list(self.entropies), "margins": list(self.margins),
                "draft_ms": self.draft_ms, "verify_ms": self.verify_ms,
                "decision": None if self.decision is None else _decision_to_dict(self.decision),
                "candidates": [dict(c) for c in self.candidates],
                "node_ranks": list(self.node_ranks), "node_probs": list(self.node_probs), "at_ms": self.at_ms}

    @classmethod
    def from_dict(cls, d: Mapping) -> StepTrace:
        dec = d.get("decision")
        return cls(step=int(d["step"]), source=str(d["source"]), tree=DraftTree.from_dict(d["tree"]),
                   verdict=Verdict.from_dict(d["verdict"]), new_tokens=tuple(int(t) for t in d["new_tokens"]),
                   entropies=tuple(float(x) for x in d["entropies"]),
                   margins=tuple(float(x) for x in d["margins"]),
                   draft_ms=float(d["draft_ms"]), verify_ms=float(d["verify_ms"]),
                   decision=None if dec is None else _decision_from_dict(dec),
                   candidates=tuple(dict(c) for c in d.get("candidates", ())),
                   node_ranks=tuple(int(x) for x in d.get("node_ranks", ())),
                   node_probs=tuple(float(x) for x in d.get("node_probs", ())),
                   at_ms=float(d.get("at_ms", 0.0)))


def _decision_to_dict(dec: Decision) -> dict:
    d = asdict(dec)
    d["window"] = list(dec.window)
    return d


def _decision_from_dict(d: Mapping) -> Decision:
    return Decision(source=d["source"], reason=d["reason"], match_len=int(d.get("match_len", 0)),
                    fired=d.get("fired"), window=tuple(float(x) for x in d.get("window", ())),
                    k_star=d.get("k_star"), mean_entropy=d.get("mean_entropy"), extra=dict(d.get("extra", {})))


@dataclass(frozen=True)
class SpecStats:
    """Aggregates over the steps of one run. Mean accepted length INCLUDES the bonus token."""
    new_tokens: int
    steps: int
    wall_time_s: float
    draft_tokens: int
    accepted_tokens: int
    relaxed_tokens: int
    draft_ms: float
    verify_ms: float
    steps_by_source: dict[str, int]
    accept_length_hist: tuple[int, ...]     # index = accepted draft tokens in a step (bonus excluded)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens committed per target forward (Spec-Bench MAT): 1 + accepted / steps."""
        return 1.0 + self.accepted_tokens / self.steps if self.steps else 1.0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted_tokens / self.draft_tokens if self.draft_tokens else 0.0

    @classmethod
    def from_steps(cls, steps: tuple[StepTrace, ...], new_tokens: int, wall_time_s: float) -> SpecStats:
        hist: list[int] = []
        by_source: dict[str, int] = {}
        for s in steps:
            a = s.num_accepted
            hist.extend([0] * (a + 1 - len(hist)))
            hist[a] += 1
            by_source[s.source] = by_source.get(s.source, 0) + 1
        return cls(new_tokens=new_tokens, steps=len(steps), wall_time_s=wall_time_s,
                   draft_tokens=sum(s.num_draft for s in steps),
                   accepted_tokens=sum(s.num_accepted for s in steps),
                   relaxed_tokens=sum(s.verdict.num_relaxed for s in steps),
                   draft_ms=sum(s.draft_ms for s in steps), verify_ms=sum(s.verify_ms for s in steps),
                   steps_by_source=by_source, accept_length_hist=tuple(hist))

    def to_dict(self) -> dict:
        d = asdict(self)
        d["accept_length_hist"] = list(self.accept_length_hist)
        d.update(tokens_per_s=self.tokens_per_s, mean_accepted_length=self.mean_accepted_length,
                 acceptance_rate=self.acceptance_rate)
        return d


#: Who drafted a step ("none": a plain decoding step, the tree is the root alone).
STEP_SOURCES = ("retrieval", "eagle", "none")


@dataclass(frozen=True)
class GenerationResult:
    prompt_tokens: tuple[int, ...]
    tokens: tuple[int, ...]                 # generated token ids (stop token included if emitted)
    text: str                               # decoded generated text ("" without a tokenizer)
    first_entropy: float                    # prefill distribution that chose the first token
    first_margin: float
    steps: tuple[StepTrace, ...]
    config: EngineConfig
    wall_time_s: float
    prefill_ms: float
    stop_reason: str                        # "stop_token" | "max_new_tokens" | "context"
    meta: dict[str, Any] = field(default_factory=dict)   # model, device, dtype, versions, prompt text

    @property
    def stats(self) -> SpecStats:
        return SpecStats.from_steps(self.steps, len(self.tokens), self.wall_time_s)

    def token_entropies(self) -> list[float]:
        """Entropy of the distribution that chose each generated token (aligned with `tokens`)."""
        return _aligned(self, "entropies", self.first_entropy)

    def token_margins(self) -> list[float]:
        """Top-1 minus top-2 logit of the distribution that chose each generated token."""
        return _aligned(self, "margins", self.first_margin)

    def token_sources(self) -> list[str]:
        """Who proposed each generated token: "retrieval" / "eagle" (accepted draft) or "target"."""
        out = ["target"]
        for s in self.steps:
            for node in s.verdict.path[1:]:
                out.append(s.tree.sources[node])
            out.append("target")
        return out[:len(self.tokens)]


def _aligned(result: GenerationResult, attr: str, first: float) -> list[float]:
    out = [first]
    for s in result.steps:
        out.extend(getattr(s, attr))
    return out[:len(result.tokens)]


# ---------------------------------------------------------------------------- the file
def result_to_dict(result: GenerationResult) -> dict:
    return {"schema": SCHEMA, "version": SCHEMA_VERSION, "meta": result.meta,
            "config": result.config.to_dict(), "prompt_tokens": list(result.prompt_tokens),
            "tokens": list(result.tokens), "text": result.text, "first_entropy": result.first_entropy,
            "first_margin": result.first_margin, "wall_time_s": result.wall_time_s,
            "prefill_ms": result.prefill_ms, "stop_reason": result.stop_reason,
            "stats": result.stats.to_dict(), "steps": [s.to_dict() for s in result.steps]}


def result_to_json(result: GenerationResult, indent: int | None = None) -> str:
    return json.dumps(result_to_dict(result), indent=indent, ensure_ascii=False, allow_nan=True)


def write_trace(result: GenerationResult, path: str | Path) -> None:
    """`result` as a trace file at `path`, written whole or not at all (a temporary file, renamed)."""
    atomic_write_text(path, result_to_json(result))


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"text must be a string, got {type(value).__name__}")
    return value


def result_from_dict(d: Any) -> GenerationResult:
    if not isinstance(d, Mapping):
        raise TraceFormatError("a trace must be a JSON object")
    if d.get("schema") != SCHEMA:
        raise TraceFormatError(f"not a ReSpec trace (schema {d.get('schema')!r}, expected {SCHEMA!r})")
    version = d.get("version")
    if not isinstance(version, int) or version < 1 or version > SCHEMA_VERSION:
        raise TraceFormatError(f"unsupported trace version {version!r}; this build reads versions 1..{SCHEMA_VERSION}")
    try:
        config = EngineConfig.from_dict(d["config"])
        steps = tuple(StepTrace.from_dict(s) for s in d["steps"])
        result = GenerationResult(
            prompt_tokens=tuple(int(t) for t in d["prompt_tokens"]), tokens=tuple(int(t) for t in d["tokens"]),
            text=_text(d["text"]), first_entropy=float(d["first_entropy"]), first_margin=float(d["first_margin"]),
            steps=steps, config=config, wall_time_s=float(d["wall_time_s"]), prefill_ms=float(d["prefill_ms"]),
            stop_reason=str(d["stop_reason"]), meta=dict(d.get("meta") or {}))
    except ConfigError as exc:
        raise TraceFormatError(f"trace has invalid settings: {exc}") from None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise TraceFormatError(f"malformed trace: {type(exc).__name__}: {exc}") from None
    validate_result(result)
    _check_stored_stats(d.get("stats"), result)
    return result


#: The stats counts a trace file stores; they must equal what its steps add up to.
_COUNTED_STATS = ("new_tokens", "steps", "draft_tokens", "accepted_tokens", "relaxed_tokens",
                  "accept_length_hist", "steps_by_source")


def _check_stored_stats(stored: Any, result: GenerationResult) -> None:
    """A hand-edited file whose stored counts disagree with its steps is rejected, naming the count."""
    if stored is None:
        return
    if not isinstance(stored, Mapping):
        raise TraceFormatError("the trace's stats must be a JSON object")
    real = result.stats.to_dict()
    for key in _COUNTED_STATS:
        if key in stored and stored[key] != real[key]:
            raise TraceFormatError(f"stats.{key} says {stored[key]!r} but the steps add up to {real[key]!r}")


def result_from_json(text: str | bytes) -> GenerationResult:
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TraceFormatError(f"trace is not valid JSON: {exc}") from None
    return result_from_dict(data)


def validate_result(r: GenerationResult) -> None:
    """Check internal consistency; raise TraceFormatError naming the first problem found."""
    expected: list[int] = []
    for name in ("prompt_tokens", "tokens"):
        bad = next((t for t in getattr(r, name) if t < 0), None)
        if bad is not None:
            raise TraceFormatError(f"{name} holds a negative token id ({bad})")
    for i, s in enumerate(r.steps):
        if s.step != i:
            raise TraceFormatError(f"step {i} is numbered {s.step}")
        if s.source not in STEP_SOURCES:
            raise TraceFormatError(f"step {i}: unknown draft source {s.source!r}; expected one of "
                                   f"{', '.join(STEP_SOURCES)}")
        path = s.verdict.path
        if not path or path[0] != 0:
            raise TraceFormatError(f"step {i}: accepted path must start at the root")
        for a, b in zip(path, path[1:]):
            if not 0 < b < s.tree.size or s.tree.parents[b] != a:
                raise TraceFormatError(f"step {i}: accepted path {list(path)} is not a path of the tree")
        if len(s.verdict.node_status) != s.tree.size:
            raise TraceFormatError(f"step {i}: node_status has {len(s.verdict.node_status)} entries "
                                   f"for {s.tree.size} nodes")
        want = [s.tree.tokens[n] for n in path[1:]] + [s.verdict.next_token]
        if list(s.new_tokens) != want:
            raise TraceFormatError(f"step {i}: new_tokens {list(s.new_tokens)} do not match the accepted "
                                   f"path and next token {want}")
        if len(s.entropies) != len(path) or len(s.margins) != len(path):
            raise TraceFormatError(f"step {i}: need one entropy and margin per path node")
        if i > 0 and s.tree.tokens[0] != r.steps[i - 1].new_tokens[-1]:
            raise TraceFormatError(f"step {i}: root {s.tree.tokens[0]} is not the previous step's last token")
        for name in ("node_ranks", "node_probs"):
            if getattr(s, name) and len(getattr(s, name)) != s.tree.size:
                raise TraceFormatError(f"step {i}: {name} needs one entry per tree node")
        if s.verdict.num_relaxed > s.num_accepted:
            raise TraceFormatError(f"step {i}: more relaxed than accepted tokens")
        if not math.isfinite(s.at_ms) or s.at_ms < 0:
            raise TraceFormatError(f"step {i}: at_ms must be a non-negative number, got {s.at_ms}")
        expected.extend(s.new_tokens)
    if r.steps and r.tokens and r.steps[0].tree.tokens[0] != r.tokens[0]:
        raise TraceFormatError("the first step's root is not the first generated token")
    full = list(r.tokens[:1]) + expected
    diff = next((j for j, (a, b) in enumerate(zip(r.tokens, full)) if a != b), None)
    if diff is not None:
        raise TraceFormatError(f"generated token {diff} is {r.tokens[diff]} but the steps committed {full[diff]} there")
    if len(r.tokens) > len(full) or len(full) - len(r.tokens) >= max(1, len(r.steps[-1].new_tokens) if r.steps else 1):
        raise TraceFormatError(f"the trace lists {len(r.tokens)} generated tokens but its steps add up to "
                               f"{len(full)}")
    for name in ("wall_time_s", "prefill_ms"):
        v = getattr(r, name)
        if not math.isfinite(v) or v < 0:
            raise TraceFormatError(f"{name} must be a non-negative number, got {v}")
