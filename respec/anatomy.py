"""Why a draft pays or not: acceptance by draft position and the speedup's anatomy (pure functions
over traces; no model, no clock).

Contract:
- `acceptance_by_depth(steps)` -> `DepthAcceptance`: for every draft depth d (1 = the first draft
  token after the root) and node source ("eagle", "retrieval"), the draft tokens verification
  reached (visited: their parent was on the accepted path), those it accepted (strictly or by
  relaxation) and those it relaxed; and how many drafting steps' accepted path reaches depth d.
  `rate(d, source)` = accepted / reached at d (the target's "acceptance by position");
  `reach(d)` = share of drafting steps whose accepted path reaches d; `hold(source)` = accepted
  draft tokens per drafting step of that source ("EAGLE's drafts hold for 1.4 tokens").
  `merge` adds two tables (a bench category's questions, several turns).
- `Totals` are what the anatomy is computed from (tokens, target forwards counting the prefill,
  wall ms, prefill / verify / draft ms, the cost model's predicted tokens and ms over the steps it
  planned); `totals_of(result)` reads them off a GenerationResult, `+` adds them.
- `anatomy(run, vanilla)` -> `Anatomy`: speedup = tokens per forward ratio x ms per forward ratio,
      (N/F) / (N_v/F_v)  x  (T_v/F_v) / (T/F)  =  (N/T) / (N_v/T_v),
  an identity (vanilla's tokens per forward is 1: one token per forward, the prefill's included),
  so the factors multiply back to the measured tokens/s ratio; a forward's ms is split into verify
  (target forward + verification), drafting, prefill and the rest (tree building, masks, traces).
  Beside it the cost model's prediction for the steps it planned: predicted tokens per step and
  ms per step against what those steps realised. `sentence()` says it as a teacher would.
- `token_times(result)` -> when each generated token was there: ms from the run's start (the
  prefill's for the first token, the step's `at_ms` for the ones it committed); a bench compares
  methods whose outputs end at different lengths at the length they share
  (`respec.lab.report.same_length_speedup`).
- `plain_steps(curve, n)`: what verifying an n-token tree costs in plain (one-token) steps on a
  verify-cost curve {size: ms} (the cost model's interpolation, `respec.cost.interpolate_cost`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from respec.cost import interpolate_cost

DRAFT_SOURCES = ("eagle", "retrieval")


@dataclass
class DepthAcceptance:
    """Counts by depth (index d - 1) and source: reached, accepted, relaxed draft tokens; and the
    drafting steps (by the step's source) and how many of them reach each depth."""
    reached: dict[str, list[int]] = field(default_factory=dict)
    accepted: dict[str, list[int]] = field(default_factory=dict)
    relaxed: dict[str, list[int]] = field(default_factory=dict)
    steps_reaching: list[int] = field(default_factory=list)    # drafting steps whose path reaches d
    drafting_steps: dict[str, int] = field(default_factory=dict)
    held: dict[str, int] = field(default_factory=dict)         # accepted draft tokens, by step source

    @property
    def depth(self) -> int:
        return max((len(v) for v in self.reached.values()), default=0)

    def _sum(self, counts: dict[str, list[int]], d: int, source: str | None) -> int:
        srcs = DRAFT_SOURCES if source is None else (source,)
        return sum(counts.get(s, [])[d - 1] if d <= len(counts.get(s, [])) else 0 for s in srcs)

    def rate(self, d: int, source: str | None = None) -> float | None:
        """Accepted / reached draft tokens at depth d (None where none was reached)."""
        n = self._sum(self.reached, d, source)
        return self._sum(self.accepted, d, source) / n if n else None

    def relaxed_share(self, d: int, source: str | None = None) -> float | None:
        """Relaxed / accepted draft tokens at depth d."""
        n = self._sum(self.accepted, d, source)
        return self._sum(self.relaxed, d, source) / n if n else None

    def reach(self, d: int) -> float | None:
        """Share of drafting steps whose accepted path reaches depth d."""
        n = sum(self.drafting_steps.values())
        return (self.steps_reaching[d - 1] if d <= len(self.steps_reaching) else 0) / n if n else None

    def hold(self, source: str) -> float | None:
        """Accepted draft tokens per drafting step of `source` (None without such steps)."""
        n = self.drafting_steps.get(source, 0)
        return self.held.get(source, 0) / n if n else None

    def merge(self, other: "DepthAcceptance") -> "DepthAcceptance":
        out = DepthAcceptance()
        for name in ("reached", "accepted", "relaxed"):
            a, b = getattr(self, name), getattr(other, name)
            getattr(out, name).update({s: _add_lists(a.get(s, []), b.get(s, [])) for s in {*a, *b}})
        out.steps_reaching = _add_lists(self.steps_reaching, other.steps_reaching)
        for name in ("drafting_steps", "held"):
            a, b = getattr(self, name), getattr(other, name)
            getattr(out, name).update({s: a.get(s, 0) + b.get(s, 0) for s in {*a, *b}})
        return out

    def rows(self, max_depth: int | None = None) -> list[dict[str, Any]]:
        """One dict per depth: depth, reached, accepted, rate, reach, and rate per source."""
        out = []
        for d in range(1, min(self.depth, max_depth or self.depth) + 1):
            row = {"depth": d, "reached": self._sum(self.reached, d, None),
                   "accepted": self._sum(self.accepted, d, None), "rate": self.rate(d), "reach": self.reach(d),
                   "relaxed_share": self.relaxed_share(d)}
            row.update({f"rate_{s}": self.rate(d, s) for s in DRAFT_SOURCES})
            out.append(row)
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"reached": self.reached, "accepted": self.accepted, "relaxed": self.relaxed,
                "steps_reaching": self.steps_reaching, "drafting_steps": self.drafting_steps, "held": self.held}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "DepthAcceptance":
        return cls(**{k: (dict(v) if isinstance(v, Mapping) else list(v)) for k, v in d.items()})


