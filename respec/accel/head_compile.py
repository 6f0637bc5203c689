"""A compiled EAGLE head (`--compile on`): the head's layer and draft output layer through `torch.compile`.

Contract:
- `CompiledHead.of(head, target)` compiles `head`'s eager forward (`EagleHead.eager_forward`: the
  fc, one decoder layer, RoPE, the causal mask when none is given) and its draft output layer
  (`EagleHead.draft_output_layer`, built once) with inductor and dynamic shapes, so a graph compiles once
  for any row count, context length and cache capacity (dynamo gives one-row calls, and calls
  with and without a mask, graphs of their own). An EAGLE-1/2 and an EAGLE-3
  head compile alike: what compiles is the head's own forward.
- On the CPU (`compiled.one_row_options`), calls of up to SMALL_ROWS rows (a step's catch-up, a
  tree layer of the default top_k 4), with or without a mask, go to graphs of their own whose
  rows are static and whose linears are autotuned like the target's small-row graphs (inductor's
  C++ micro-GEMM against oneDNN, each linear timed at compile time): on the default model (bf16,
  2-core AMD EPYC Zen 4, commit 596dea9 of 2026-12-06, a throwaway script over a 200-row cache) a head call of 1-4
  rows took 0.50-0.70 ms against 1.16-1.28 ms in the symbolic-row graph, for a warm-up of 119 s
  against 33 s. Larger calls keep the symbolic-row graph, unless eager calls measured clearly
  faster at the end of the warm-up (`choose_eager`, graph_choice.choose_eager_from): bf16 on a CPU
  without bf16 instructions, where 17 rows took 82.6 ms compiled against 18.4 eager (commit 671c23f of 2026-12-07);
  then calls of SMALL_ROWS + 1 rows and more, and their draft logits, run eagerly.
- `CompiledHead.forward` serves calls over a cache that already holds rows; over an empty cache
  (the head's first catch-up of a prompt, the probe's scratch window) the first row runs eagerly,
  so lazy buffer creation never enters a graph, and the rest of a causal feed through the graph
  (a tree-masked or one-row call over an empty cache stays eager). The cache's slabs are grown
  before each call (`reserve`), so no growth happens inside a graph either.
- Both run `Trusted` (respec/accel/compiled.py): after the warm-up, only the guards that tell
  the graphs apart are evaluated.
- `warm_up()` pays the compiles: one-row and tree batches (every small row count), with and without a mask, before and
  after the cache's first growth, and the draft output layer at one and several rows, in a
  throwaway cache, with a progress line; then times the head's row (`EagleHead.row_ms`, which the
  cost model reads at a request's first probe), so no request pays a compile or that timing.
  `HFTarget.enable_compile` compiles the target; an `Eagle2Drafter` asks its target to prepare
  its head (`HFTarget.prepare_head` -> `prepare_head` below): on a compiled target the head
  compiles (once per head and target), on an eager one it gets its eager linear plan.
- `compile_head`, `compile_head_for`, `adopt_compiled_head`, `plan_head_linears` install a head's
  speed through its slots (`EagleHead.install_route`, `install_eager_plan`); the head itself
  never imports this module.
- The draft output layer goes, per row count, the fastest of three ways measured at the end of
  the warm-up (`choose_routes`, `ROUTE_ROWS`): the compiled graph, eager `F.linear`, or eager
  W @ x^T (respec/accel/linear_layout.py; not offered under RESPEC_LINEAR_LAYOUT=off); an eager
  way only where it takes under ROUTE_MARGIN of the compiled one's time, and rows between two
  measured counts go eager only where both agree (none above the largest; never on a GPU). On a
  2-core AMD EPYC Zen 3 (float32, 8,192 x 576 rows) the compiled layer took 1.33 ms at one row
  and 2.6 ms at 2-4 rows against 0.69 ms eager and 0.67-0.79 ms as W @ x^T (a throwaway
  benchmark, commit 718dcf0 of 2026-12-05): a tree layer of four rows cost ~6 ms of drafting where its 4 rows'
  logits alone cost 4 ms, next to a ~19 ms compiled target step. A fourth way, offered for
  float32 weights up to PRETRANSPOSED_MAX_BYTES, multiplies by a contiguous copy of W^T ([H, V],
  kept only if some row count takes it): the same CPU, one row, caches flushed first as a
  target step flushes them, 0.97 ms against 1.7-2.5 ms for the other three (a GEMV over W's rows
  does not stream; commit 6e56d99 of 2026-12-06, throwaway script). bf16 would halve the bytes (0.74 ms), but
  rounds the drafts' logits; float32 keeps every way equal to rounding.
- Why: on the CPU an eager head call is mostly dispatch. On the default model one head layer plus
  its 8,192-row draft output layer moves ~18 MB (~0.5 ms at the machine's bandwidth) but took
  ~1.2 ms eager; next to a compiled target step (~15 ms), eager drafting weighed 1.5x what it does
  next to an eager step. Compiled and eager heads may round differently in bf16; drafts only
  propose, verification decides, so output stays lossless either way.
Nothing is compiled at import.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from respec.accel.compiled import Trusted, compile_base_settings, one_row_options
from respec.accel.graph_choice import choose_eager_from, fastest_of_rounds, forced_eager_from
from respec.accel.linear_layout import MARGIN as ROUTE_MARGIN
from respec.accel.linear_layout import linear_layouts, transposed_linear
from respec.accel.settings import read_settings
from respec.drafters.heads.eagle import LMHead
from respec.models.attention import additive_mask
from respec.models.kv import INITIAL_CAPACITY, reserve, slab_cache

# head calls of up to this many rows (a step's catch-up, a tree layer of the CPU default top_k 4) run
# static graphs with the small-row options, where the device has them (module docstring)
SMALL_ROWS = 4
ROUTE_ROWS = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16)   # row counts the draft output layer's ways are timed at
ROUTES = ("compiled", "eager", "transposed", "pretransposed")
PRETRANSPOSED_MAX_BYTES = 256 * 2 ** 20   # the pretransposed way (a [H, V] copy) offered for weights up to this


def choose_routes(times: dict[int, dict[str, float]], margin: float = ROUTE_MARGIN) -> dict[int, str]:
    """Per row count, the way to run the draft output layer from measured times {rows: {route: ms}}
    (pure): an eager way where it takes under `margin` of the compiled time (the faster of the
    two eager ways), else compiled. A row count not measured but between two that were takes
    their way where both agree, else compiled; above the largest: compiled (a choice made at 8
    rows must not carry to 12, respec/accel/linear_layout.py). Returns {rows: route} for rows 1
    up to the largest measured, so `draft_logits` does one lookup."""
    chosen: dict[int, str] = {}
    for rows, by_route in times.items():
        fast = min((r for r in by_route if r != "compiled"), key=by_route.__getitem__, default=None)
        compiled = by_route.get("compiled", float("inf"))
        chosen[rows] = fast if fast is not None and by_route[fast] < margin * compiled else "compiled"
    measured = sorted(chosen)
    out: dict[int, str] = {}
    for rows in range(1, (measured[-1] if measured else 0) + 1):
        if rows in chosen:
            out[rows] = chosen[rows]
            continue
        below = max(m for m in measured if m < rows)
        above = min(m for m in measured if m > rows)
        out[rows] = chosen[below] if chosen[below] == chosen[above] else "compiled"
    return out


@dataclass
class CompiledHead:
    """The compiled forward and draft output layer of one head for one target (see the module
    docstring); `warmed` says whether `warm_up` ran."""
    head: torch.nn.Module
    target: object
    forward_fn: Trusted
    logits_fn: Trusted
    layer: object = None              # the draft output layer (an LMHead or the target's lm_head), eager
    warmed: bool = False
    routes: dict = dataclasses.field(default_factory=dict)   # rows -> one of ROUTES
    weight_t: torch.Tensor | None = None   # [H, V or Vd]: the layer's weight, transposed and contiguous
    small_fn: Trusted | None = None   # calls of up to SMALL_ROWS rows, their rows static (None: forward_fn)
    eager_from: int | None = None     # calls of this many rows and more run eagerly (`choose_eager`)
    eager_choice: tuple[int, float, float] | None = None   # what decided it: (rows, compiled ms, eager ms)

    @classmethod
    def of(cls, head, target) -> "CompiledHead":
        compile_base_settings(head.fc.weight.device)
        layer = head.draft_output_layer(target)      # built eagerly, held by the graph (no head state read)

        def logits(out: torch.Tensor) -> torch.Tensor:
            return layer(out)

        def small_rows(emb, feat, positions, cache, mask):     # its own code object, so its own graphs
            return head.eager_forward(emb, feat, positions, cache, mask)

        # dynamic shapes; dynamo still specialises a one-row call into its own graph
        forward_fn = Trusted(torch.compile(head.eager_forward, backend="inductor", dynamic=True))
        logits_fn = Trusted(torch.compile(logits, backend="inductor", dynamic=True))
        options = one_row_options(head.fc.weight.device)
        small_fn = None if options is None else Trusted(
            torch.compile(small_rows, backend="inductor", dynamic=True, options=options))
        return cls(head, target, forward_fn, logits_fn, layer, small_fn=small_fn)

    def forward(self, emb: torch.Tensor, feat: torch.Tensor, positions: torch.Tensor, cache,
                mask: torch.Tensor | None) -> torch.Tensor:
        """EagleHead.forward's contract: emb, feat [q, *], positions [q], mask or None -> [q, H]."""
        if cache.get_seq_length() == 0:
            if mask is not None or emb.shape[0] == 1:
                return self.head.eager_forward(emb, feat, positions, cache, mask)
            # a causal feed over an empty cache: its first row eagerly (the cache's buffers are made
            # there), the rest through the graph (a 250-row prompt: 22.5 ms eager, commit 718dcf0 of 2026-12-05)
            first = self.head.eager_forward(emb[:1], feat[:1], positions[:1], cache, None)         # [1, H]
            return torch.cat([first, self.forward(emb[1:], feat[1:], positions[1:], cache, None)])  # [q, H]
        reserve(cache, int(emb.shape[0]))
        # contiguous inputs: a graph guards on strides, and the search passes expanded features
        args = (emb.contiguous(), feat.contiguous(), positions.contiguous(), cache,
                None if mask is None else mask.contiguous())
        if self.eager_from is not None and emb.shape[0] >= self.eager_from:
            with self.head._planned():
                return self.head.eager_forward(*args)
        if self.small_fn is None or emb.shape[0] > SMALL_ROWS:
            return self.forward_fn(*args)
        for t in args[:3]:
            torch._dynamo.mark_static(t, 0)                   # [q, *]: the rows stay static
        if args[4] is not None:
            torch._dynamo.mark_static(args[4], 2)             # [1, 1, q, kv + q]
        return self.small_fn(*args)

    def draft_logits(self, out: torch.Tensor) -> torch.Tensor:
        """out [q, H] -> logits [q, V or Vd] (EagleHead.draft_logits' contract), the way
        `routes` names for q rows (where nothing was measured: compiled, or eager from `eager_from` rows)."""
        q = int(out.shape[0])
        return self.run_route(self.routes.get(q, "eager" if self.eager_from is not None and q >= self.eager_from
                                              else "compiled"), out)

    def run_route(self, route: str, out: torch.Tensor) -> torch.Tensor:
        """The draft output layer over out [q, H] one given way (ROUTES) -> [q, V or Vd]."""
        if route == "compiled":
            return self.logits_fn(out.contiguous())
        layer = self.layer
        if route == "eager" or not hasattr(layer, "weight") or getattr(layer, "softcap", None):
            return layer(out)
        if route == "pretransposed":
            if self.weight_t is None:
                self.weight_t = layer.weight.t().contiguous()                              # [H, V]
            y = torch.mm(out.to(layer.weight.dtype), self.weight_t)                       # [q, V]
            return y if layer.bias is None else y + layer.bias
        return transposed_linear(out.to(layer.weight.dtype), layer.weight, layer.bias)

    def measure_routes(self, rows: tuple[int, ...] = ROUTE_ROWS, rounds: int = 3) -> dict[int, str]:
        """Time the draft output layer's ways (ROUTES; the transposed one only where
        RESPEC_LINEAR_LAYOUT allows) at each of `rows`, interleaved, the fastest of `rounds`
        after one untimed call each, and set `routes` (`choose_routes`). CPU heads only; a
        GPU head keeps the compiled layer everywhere."""
        dev = self.head.fc.weight.device
        if dev.type != "cpu":
            self.routes = {}
            return self.routes
        ways = ["compiled", "eager"]
        if read_settings().linear_layout != "off":
            ways.append("transposed")
            weight = getattr(self.layer, "weight", None)
            if (weight is not None and weight.dtype == torch.float32 and not getattr(self.layer, "softcap", None)
                    and weight.numel() * weight.element_size() <= PRETRANSPOSED_MAX_BYTES):
                ways.append("pretransposed")
        width = self.head.config.hidden_size
        times: dict[int, dict[str, float]] = {}
        with torch.inference_mode():
            for q in rows:
                x = torch.randn(q, width, dtype=self.head.fc.weight.dtype, device=dev)        # [q, H]

                def run_ms(way: str) -> float:
                    t0 = time.perf_counter()
                    self.run_route(way, x)
                    return (time.perf_counter() - t0) * 1000
                times[q] = dict(zip(ways, fastest_of_rounds(ways, run_ms, rounds)))
        self.routes = choose_routes(times)
        if "pretransposed" not in self.routes.values():
            self.weight_t = None            # the copy is kept only where a row count reads it
        return self.routes

    @torch.inference_mode()
    def choose_eager(self, context: int = 64, rounds: int = 3) -> int | None:
        """Time one call of the symbolic-row graph's fewest rows (SMALL_ROWS + 1 with small-row graphs,
        else 2) after `context` cached rows, with its draft logits, compiled and eagerly (the fastest
        of `rounds` after one untimed call each), and set `eager_from` (graph_choice.choose_eager_from;
        RESPEC_EAGER_FROM forces it as for the target). bf16 on a CPU without bf16 instructions
        (commit 671c23f of 2026-12-07): 17 rows took 82.6 ms compiled against 18.4 eager."""

        forced = forced_eager_from()
        if forced != "":
            self.eager_from, self.eager_choice = forced, None
            return self.eager_from
        head, target = self.head, self.target
        dev, dtype = head.fc.weight.device, head.fc.weight.dtype
        feat_width = head.fc.in_features // (1 if head.feature_layers is not None else 2)
        rows = SMALL_ROWS + 1 if self.small_fn is not None else 2
        n = context + rows
        emb = target.embed(torch.arange(n, device=dev) % 100)                                   # [n, H]
        feat = torch.randn(n, feat_width, dtype=dtype, device=dev)                              # [n, F]
        pos = torch.arange(n, device=dev)
        cache = slab_cache(head.config)
        head.feed_context(emb[:context], feat[:context], pos[:context], cache)

        def run_ms(way: int | None) -> float:
            self.eager_from = way
            t0 = time.perf_counter()
            self.draft_logits(self.forward(emb[context:], feat[context:], pos[context:], cache, None))
            ms = (time.perf_counter() - t0) * 1000
            cache.crop(-rows)
            return ms

        def time_pair(q: int) -> tuple[float, float]:
            return fastest_of_rounds([None, q], run_ms, rounds)

        self.eager_from, self.eager_choice = choose_eager_from(rows, time_pair)
        return self.eager_from

    def describe_routes(self) -> str:
        """One line: which row counts the draft output layer runs eagerly, and how."""
        eager = {r: w for r, w in self.routes.items() if w != "compiled"}
        text = ("draft output layer: compiled at every row count" if not eager else "draft output layer: "
                + ", ".join(f"{r} rows {w}" for r, w in sorted(eager.items())) + "; compiled otherwise")
        if self.eager_from is not None:
            text += f"; head calls of {self.eager_from} rows and more eager"
        if self.eager_choice is not None:
            rows, compiled, eager_ms = self.eager_choice
            text += f" ({rows} rows: {compiled:.1f} ms compiled against {eager_ms:.1f} eager)"
        return text

    @torch.inference_mode()
    def warm_up(self, progress: bool = True, pause=None) -> float:
        """Run the calls that trigger the compiles (see the module docstring); returns seconds.
        `pause`, when given, is called before each shape (respec/accel/compiled.py warm_up)."""
        from tqdm.auto import tqdm


        t0 = time.perf_counter()
        fns = [fn for fn in (self.forward_fn, self.logits_fn, self.small_fn) if fn is not None]
        for fn in fns:
            fn.trusted = False                                          # every guard while warming up
        head, target = self.head, self.target
        dev, dtype = head.fc.weight.device, head.fc.weight.dtype
        feat_width = head.fc.in_features // (1 if head.feature_layers is not None else 2)
        cache = slab_cache(head.config)

        def call(emb: torch.Tensor, feat: torch.Tensor, masked: bool) -> torch.Tensor:
            q, kv = emb.shape[0], cache.get_seq_length()
            mask = additive_mask(~torch.eye(q, dtype=torch.bool, device=dev), kv, dtype) if masked else None
            return self.forward(emb, feat, torch.arange(kv, kv + q, device=dev), cache, mask)   # [q, H]

        def feed(q: int, masked: bool) -> None:
            emb = target.embed(torch.arange(q, device=dev) % 100)                           # [q, H]
            out = call(emb, torch.zeros(q, feat_width, dtype=dtype, device=dev), masked)   # feat [q, F]
            self.draft_logits(out)
            if head.feature_layers is not None:         # EAGLE-3 depths >= 2 feed the head's own output
                call(emb, out, masked)

        # (rows, tree mask?) per call; the long feed grows the slab past its first capacity; with
        # small-row graphs, every row count up to SMALL_ROWS with and without a mask, on both sides
        small = [(q, m) for m in (False, True) for q in range(1, SMALL_ROWS + 1)] if self.small_fn else \
            [(1, False), (3, False), (2, False), (1, True), (4, True), (3, True)]
        plan = [(24, False), *small, (8, False), (8, True), (INITIAL_CAPACITY, False), *small]
        for q, masked in tqdm(plan, desc="compiling the EAGLE head (once per process)", disable=not progress,
                              unit="shape"):
            if pause is not None:
                pause()
            feed(q, masked)
        self.warmed = True
        for fn in fns:
            fn.trusted = True
        self.measure_routes()        # the output layer's fastest way per row count (module docstring)
        self.choose_eager()
        head.row_ms(target)          # timed now, on the compiled head: a first request does not pay it
        return time.perf_counter() - t0


