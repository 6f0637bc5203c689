"""A target's compiled forward and what was chosen for it on this machine, as one object.

Contract: `CompiledForward.build(target)` compiles an HFTarget's base forward and output layer
(respec/accel/compiled.py) without running them; the target keeps it as `target.fast` and asks it
three things, nothing else: `runs(rows)` (does a step forward of `rows` rows go through the
graphs, or eagerly: trees past the buckets where eager measured faster), `forward(target, kwargs)`
(the base model's outputs for a step, padded to its static graph and cut back) and `logits(hidden,
tokens, parents)` (the output layer fused with the step's numbers). `enable(target)` pays the
compiles and measures the machine's choices (which static buckets pay, from which row count trees
run eagerly: respec/accel/graph_choice.py; RESPEC_PAD_ROWS / RESPEC_EAGER_FROM force them,
respec/accel/settings.py); `describe()` says what was chosen in one line. The target's eager path
never reaches this module: with respec.accel unimportable, HFTarget runs eagerly.
"""
from __future__ import annotations

import sys
from typing import Callable

import torch

from respec.accel.compiled import (branching_tree, bucket_edges, bucket_for, compile_base, compile_logits, first_rows,
                                   forced_buckets, one_row_as_two, one_row_options, pad_one_token, pad_rows,
                                   tree_buckets, warm_up)
from respec.accel.graph_choice import choose_buckets, choose_eager_from, fastest_of_rounds, forced_eager_from
from respec.models.kv import reserve