def _add_lists(a: list[int], b: list[int]) -> list[int]:
    n = max(len(a), len(b))
    return [(a[i] if i < len(a) else 0) + (b[i] if i < len(b) else 0) for i in range(n)]


def _bump(counts: dict[str, list[int]], source: str, d: int) -> None:
    row = counts.setdefault(source, [])
    row.extend([0] * (d - len(row)))
    row[d - 1] += 1


def acceptance_by_depth(steps: Iterable[Any]) -> DepthAcceptance:
    """Count every step's visited draft nodes by depth and source (see the module docstring)."""
    out = DepthAcceptance()
    for s in steps:
        if s.tree.num_draft == 0:
            continue
        out.drafting_steps[s.source] = out.drafting_steps.get(s.source, 0) + 1
        out.held[s.source] = out.held.get(s.source, 0) + s.verdict.num_accepted
        depths = s.tree.depths()
        for i in range(1, s.tree.size):
            status = s.verdict.node_status[i]
            if status == "unvisited":
                continue
            src, d = s.tree.sources[i], depths[i]
            _bump(out.reached, src, d)
            if status in ("accepted", "relaxed"):
                _bump(out.accepted, src, d)
            if status == "relaxed":
                _bump(out.relaxed, src, d)
        for d in range(1, s.verdict.num_accepted + 1):
            out.steps_reaching.extend([0] * (d - len(out.steps_reaching)))
            out.steps_reaching[d - 1] += 1
    return out


