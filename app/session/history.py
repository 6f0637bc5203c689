"""Run history for tuning thresholds by hand: one row per Compare run, a pinned baseline "A", the
deltas of later runs against it, and the median and spread of repeated runs.

Contract: pure Python over plain values (no Gradio, no model, no I/O). Inputs are the JSON-ready metrics of `render.run_metrics`
(the page computes them from its finished runs, the API reads them from `/compare`'s metrics JSON),
one dict per repeat and column ("respec", "eagle", "vanilla"), plus the output token ids.

* `MethodEntry`: one column of one row. tokens/s is kept per repeat (`median`, `low`, `high`);
  speedup is the median over repeats, "measured" when vanilla ran in the same run, else
  "estimated"; MAT (mean accepted length), trigger rate, retrieval share (steps drafted by
  retrieval / steps, as in `respec bench`), relaxed tokens and "equal to vanilla" come from the last
  repeat (greedy repeats write the same tokens: only timing varies).
* `HistoryRow`: number (1, 2, … within a session), time, prompt, model, every control's value
  (`settings`, what "restore A's settings" puts back), the settings that differ from the device
  defaults (`changed`), repeats and the entries.
* `History`: at most `max_rows` rows (oldest dropped first; RESPEC_MAX_HISTORY, default 50); the
  pinned row "A" is kept even after it leaves the table; `clear()` empties it and restarts the
  numbering. `compare_rows(a, b)` gives the deltas of b against a per column, with a noise verdict:
  "within" when the tokens/s ranges (min–max over repeats) of a and b overlap, "outside" when they
  do not, None when neither was repeated (two single timings cannot tell noise from a change).
* `HistoryStore`: histories keyed by an API client's session, least recently used dropped first.

Its views (table, CSV, /history JSON, plot, summary) live in `app.views.history_view`.
"""
from __future__ import annotations

import array
import math
import statistics
from collections import OrderedDict
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Mapping, Sequence

from app.session.settings import COLUMN_METHODS, SPEC_BY_KEY, SPECS, Caps, _num_eq, env_int, method_label, non_default
from app.views.render import first_difference

#: Columns in display order and their names in the table.
COLUMNS: tuple[str, ...] = tuple(COLUMN_METHODS)
COLUMN_NAMES = {col: method_label(method) for col, method in COLUMN_METHODS.items()}
DEFAULT_MAX_ROWS = 50


def max_rows_from_env() -> int:
    """RESPEC_MAX_HISTORY: rows a session's history keeps (default 50)."""
    return env_int("RESPEC_MAX_HISTORY", DEFAULT_MAX_ROWS)


# ------------------------------------------------------------------------------- rows
@dataclass(frozen=True)
class MethodEntry:
    column: str                              # "respec" | "eagle" | "vanilla"
    method: str                              # the engine method that ran in this column
    tokens_per_s: tuple[float, ...]          # one per repeat
    speedup: float | None                    # median over repeats
    speedup_kind: str                        # "measured" (vanilla ran) | "estimated"
    mean_accepted_length: float
    trigger_rate: float | None               # None: the method has no entropy trigger
    retrieval_share: float | None            # steps drafted by retrieval / steps (None: no steps)
    relaxed_tokens: int
    new_tokens: int
    equal_to_vanilla: bool | None            # None: vanilla did not run
    tokens: array.array = field(default_factory=lambda: array.array("i"), repr=False)   # output ids (diff)

    @property
    def repeats(self) -> int:
        return len(self.tokens_per_s)

    @property
    def median(self) -> float:
        return float(statistics.median(self.tokens_per_s)) if self.tokens_per_s else 0.0

    @property
    def low(self) -> float:
        return min(self.tokens_per_s) if self.tokens_per_s else 0.0

    @property
    def high(self) -> float:
        return max(self.tokens_per_s) if self.tokens_per_s else 0.0

    @property
    def spread(self) -> float | None:
        """max − min of tokens/s over the repeats (None for a single run)."""
        return self.high - self.low if self.repeats > 1 else None

    @property
    def spread_pct(self) -> float | None:
        """Half the spread as a percentage of the median (the "±" of the page)."""
        if self.spread is None or self.median <= 0:
            return None
        return 50.0 * self.spread / self.median