# ---------------------------------------------------------------------- installing a head's speed
def compile_head(head, target, progress: bool = True) -> float:
    """Compile `head`'s forward and draft output layer for `target` and pay the compiles now;
    returns the warm-up's seconds (0 when already done for this target)."""
    route = head.route
    if route is not None and route.target is target and route.warmed:
        return 0.0
    compiled = CompiledHead.of(head, target)
    head.install_route(compiled)
    return compiled.warm_up(progress=progress)


def compile_head_for(head, twin, progress: bool = True, pause=None) -> "CompiledHead":
    """A CompiledHead for `twin` (HFTarget.twin of the target `head` serves), warmed up but not
    installed: the head keeps drafting eagerly meanwhile (a background compile; then
    `adopt_compiled_head`; `pause`: see CompiledHead.warm_up)."""
    compiled = CompiledHead.of(head, twin)
    compiled.warm_up(progress=progress, pause=pause)
    return compiled


def adopt_compiled_head(head, compiled: "CompiledHead", target) -> None:
    """Draft for `target` with `compiled` (`compile_head_for` on a twin of it, the same weights)
    from now on; the head's row is timed again, compiled (between steps: the app holds its lock)."""
    if not compiled.warmed or compiled.head is not head:
        raise ValueError("adopt_compiled_head takes this head's warmed-up CompiledHead (compile_head_for)")
    compiled.target = target
    head.install_route(compiled)
    head.row_ms(target)


def plan_head_linears(head, target):
    """Measure, once per target, which of `head`'s eager linears (its own and the draft output
    layer) run faster as W @ x^T or, at one row, as two rows (respec/accel/linear_layout.py;
    RESPEC_LINEAR_LAYOUT applies); the head's eager calls without gradients follow the plan from
    then on. Returns the plan."""
    if head.eager_plan is None or head.eager_plan[0] is not target:
        layer = head.draft_output_layer(target)
        head.install_eager_plan(target, linear_layouts(head, extra=(layer,) if isinstance(layer, LMHead) else ()))
    return head.eager_plan[1]


def prepare_head(head, target) -> None:
    """What a drafter on `target` asks for (HFTarget.prepare_head): a compiled head on a compiled
    target, else the head's own eager linear plan."""
    if target.compiled:
        compile_head(head, target)
    else:
        plan_head_linears(head, target)