# ------------------------------------------------------------------------------ the anatomy
@dataclass(frozen=True)
class Totals:
    """A run's (or several runs') sums: what the anatomy is computed from."""
    tokens: int = 0
    forwards: int = 0               # target forwards, the prefill's included
    wall_ms: float = 0.0
    prefill_ms: float = 0.0
    verify_ms: float = 0.0          # target forwards of the steps + verification
    draft_ms: float = 0.0
    planned_steps: int = 0          # steps the cost model planned ...
    predicted_tokens: float = 0.0   # ... the tokens it expected them to commit
    predicted_ms: float = 0.0       # ... and the ms it expected them to cost
    realised_tokens: int = 0        # what those steps committed
    realised_ms: float = 0.0        # and cost (drafting + verify)

    def __add__(self, other: "Totals") -> "Totals":
        return Totals(**{k: getattr(self, k) + getattr(other, k) for k in self.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.__dataclass_fields__}


def totals_of(result: Any) -> Totals:
    """A GenerationResult's Totals (prediction from each step's decision.extra["cost"], where the
    cost model planned the step)."""
    planned = [(s, s.decision.extra["cost"]) for s in result.steps
               if s.decision is not None and isinstance(s.decision.extra.get("cost"), Mapping)
               and "expected_tokens" in s.decision.extra["cost"] and "cost_ms" in s.decision.extra["cost"]]
    return Totals(tokens=len(result.tokens), forwards=len(result.steps) + 1, wall_ms=result.wall_time_s * 1000,
                  prefill_ms=result.prefill_ms, verify_ms=sum(s.verify_ms for s in result.steps),
                  draft_ms=sum(s.draft_ms for s in result.steps), planned_steps=len(planned),
                  predicted_tokens=sum(float(c["expected_tokens"]) for _, c in planned),
                  predicted_ms=sum(float(c["cost_ms"]) for _, c in planned),
                  realised_tokens=sum(len(s.new_tokens) for s, _ in planned),
                  realised_ms=sum(s.verify_ms + s.draft_ms for s, _ in planned))


def token_times(result: Any) -> list[float]:
    """[len(result.tokens)] ms from the run's start at which each generated token was committed:
    the first at the prefill's end, every other at the end of the step that committed it."""
    times = [float(result.prefill_ms)]
    for s in result.steps:
        times.extend([float(s.at_ms)] * len(s.new_tokens))
    return times[:len(result.tokens)]


@dataclass(frozen=True)
class Anatomy:
    tokens_per_forward: float       # this run's N / F
    vanilla_tokens_per_forward: float
    ms_per_forward: float           # this run's T / F
    vanilla_ms_per_forward: float
    verify_ms: float                # per forward: target forward + verification
    draft_ms: float                 # per forward: drafting
    prefill_ms: float               # per forward: the prefill's share
    other_ms: float                 # per forward: the rest (tree building, masks, traces)
    loop_ms_per_step: float         # per step after the prefill: the loop's own work (see `anatomy`)
    predicted_tokens: float | None  # per planned step: what the cost model expected ...
    realised_tokens: float | None   # ... and what those steps committed
    predicted_ms: float | None
    realised_ms: float | None

    @property
    def token_factor(self) -> float:
        return self.tokens_per_forward / self.vanilla_tokens_per_forward

    @property
    def cost_factor(self) -> float:
        """Vanilla's ms per forward / this run's: below 1 when a step costs more than a plain one."""
        return self.vanilla_ms_per_forward / self.ms_per_forward

    @property
    def speedup(self) -> float:
        return self.token_factor * self.cost_factor

    @property
    def step_cost(self) -> float:
        """This run's forward in plain forwards (1 / cost_factor)."""
        return self.ms_per_forward / self.vanilla_ms_per_forward

    def sentence(self, name: str) -> str:
        return (f"{name} committed {self.tokens_per_forward:.2f} tokens per target forward, but each forward cost "
                f"{self.step_cost:.2f} plain ones ({self.verify_ms:.1f} ms verifying, {self.draft_ms:.1f} ms "
                f"drafting, {self.other_ms + self.prefill_ms:.1f} ms else), so {self.speedup:.2f}x")

    def to_dict(self) -> dict[str, Any]:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d.update(token_factor=self.token_factor, cost_factor=self.cost_factor, speedup=self.speedup,
                 step_cost=self.step_cost)
        return {k: (round(v, 4) if isinstance(v, float) else v) for k, v in d.items()}


def anatomy(run: Totals, vanilla: Totals) -> Anatomy:
    """The factors of `run`'s speedup over `vanilla` (both Totals; see the module docstring)."""
    f, fv = max(run.forwards, 1), max(vanilla.forwards, 1)
    ms = run.wall_ms / f
    verify, draft, prefill = run.verify_ms / f, run.draft_ms / f, run.prefill_ms / f
    # the loop's own work per step, the prefill apart: the run's wall time less its prefill, its
    # drafting (Proposal built) and its target forwards (forward_tree, timed by the engine's
    # Stopwatch), over the steps; what is left is reading the step's numbers back, verifying,
    # keeping the accepted path in the cache, the drafter's feedback and the step's trace
    loop = (run.wall_ms - run.prefill_ms - run.verify_ms - run.draft_ms) / max(run.forwards - 1, 1)
    p = run.planned_steps
    return Anatomy(tokens_per_forward=run.tokens / f, vanilla_tokens_per_forward=vanilla.tokens / fv,
                   ms_per_forward=ms, vanilla_ms_per_forward=vanilla.wall_ms / fv, verify_ms=verify,
                   draft_ms=draft, prefill_ms=prefill, other_ms=ms - verify - draft - prefill, loop_ms_per_step=loop,
                   predicted_tokens=run.predicted_tokens / p if p else None,
                   realised_tokens=run.realised_tokens / p if p else None,
                   predicted_ms=run.predicted_ms / p if p else None, realised_ms=run.realised_ms / p if p else None)


def plain_steps(curve: Mapping[int, float], n: int) -> float | None:
    """curve[n] / curve[1], linear between the sizes measured; None without a one-token time or
    outside the sizes measured (no extrapolation)."""
    if curve.get(1, 0) <= 0 or not min(curve) <= n <= max(curve):
        return None
    return interpolate_cost(curve, n) / curve[1]