@dataclass(frozen=True)
class HistoryRow:
    number: int
    time: str                                # wall-clock "HH:MM:SS" of the run's end
    prompt: str
    model: str
    settings: dict[str, Any]                 # every control's value (SPECS keys + "tree.auto")
    changed: dict[str, Any]                  # the settings that differ from the device defaults
    entries: dict[str, MethodEntry]          # by column, in COLUMNS order
    source: str = "page"                     # "page" | "api"

    @property
    def repeats(self) -> int:
        return max((e.repeats for e in self.entries.values()), default=0)

    @property
    def label(self) -> str:
        """The settings that differ from the defaults, short ("θ_H=1.5, L_min=3" or "defaults")."""
        return settings_label(self.changed)

    def choice(self) -> str:
        """How the pin picker names this row."""
        return f"#{self.number} · {self.time} · {self.label}"


def short_name(key: str) -> str:
    """A setting's short name: the label of its control without the unit ("θ_H", "L_min", "auto")."""
    if key == "tree.auto":
        return "auto"
    spec = SPEC_BY_KEY.get(key)
    return spec.label.split(" (")[0] if spec is not None else key


def fmt_value(v: Any) -> str:
    if isinstance(v, bool):
        return "on" if v else "off"
    if isinstance(v, float):
        return f"{v:g}"
    return str(v)


def settings_label(changed: Mapping[str, Any]) -> str:
    return ", ".join(f"{short_name(k)}={fmt_value(v)}" for k, v in changed.items()) or "defaults"


def changed_settings(settings: Mapping[str, Any], device: str = "cpu", caps: Caps | None = None) -> dict[str, Any]:
    """The settings that differ from the device defaults (what the page's preset "device defaults"
    would set), in the order of the settings panel."""
    diff = non_default(settings, device, caps)
    order = [s.key for s in SPECS] + ["tree.auto"]
    return {k: diff[k] for k in order if k in diff} | {k: v for k, v in diff.items() if k not in order}


def settings_changes(a: Mapping[str, Any], b: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, value in a, value in b) for every setting whose value differs between two rows."""
    return [(k, a.get(k), b.get(k)) for k in dict.fromkeys([*a, *b]) if not _num_eq(a.get(k), b.get(k))]


def _retrieval_share(m: Mapping[str, Any]) -> float | None:
    steps = m.get("steps") or 0
    if not steps:
        return None
    return (m.get("steps_by_source") or {}).get("retrieval", 0) / steps


def _median(values: Iterable[float | None]) -> float | None:
    vals = [float(v) for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return float(statistics.median(vals)) if vals else None


def entry_from_metrics(column: str, repeats: Sequence[Mapping[str, Any]], tokens: Sequence[int] = (),
                       equal_to_vanilla: bool | None = None) -> MethodEntry:
    """One column's entry from its `render.run_metrics` dicts, one per repeat (at least one)."""
    if not repeats:
        raise ValueError("an entry needs the metrics of at least one run")
    last = repeats[-1]
    kinds = {m.get("speedup_kind") for m in repeats}
    return MethodEntry(
        column=column, method=str(last.get("method", column)),
        tokens_per_s=tuple(float(m.get("tokens_per_s") or 0.0) for m in repeats),
        speedup=_median(m.get("speedup") for m in repeats),
        speedup_kind="measured" if kinds == {"measured"} else "estimated",
        mean_accepted_length=float(last.get("mean_accepted_length") or 0.0),
        trigger_rate=last.get("trigger_rate"), retrieval_share=_retrieval_share(last),
        relaxed_tokens=int(last.get("relaxed_tokens") or 0), new_tokens=int(last.get("new_tokens") or 0),
        equal_to_vanilla=equal_to_vanilla, tokens=array.array("i", [int(t) for t in tokens]))


def build_row(prompt: str, model: str, settings: Mapping[str, Any], changed: Mapping[str, Any],
              metrics: Mapping[str, Sequence[Mapping[str, Any]]], tokens: Mapping[str, Sequence[int]],
              time: str, source: str = "page", equal_to_vanilla: Mapping[str, bool] | None = None) -> HistoryRow:
    """A row (number 0: `History.add` numbers it) from each column's metrics per repeat and its
    output tokens. "Equal to vanilla" comes from `equal_to_vanilla` when given (the API's metrics
    say it), else from comparing tokens with vanilla's when vanilla ran."""
    vanilla = tokens.get("vanilla") if "vanilla" in metrics else None
    entries = {}
    for col in COLUMNS:
        if col not in metrics or not metrics[col]:
            continue
        toks = list(tokens.get(col, ()))
        if equal_to_vanilla is not None and col in equal_to_vanilla:
            eq = bool(equal_to_vanilla[col])
        else:
            eq = None if vanilla is None else toks == list(vanilla)
        entries[col] = entry_from_metrics(col, metrics[col], toks, eq)
    return HistoryRow(number=0, time=time, prompt=str(prompt), model=str(model), settings=dict(settings),
                      changed=dict(changed), entries=entries, source=source)


