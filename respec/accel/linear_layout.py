"""Small-row linears handed to the BLAS the way round this machine runs them fastest (eager CPU forwards).

Contract:
- A linear y = x W^T over m rows (x [m, k], W [n, k]) is one GEMM, and which way round it reaches
  the BLAS matters on some CPUs: on a 2-core AMD EPYC Zen 3 (AVX2, no AVX-512; float32 through
  MKL) the default model's 210 decoder linears (30 layers, distinct weights) took 45 ms at 2 rows
  as `F.linear` and 21 ms as W @ x^T ([n, k] @ [k, m], transposed back), 65 against 41 ms at 16
  rows, the same at one row (one GEMV either way; a throwaway benchmark, commit 1454bb1 of 2026-12-05). A verify of
  two tokens then cost 1.67x a one-token step, and no EAGLE draft paid.
- `measure_layouts(model)` times both ways, for each distinct weight shape among the model's
  `nn.Linear` modules, over every module of that shape (their distinct weights, as a forward reads
  them; the fastest of a few interleaved rounds), at the row counts of ROWS in turn until W @ x^T
  stops taking under MARGIN of `F.linear`'s time, and returns a `LinearLayouts`: per shape the
  largest row count up to which it won at every count measured. Only a bound, not a set of buckets:
  on that CPU W @ x^T won at 2-8 rows, lost at 12 and tied at 16 (whole forwards of 12 rows 112 ms
  against 87), so a choice made at 8 rows must not carry to 12. CPU weights only (a model elsewhere
  gets an empty plan); about 2 s on the default model.
- One row: a GEMV, which some BLAS builds run far below the machine's bandwidth (MKL's float32
  sgemv on a 2-core AMD EPYC Zen 4: the default model's one-token step took 46.5 ms, against 32.8
  ms with every linear run as `padded_linear`, the row twice through the two-column GEMM, the
  second column dropped; commit 2d499a9 of 2026-12-06). `measure_layouts` also times that per shape and plans it
  (`LinearLayouts.one_row`) under the same MARGIN; in bf16 on that CPU it lost and nothing changed.
- `LinearLayouts.active(rows)`: a context under which `F.linear` calls whose weight shape is
  planned up to at least `rows` rows run as mm(W, x^T)^T (+ bias), or at one row as
  `padded_linear` for the one-row shapes, every other call unchanged; a no-op context when nothing
  is planned for that row count. The model is not modified: HFTarget enters it around eager
  forwards only, so compiled graphs never see it.
- An eager EAGLE head gets a plan of its own (`linear_layouts(head, extra=(draft output layer,))`,
  entered per call through `LinearLayouts.per_call`: its calls mix row counts). On the 2-core AMD
  EPYC Zen 4 in float32, a head call plus its 8,192-row draft output layer took 2.2 / 2.4 / 2.8 ms
  at 1 / 2 / 4 rows with every head linear swapped against 3.8 / 7.0 / 5.5 ms plain (commit 2d499a9 of 2026-12-06,
  a throwaway script). (On a Zen 3, commit 1454bb1 of 2026-12-05, whole drafts had timed too unsteadily to plan.)
- `linear_layouts(model)` reads RESPEC_LINEAR_LAYOUT: `auto` (the default: measure), `off` (an
  empty plan) or `transposed` (every shape up to ROWS' largest, one row padded: tests and A/B runs).
The two ways agree to the dtype's rounding (a different summation order), as GEMV and GEMM
already do; greedy speculative output still equals vanilla (tests/test_linear_layout.py).
Nothing is measured at import.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from respec.accel.settings import read_settings
from respec.config import one_of

ROWS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)   # row counts measured, in turn, until W @ x^T loses
MARGIN = 0.9                   # W @ x^T is kept where it takes under 90% of F.linear's time
CHOICES = ("auto", "off", "transposed")


def transposed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., k], weight [n, k], bias [n] or None -> [..., n] (contiguous), computed as W @ x^T."""
    x2 = x.reshape(-1, x.shape[-1])                                                       # [m, k]
    y = torch.mm(weight, x2.t()) if bias is None else torch.addmm(bias[:, None], weight, x2.t())   # [n, m]
    return y.t().contiguous().view(*x.shape[:-1], weight.shape[0])