class CompiledForward:
    """One target's compiled graphs and the choices measured for them (see the module docstring)."""

    def __init__(self, base, logits, *, buckets: tuple[int, ...], pad_one: bool, two_rows: bool) -> None:
        self.base = base                      # compiled base forward (compiled.compile_base)
        self.logits = logits                  # compiled output layer + numbers (compiled.compile_logits)
        self.buckets = buckets                # forwards of 3+ rows padded to these (compiled.tree_buckets)
        self.pad_one = pad_one                # one-token steps run as two rows (compiled.one_row_as_two)
        self.two_rows = two_rows              # two-token chains have a static graph
        self.feature_graphs = False           # graphs returning layer inputs warmed up
        self.bucket_choice: dict[int, tuple[int, float, float]] = {}   # what kept or dropped each bucket
        self.eager_from: int | None = None    # forwards of this many rows and more run eagerly
        self.eager_choice: tuple[int, float, float] | None = None      # what decided it

    @classmethod
    def build(cls, target) -> "CompiledForward":
        buckets = tree_buckets(target.device, target.dtype)
        return cls(compile_base(target.base_model, buckets), compile_logits(target), buckets=buckets,
                   pad_one=one_row_as_two(target.device, target.dtype),
                   two_rows=one_row_options(target.device) is not None)

    # ------------------------------------------------------------------ the three questions
    def runs(self, rows: int) -> bool:
        """Whether a step forward of `rows` rows runs through the compiled graphs."""
        return self.eager_from is None or rows < self.eager_from

    def forward(self, target, kwargs: dict):
        """The base model's outputs of a step forward (kwargs as HFTarget._forward's) through the
        compiled graphs: a one-token step as a two-token chain where `pad_one`, a tree of 3+ rows
        padded to its bucket's static graph, the cache's slabs grown beforehand (no growth inside
        a graph); the extra rows leave the cache and the outputs after."""
        rows = int(kwargs["input_ids"].shape[1])
        padded = self.pad_one and rows == 1 and kwargs.get("attention_mask") is None
        extra = -1
        if padded:
            kwargs = pad_one_token(kwargs)
        bucket = bucket_for(self.buckets, rows)
        if bucket is not None:
            extra = bucket - rows
            kwargs = pad_rows(kwargs, bucket, target.kv_len, target.dtype)
            kwargs["static"] = True
        reserve(target.cache, int(kwargs["input_ids"].shape[1]))
        if target.feature_layers is not None:   # a compiled graph runs no hooks added after it: ask for outputs
            kwargs["output_hidden_states"] = True
        out = self.base(**{target.cache_keyword: target.cache}, use_cache=True, **kwargs)
        if padded:
            target.cache.crop(-1)
            return first_rows(out, 1)
        if extra >= 0:                          # padded to the bucket: its extra rows leave the cache
            if extra:
                target.cache.crop(-extra)
            return first_rows(out, rows)
        return out

    def cost_sizes(self) -> tuple[int, ...]:
        """Tree sizes where a compiled forward's cost steps (compiled.bucket_edges), for the curve."""
        return bucket_edges(self.buckets, self.two_rows)

    # ------------------------------------------------------------------ paying and choosing
    def enable(self, target, progress: bool = True, pause: Callable[[], None] | None = None) -> float:
        """Pay the compiles (compiled.warm_up) and measure the machine's choices; returns the
        warm-up's seconds. `target.fast` must already be this object (the warm-up runs steps)."""
        seconds = warm_up(target, progress=progress, pause=pause)
        self.choose(target, pause)
        if progress:
            print(self.describe(), file=sys.stderr)
        return seconds

    def choose(self, target, pause: Callable[[], None] | None = None) -> None:
        """The machine's choices over the warmed-up graphs: which static buckets pay (measured,
        unless RESPEC_PAD_ROWS forced them at build: then kept as forced, no record) and from which
        row count trees run eagerly (measured, unless RESPEC_EAGER_FROM forces it: no record)."""
        if self.buckets and forced_buckets() is None:        # defaults are checked on this machine
            self.buckets, self.bucket_choice = choose_buckets(self.buckets, self._timer(target, "buckets", pause))
        else:
            self.bucket_choice = {}
        first = max(self.buckets, default=2) + 1              # the symbolic graph's fewest rows
        forced = forced_eager_from()
        self.eager_choice = None
        if forced != "":
            self.eager_from = forced
        elif first <= target.context_length // 2:            # room for it after the timing prefill
            self.eager_from, self.eager_choice = choose_eager_from(first, self._timer(target, "eager_from", pause))

    def warm_up(self, target, progress: bool = True, pause: Callable[[], None] | None = None) -> float:
        """The warm-up alone (compiled.warm_up), the choices kept: a second enable_compile."""
        return warm_up(target, progress=progress, pause=pause)

    def features_changed(self, target) -> None:
        """The target now returns layer inputs: those are other graphs, warmed up once."""
        if not self.feature_graphs:
            warm_up(target)
            self.feature_graphs = True

    def describe(self) -> str:
        """One line: the static row counts in use and, where measured, what kept or dropped each."""
        measured = "; ".join(f"{b} rows: {rows} padded {padded:.1f} ms against {symbolic:.1f} unpadded, "
                             + ("kept" if b in self.buckets else "dropped")
                             for b, (rows, padded, symbolic) in self.bucket_choice.items())
        text = (f"compiled trees padded to static graphs of {', '.join(map(str, self.buckets)) or 'none'} rows"
                + (f" ({measured})" if measured else ""))
        if self.eager_choice is not None:
            rows, symbolic, eager = self.eager_choice
            text += (f"; larger trees run {'eagerly' if self.eager_from else 'compiled'} ({rows} rows: "
                     f"{symbolic:.1f} ms compiled against {eager:.1f} eager)")
        return text

    def _timer(self, target, setting: str, pause=None):
        """choose_buckets' / choose_eager_from's `time_pair`: ms of a branching tree forward of
        `rows` rows with `setting` ("buckets": padded to `bucket` and unpadded; "eager_from":
        through the symbolic-row graph and eagerly) at a 256-token context in a scratch cache,
        the fastest of 5 interleaved rounds after one untimed call each (`pause`: before each
        round); the setting is restored after."""
        def time_pair(*args) -> tuple[float, ...]:
            rows = args[-1]
            ways = [(args[0],), ()] if setting == "buckets" else [None, rows]
            tree, saved = branching_tree(rows), getattr(self, setting)

            def run_ms(way) -> float:
                setattr(self, setting, way)
                return target.timed_tree(tree)
            try:
                with torch.inference_mode(), target.prefilled_scratch(min(256, target.context_length // 2)):
                    return fastest_of_rounds(ways, run_ms, 5, pause)
            finally:
                setattr(self, setting, saved)
        return time_pair