# ------------------------------------------------------------------------------- deltas
@dataclass(frozen=True)
class MethodDelta:
    column: str
    tps_a: float                              # median tokens/s of A
    tps_b: float                              # median tokens/s of the later run
    change_pct: float | None                  # (b − a) / a in %
    noise: str | None                         # "within" | "outside" the spread | None (neither repeated)
    mat_a: float
    mat_b: float
    identical: bool                           # same output tokens
    first_difference: int | None              # index of the first differing token (None if identical)


@dataclass(frozen=True)
class Delta:
    a: HistoryRow
    b: HistoryRow
    methods: dict[str, MethodDelta]
    settings: list[tuple[str, Any, Any]]     # (key, value in A, value in B)


def noise_verdict(a: MethodEntry, b: MethodEntry) -> str | None:
    """"within" when the tokens/s ranges of the two rows overlap, "outside" when they do not; None
    when neither was repeated (a single run has no spread to compare with)."""
    if a.repeats < 2 and b.repeats < 2:
        return None
    return "within" if a.low <= b.high and b.low <= a.high else "outside"


def compare_rows(a: HistoryRow, b: HistoryRow) -> Delta:
    """The deltas of row b against row a, for every column both ran."""
    out = {}
    for col in COLUMNS:
        ea, eb = a.entries.get(col), b.entries.get(col)
        if ea is None or eb is None:
            continue
        first = first_difference(ea.tokens, eb.tokens)
        out[col] = MethodDelta(
            column=col, tps_a=ea.median, tps_b=eb.median,
            change_pct=100.0 * (eb.median - ea.median) / ea.median if ea.median > 0 else None,
            noise=noise_verdict(ea, eb), mat_a=ea.mean_accepted_length, mat_b=eb.mean_accepted_length,
            identical=first is None, first_difference=first)
    return Delta(a=a, b=b, methods=out, settings=settings_changes(a.settings, b.settings))


# ------------------------------------------------------------------------------- the history
@dataclass
class History:
    max_rows: int = field(default_factory=max_rows_from_env)
    rows: list[HistoryRow] = field(default_factory=list)
    pinned: HistoryRow | None = None
    next_number: int = 1

    def add(self, row: HistoryRow) -> HistoryRow:
        """Number the row, append it, and drop the oldest rows beyond `max_rows`."""
        row = replace(row, number=self.next_number)
        self.next_number += 1
        self.rows.append(row)
        del self.rows[:max(0, len(self.rows) - max(1, self.max_rows))]
        return row

    def get(self, number: int) -> HistoryRow | None:
        try:
            number = int(number)
        except (TypeError, ValueError):
            return None
        if self.pinned is not None and self.pinned.number == number:
            return self.pinned
        return next((r for r in self.rows if r.number == number), None)

    def pin(self, number: int) -> HistoryRow:
        """Pin row `number` as the baseline A (KeyError if there is no such row)."""
        row = self.get(number)
        if row is None:
            raise KeyError(f"no run #{number} in the history")
        self.pinned = row
        return row

    def unpin(self) -> None:
        self.pinned = None

    def clear(self) -> None:
        self.rows.clear()
        self.pinned = None
        self.next_number = 1

    @property
    def latest(self) -> HistoryRow | None:
        return self.rows[-1] if self.rows else None

    def delta(self, row: HistoryRow | None = None) -> Delta | None:
        """Deltas of `row` (default: the latest) against A; None without A or when row is A."""
        row = row or self.latest
        if self.pinned is None or row is None or row.number == self.pinned.number:
            return None
        return compare_rows(self.pinned, row)


class HistoryStore:
    """Histories of API clients, keyed by their session, least recently used dropped beyond
    `capacity` (the page keeps its history in the tab's session state instead)."""

    def __init__(self, capacity: int = 300, max_rows: int | None = None) -> None:
        self.capacity = max(1, int(capacity))
        self.max_rows = max_rows
        self._by_key: OrderedDict[str, History] = OrderedDict()

    def get(self, key: str) -> History:
        key = str(key)
        hist = self._by_key.pop(key, None)
        if hist is None:
            hist = History() if self.max_rows is None else History(max_rows=self.max_rows)
        self._by_key[key] = hist
        while len(self._by_key) > self.capacity:
            self._by_key.popitem(last=False)
        return hist

    def __len__(self) -> int:
        return len(self._by_key)