def padded_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., k] holding one row, weight [n, k], bias [n] or None -> [..., n] (contiguous): the row
    twice as W @ [x; x]^T (a two-column GEMM, not a GEMV), the second column dropped."""
    x1 = x.reshape(1, x.shape[-1])                                                        # [1, k]
    return transposed_linear(torch.cat([x1, x1]), weight, bias)[:1].view(*x.shape[:-1], weight.shape[0])


@dataclass(frozen=True)
class LinearLayouts:
    """Which linears to run as W @ x^T: ((n, k), largest row count) pairs, and the (n, k) shapes
    whose one-row calls run as two rows (`padded_linear`)."""
    limits: tuple[tuple[tuple[int, int], int], ...] = ()
    source: str = "off"            # auto (measured) | off | transposed (forced)
    one_row: tuple[tuple[int, int], ...] = ()

    def shapes(self, rows: int) -> frozenset[tuple[int, int]]:
        """Weight shapes run as W @ x^T (padded to two rows at one row) in a forward of `rows` rows."""
        if rows == 1:
            return frozenset(self.one_row)
        return frozenset(shape for shape, most in self.limits if 2 <= rows <= most)

    def active(self, rows: int):
        """The context for a forward of `rows` query rows (see the module docstring): `per_call`,
        or a no-op where nothing is planned at that row count."""
        return self.per_call() if self.shapes(rows) else contextlib.nullcontext()

    def per_call(self):
        """A context under which each F.linear call is swapped as the plan says for its own row
        count (calls of several sizes under one context: an EAGLE head's catch-ups and tree layers)."""
        return _PlannedLinears(self) if self.limits or self.one_row else contextlib.nullcontext()

    def describe(self) -> str:
        """One line: which shapes run transposed up to how many rows, and which one-row calls run as two."""
        if not self.limits and not self.one_row:
            return f"linear layout: F.linear everywhere ({self.source})"
        parts = [f"{n}x{k} up to {most} rows" for (n, k), most in self.limits]
        if self.one_row:
            parts.append("one row as two for " + ", ".join(f"{n}x{k}" for n, k in self.one_row))
        return f"linear layout ({self.source}): W @ x^T for " + "; ".join(parts)


class _PlannedLinears(TorchFunctionMode):
    """F.linear over a CPU weight swapped per call as `plan` says for the call's row count."""

    def __init__(self, plan: LinearLayouts) -> None:
        super().__init__()
        self.limits, self.one_row = dict(plan.limits), frozenset(plan.one_row)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.linear and len(args) >= 2 and args[1].device.type == "cpu" and args[0].dim() >= 1:
            shape, rows = tuple(args[1].shape), args[0].numel() // max(1, args[0].shape[-1])
            bias = args[2] if len(args) > 2 else kwargs.get("bias")
            if rows == 1 and shape in self.one_row:
                return padded_linear(args[0], args[1], bias)
            if 2 <= rows <= self.limits.get(shape, 0):
                return transposed_linear(args[0], args[1], bias)
        return func(*args, **kwargs)


def _linear_groups(model: torch.nn.Module) -> dict[tuple[int, int], list[torch.nn.Linear]]:
    """The model's CPU nn.Linear modules by weight shape (a shared weight counted once)."""
    groups: dict[tuple[int, int], list[torch.nn.Linear]] = {}
    seen: set[int] = set()
    for module in model.modules():
        if isinstance(module, torch.nn.Linear) and module.weight.device.type == "cpu" \
                and module.weight.data_ptr() not in seen:
            seen.add(module.weight.data_ptr())
            groups.setdefault(tuple(module.weight.shape), []).append(module)
    return groups


@torch.inference_mode()
def measure_layouts(model: torch.nn.Module, rows: tuple[int, ...] = ROWS, rounds: int = 2) -> LinearLayouts:
    """Time F.linear against W @ x^T per weight shape, row count by row count (see the module docstring)."""
    return measure_groups(_linear_groups(model), rows, rounds)


def measure_groups(groups: dict[tuple[int, int], list], rows: tuple[int, ...] = ROWS, rounds: int = 2) -> LinearLayouts:
    """`measure_layouts` over given groups: per (n, k) weight shape, objects with `.weight` [n, k]
    and `.bias` (nn.Linear modules, an EAGLE head's draft output layer)."""
    limits, one_row = [], []
    for (n, k), modules in groups.items():
        if _swap_pays(modules, 1, padded_linear, rounds):
            one_row.append((n, k))
        most = 0
        for m in rows:
            if not _swap_pays(modules, m, transposed_linear, rounds):
                break
            most = m
        if most:
            limits.append(((n, k), most))
    return LinearLayouts(tuple(sorted(limits)), "auto", tuple(sorted(one_row)))


def _swap_pays(modules: list, m: int, swap, rounds: int) -> bool:
    """Whether `swap` over `m` rows through every module of `modules` (one weight shape) takes
    under MARGIN of F.linear's time, the fastest of `rounds` interleaved rounds after a warm-up."""
    weight = modules[0].weight
    x = torch.randn(m, weight.shape[1], dtype=weight.dtype)                              # [m, k]

    def plain():
        for mod in modules:
            F.linear(x, mod.weight, mod.bias)

    def swapped():
        for mod in modules:
            swap(x, mod.weight, mod.bias)

    best = {plain: float("inf"), swapped: float("inf")}
    plain(), swapped()                                   # warm-up (allocation, kernel choice)
    for _ in range(rounds):
        for fn in best:                                  # interleaved: a busy spell hits both
            t0 = time.perf_counter()
            fn()
            best[fn] = min(best[fn], time.perf_counter() - t0)
    return best[swapped] < MARGIN * best[plain]


def check_layout_choice(value: str) -> str:
    """auto | off | transposed (case-insensitive); ValueError naming the choices otherwise."""
    return one_of(value, CHOICES, "RESPEC_LINEAR_LAYOUT")


def linear_layouts(model: torch.nn.Module, extra: tuple = ()) -> LinearLayouts:
    """The plan for `model` as RESPEC_LINEAR_LAYOUT says (see the module docstring); `extra`:
    further CPU weights to plan for (objects with `.weight` and `.bias`, e.g. an EAGLE head's
    draft output layer, an `LMHead`)."""
    choice = read_settings().linear_layout
    if choice == "off":
        return LinearLayouts()
    groups = _linear_groups(model)
    for layer in extra:
        if layer.weight.device.type == "cpu" and layer.weight.dim() == 2:
            groups.setdefault(tuple(layer.weight.shape), []).append(layer)
    if choice == "transposed":
        shapes = sorted(groups)
        return LinearLayouts(tuple((shape, ROWS[-1]) for shape in shapes), "transposed", tuple(shapes))
    return measure_groups(groups)
