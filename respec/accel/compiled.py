"""A compiled target forward (`--compile on`): the base model's forward through `torch.compile`.

Contract:
- `compile_base(base)` returns the base model's forward compiled with inductor and, on the CPU,
  `freezing` (weights become constants of the graph, so bf16 linears run on prepacked oneDNN
  weights), as wrappers: one-token steps, two-token chains (on the CPU, with the autotuned
  small-row options of `one_row_options`; its rows marked static) and multi-token forwards
  (trees); trees and chains of 3 rows and more are padded to the smallest of a few static row
  counts that holds them (`tree_buckets`: 16 on a CPU with AMX in bf16, 4 in bf16 on other CPUs
  with a bf16 oneDNN path, 4 and 8 in float32 on the CPU and in bf16 where oneDNN has no bf16
  path, each kept only if the machine runs it faster, respec/accel/graph_choice.py
  `choose_buckets`), each such graph with the same options (`pad_rows`: the extra rows see only
  the prefix and themselves and leave the cache after the call), and the symbolic-row graph
  serves larger ones, unless the eager forward runs them faster on this machine
  (graph_choice.py `choose_eager_from`: then trees past the buckets run eagerly, output layer
  included; bf16 on a CPU without bf16 instructions, where the symbolic graph took 1.2 s for 9
  rows against ~0.15 s eager, commit 671c23f of 2026-12-07). All are compiled with dynamic shapes from the start (`dynamic=True`; a
  one-row dimension stays specialised), so each graph compiles once for any tree size, context
  length and cache capacity. Left to dynamo's automatic dynamic shapes, every new size
  recompiled the 30-layer graph once more, and a first answer on the default model stalled three
  minutes in such recompiles (tests/test_compile.py counts the compiles). Prefills stay eager
  (HFTarget._forward). The same compiled forward serves vanilla and every speculative method, so
  speedups stay comparable.
- `compile_logits(target)` compiles the step's output layer the same way: hidden [n, H] -> float32
  logits [n, V] (the lm_head with its frozen, prepacked weight, the softcap, the cast) and, fused
  with them, the step's verification numbers (respec/verify.py `number_table`: top-1, entropy,
  margin, node ranks and log-probs), one wrapper for one row, one for 2 to FEW_LOGIT_ROWS rows
  (with the small-row options; a static graph per row count) and one for several. On the default
  model the layer is 0.6 ms against 1.9 ms eager for one row (the 49k-row layer is a fifth of the
  model's weight bytes), and the numbers of 16 rows 0.5 ms against ~2 ms eager. The lm_head alone
  at 2 / 3 / 4 rows: 1.0 / 1.45 / 1.5 ms static and autotuned against 1.8 / 2.4 / 2.1 ms with
  symbolic rows, and 3.2 against 3.0 at 8 (bf16, 2-core AMD EPYC Zen 4, commit 1afb074 of 2026-12-06, a throwaway
  benchmark of that shape).
- float32 on a CPU with MKL (`one_row_as_two`): one-row calls of both run as two rows and drop
  the second (a one-token step as a two-token chain, its extra cache row cropped), because a
  static one-row float32 linear is packed for MKL and a symbolic-row one for oneDNN: one token
  21.6 ms against 35.5 ms on the default model (2-core AMD EPYC, commit 8a382c3 of 2026-12-03). Only without the
  small-row autotune (`RESPEC_ONE_ROW_AUTOTUNE=0`): with it the C++ template serves float32 one-row
  linears, and the unpadded one-token forward took 21.6 ms against 32.4 padded (commit bab8539 of 2026-12-04).
- All are `Trusted`: once warmed up, a call evaluates only the guards that tell its graphs apart
  (a saving of about 1 ms per one-token step on the default model); warm-ups check every guard.
- An EAGLE-3 drafter asks for layer inputs (`HFTarget.use_features`); the compiled steps then
  return them as `hidden_states` (hooks added after a compile do not run inside its graph), which
  are other graphs: `use_features` warms those up once, the first time.
- The EAGLE head compiles alongside (respec/accel/head_compile.py).
- Nothing is reused from disk by a later process: freezing prepacks the weights as oneDNN
  (mkldnn) tensors, which inductor's FX graph cache cannot pickle ("mkldnn tensors unpickleable",
  so every graph bypasses it) and AOTAutograd's cache refuses frozen graphs (torch 2.13); a
  second process compiled for 472 s against 467 s for the first (2-core Intel Xeon with AMX,
  commit f9a8ce1 of 2026-12-03). The app therefore compiles in the background while it serves eagerly
  (respec/runner.py `Runner.compile_later`, on a twin target: `HFTarget.twin`).
- `warm_up(target)` pays those compiles at load: one-token, chain and branching-tree forwards
  (a tree mask is another graph than a chain's causal mask) after a short prefill, then again
  after a prefill past the slab cache's first capacity (whose growth changes the buffers' shape),
  in a scratch cache (`HFTarget.scratch_cache`), with a progress line.
- What compiles is transformers' own forward, unmodified; attention still goes through the
  attention interface (respec/models/attention.py). Compiled and eager forwards may round
  differently in bf16 (greedy outputs stay equal to compiled vanilla under the engine's tie rule);
  in float32 they agree to float rounding.
Measured on the default model (bf16, `scripts/verify_cost.py --context 256 --reps 5 --compile
both`, BENCHMARKS.md): 2-core AMD EPYC Zen 5 (commit 8a382c3 of 2026-12-03, before the small-row autotune): one token
12.3 ms compiled against 23.8 ms eager, 16 tokens 17.4 against 34.0, warm-up 7.5 minutes; 2-core
Intel Xeon with AMX (commit f9a8ce1 of 2026-12-03): 20.2 against 37.4, 16 tokens 24.3 against 43.2; 2-core AMD EPYC
Zen 4 (commit bab8539 of 2026-12-04, with the small-row autotune): one token 14.1 against 39.7, 16 tokens 36.9
against 63.9 (warm-up 9.6 minutes), and with the two-row graphs two tokens 19.2 against 37.6
where the run before gave 25.2 against 42.6 (warm-up 14 minutes); 2-core Intel Xeon with AMX
(commit 1453e21 of 2026-12-04, with the 16-row bucket): one token 14.7 against 36.4, 16 tokens 19.4 against 42.9
(24.1 without the bucket in the run before), warm-up 8.3 minutes; the Zen 4 again (commit 538c1f4 of 2026-12-06): one
token 13.1 against 36.5, 16 tokens 27.4 against 57.6, warm-up 12.4 minutes; there with the 4-row
bucket (commit 1afb074 of 2026-12-06, compiled only): one token 14.1, 4 tokens 16.6 (1.17x one token, against 1.39x
in commit 538c1f4 of 2026-12-06), 5 tokens 21.1, warm-up 10.9 minutes. Nothing is compiled at import.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable

import torch

from respec.accel.settings import read_settings
from respec.config import COMPILE_CHOICES, check_compile_choice  # noqa: F401 (re-exported)
from respec.models.attention import additive_mask
from respec.models.kv import INITIAL_CAPACITY
from respec.tree import DraftTree
from respec.verify import number_table


def compile_base_settings(device: torch.device) -> None:
    """The process-wide settings every compile here wants (the target's and the EAGLE head's):
    a few graphs per wrapper, and on the CPU inductor's `freezing`."""
    import torch._dynamo

    # a few graphs per wrapper are expected; a shape the guards do not generalise falls back to
    # eager after this many instead of recompiling forever. Graphs gather per code object, so every
    # head of a process adds its own to the same wrappers' (an EAGLE-3 head's small-row graphs alone
    # are 16: head_compile.SMALL_ROWS row counts, masked or not, at two feature widths)
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)
    if torch.device(device).type == "cpu":
        # set globally: passed as torch.compile(options=...) it did not take effect here (the
        # one-token forward stayed at the unfrozen speed); a process that compiles wants it anyway
        import torch._inductor.config as inductor_config
        inductor_config.freezing = True
        # linears reading one input (q, k, v; gate and up) run as one packed linear, and the graph's
        # kernels are called from C++ instead of a Python wrapper: on the default model (bf16, one
        # token) 13.1 ms against 14.6 without either, 16 tokens 19.0 against 20.4, for compiles
        # ~25% longer (`HFTarget.verify_cost_curve(context=256)`, one process per variant, commit 8a382c3 of 2026-12-03)
        inductor_config.cpp.enable_concat_linear = True
        inductor_config.cpp_wrapper = True


@dataclass
class Trusted:
    """A compiled callable that, once `trusted` (set at the end of its warm-up), runs with only the
    guards that tell its graphs apart (`torch.compiler.set_stance(skip_guard_eval_unsafe=True)`).
    The target's full guard set checked every parameter and cache layer on each call: ~0.6 ms per
    compiled region on the default model, about 1 ms of a 16 ms one-token step (measured back to
    back). Warm-ups run with every guard, so they still compile what is new; a call no graph fits
    (dynamo raises before running anything) is retried with every guard, compiling one."""
    fn: Callable
    trusted: bool = False

    def __call__(self, *args, **kwargs):
        if self.trusted:
            try:
                with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
                    return self.fn(*args, **kwargs)
            except RuntimeError as exc:     # no graph fits (raised before any runs): compile one, all guards on
                if "skip_guard_eval_unsafe" not in str(exc):
                    raise
        return self.fn(*args, **kwargs)


def one_row_options(device: torch.device) -> dict | None:
    """inductor options for the static small-row graphs (the one-token forward, the one-row output
    layer, and with these options also a two-token chain's forward and a two-row output layer):
    on the CPU, `max_autotune` over inductor's C++ GEMM template and ATen, so each linear of such a
    graph is timed both ways at compile time and the faster kept. Set per graph, not globally: at
    one row the C++ template (a vectorised micro-GEMM streaming the weight) beat the prepacked
    oneDNN linear on every linear of the default model in bf16 (q/k/v 0.015 against 0.083 ms,
    gate/up 0.042 against 0.064, lm_head 1.09 against 2.37; inductor's autotune log, 2-core AMD
    EPYC Zen 4, commit bab8539 of 2026-12-04), and at a static two rows the default model's 121 linears took 5.6-6.6
    ms against oneDNN's 15.4 (a throwaway benchmark of the same shapes over distinct weights),
    while at 8 rows oneDNN won (q/k/v 0.050 against 0.158). Trees of 3 rows and more keep oneDNN
    in one graph with a symbolic row count: autotuning that graph times the linears at the row
    count of its first call and keeps the choice for every size (first called with 3 rows, the
    121 linears took 236 ms at 64 rows against oneDNN's 49-54). Each distinct linear shape adds a
    few seconds of timing to the compile. `RESPEC_ONE_ROW_AUTOTUNE=0` turns it off (None: the
    plain settings, no two-row graphs) for A/B measurements."""
    if torch.device(device).type != "cpu" or not read_settings().one_row_autotune:
        return None
    # the timings stay out of the console (a table per linear otherwise, and from torch 2.13 a JSON
    # line per linear on stderr, an option older releases do not know)
    options = {"max_autotune": True, "max_autotune_gemm_backends": "CPP,ATEN", "autotune_num_choices_displayed": 0}
    import torch._inductor.config as inductor_config
    if hasattr(inductor_config, "max_autotune_report_choices_stats"):
        options["max_autotune_report_choices_stats"] = False
    return options


def one_row_as_two(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether one-row compiled calls should run as two rows, the second dropped: float32 on a CPU
    build with MKL. Under freezing, inductor packs a float32 linear whose row count is a static 1
    for MKL's packed sgemm and one whose row count is symbolic for oneDNN; on the 2-core AMD EPYC
    the one-token float32 forward took 35.5 ms the first way against 22.7 ms for a two-token
    forward (commit 8a382c3 of 2026-12-03, `HFTarget.verify_cost_curve(context=256)` after `enable_compile`, a
    throwaway script). bf16 and fp16 linears always go to oneDNN. Only without the one-row autotune
    (`one_row_options` None): with it the C++ template serves float32 one-row linears (q/k/v 0.026
    against MKL's 0.110 ms), and the unpadded one-token forward took 21.6 ms against 32.4 padded
    (best of 200 interleaved steps at context 256, two twins in one process, 2-core AMD EPYC Zen 4,
    commit bab8539 of 2026-12-04)."""
    return (torch.device(device).type == "cpu" and dtype == torch.float32 and bool(torch._C.has_mkl)
            and one_row_options(device) is None)


def pad_one_token(kwargs: dict) -> dict:
    """A one-token step's forward keywords as a two-token chain's: input_ids and position_ids
    [1, 1] -> [1, 2] (the token again, one position on), no mask (a chain's is the model's causal
    one). The caller grows the cache for two rows and crops the second after the call."""
    ids, pos = kwargs["input_ids"], kwargs["position_ids"]                 # each [1, 1]
    return dict(kwargs, input_ids=torch.cat([ids, ids], dim=1), position_ids=torch.cat([pos, pos + 1], dim=1))


FLOAT32_BUCKETS = (4, 8)   # the float32 CPU default (tree_buckets); each kept only if measured faster
BF16_BUCKETS = (4,)        # the bfloat16 default on a CPU without AMX (tree_buckets), kept only if faster


def tree_buckets(device: torch.device, dtype: torch.dtype) -> tuple[int, ...]:
    """The static row counts (ascending) that compiled forwards of 3 rows and more are padded to,
    each to the smallest bucket that holds it (one graph per bucket, its linears autotuned like the
    small-row graphs, `one_row_options`); the symbolic-row graph serves larger ones. Empty: none.
    - On a CPU whose oneDNN may use AMX, in bfloat16: (16,). There inductor's AMX micro-GEMM
      template beats the prepacked oneDNN linear at a handful of rows, and a static 16-row graph's
      linears cost about what a static 2-row one's do (a throwaway benchmark of the default model's
      210 linears, 30 layers over distinct weights, 2-core Intel Xeon with AMX, commit 1453e21 of 2026-12-04: 9.6 ms
      static at 4 or 16 rows against 13.5 ms symbolic at 4 rows and 14.2 at 16; 8.6 static at 2
      rows), so padding a 4-token tree to 16 rows still saves ~4 ms.
    - bfloat16 on any other CPU with a bf16 oneDNN path: BF16_BUCKETS, (4,). Without AMX the
      template's micro-GEMM wins at 2-4 rows only: the same 210 linears (2-core AMD EPYC Zen 4,
      AVX512-BF16, commit 1afb074 of 2026-12-06) took 6.9 / 7.2 / 7.5 ms static and autotuned at 2 / 3 / 4 rows
      against 13.0 / 12.5 / 10.7 ms symbolic, but 10.1 / 10.3 / 12.5 / 15.7 at 5 / 6 / 8 / 16
      rows against 9.8 / 10.0 / 12.0 / 17.0. (Commits bab8539 and d9c4d47 of 2026-12-04 had found no gain at 3-8 rows.)
      `ONEDNN_MAX_CPU_ISA` below AMX (e.g. AVX512_CORE) stands in for such a CPU.
    - float32 on the CPU: FLOAT32_BUCKETS. On a 2-core AMD EPYC Zen 3 (AVX2) the same 210 float32
      linears took 13.4 / 13.6 / 19.8 ms static and autotuned at 3 / 4 / 8 rows against 20.6 /
      21.9 / 26.3 ms symbolic (oneDNN), and the whole 3-token forward 30.2 ms against 20.2 for
      the static 2-token one (commit 3439365 of 2026-12-05, throwaway scripts).
    - bfloat16 on a CPU whose oneDNN has no bf16 path (`onednn_has_bf16`: no AVX-512, e.g. AVX2
      only): FLOAT32_BUCKETS too. There the symbolic-row graph's bf16 linears crawl: on the
      default model (2-core AMD EPYC Zen 3, commit 5765a04 of 2026-12-05, `scripts/verify_cost.py --dtype bfloat16
      --compile both`) 4 tokens took 516 ms compiled against 74.8 ms eager, while the static,
      autotuned 2-token graph took 17.5 ms (its C++ micro-GEMM widens bf16 to float32 in registers).
    Defaults are checked on the machine at warm-up (`choose_buckets`): a bucket whose padded
    forward is not faster than the symbolic graph at the fewest rows it would serve is dropped.
    `RESPEC_PAD_ROWS=0` turns buckets off; `RESPEC_PAD_ROWS=N` or `N,M,...` forces those buckets
    (any device and dtype, not re-measured: A/B runs and tests); `ONEDNN_MAX_CPU_ISA` naming an ISA
    below AMX (e.g. AVX512_CORE) gives the bfloat16 default of a CPU without AMX."""
    forced = forced_buckets()
    if forced is not None:
        return forced
    if torch.device(device).type != "cpu" or one_row_options(device) is None:
        return ()
    if dtype == torch.float32:
        return FLOAT32_BUCKETS
    if dtype != torch.bfloat16:
        return ()
    if not onednn_has_bf16():
        return FLOAT32_BUCKETS
    isa = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if isa and "AMX" not in isa and isa not in ("ALL", "DEFAULT"):
        return BF16_BUCKETS
    amx = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return (16,) if amx is not None and amx() else BF16_BUCKETS


def onednn_has_bf16() -> bool:
    """Whether this CPU's oneDNN has a bf16 path (AVX-512 or later: torch's own probe; True where
    torch has no probe). Not `devices.cpu_supports_bf16`, which asks for bf16 instructions: with
    AVX-512 but no AVX512-BF16, oneDNN still runs bf16 linears, widened in registers."""
    probe = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return True if probe is None else bool(probe())


def forced_buckets() -> tuple[int, ...] | None:
    """RESPEC_PAD_ROWS as buckets (counts below 3 dropped), or None when it is unset; ConfigError
    (a ValueError) naming it when it is not a comma-separated list of whole numbers
    (respec/accel/settings.py)."""
    return read_settings().pad_rows


def bucket_for(buckets: tuple[int, ...], rows: int) -> int | None:
    """The smallest bucket holding a forward of `rows` rows (3 or more), or None: unpadded."""
    if rows < 3:
        return None
    return next((b for b in buckets if b >= rows), None)


def bucket_spans(buckets: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(fewest rows, bucket) for each of `buckets` (ascending): a bucket serves from 3 rows, or
    from one past the bucket below, up to itself. With (4, 8): ((3, 4), (5, 8))."""
    los = (3,) + tuple(b + 1 for b in buckets[:-1])
    return tuple(zip(los, buckets))


def bucket_edges(buckets: tuple[int, ...], two_rows: bool = False) -> tuple[int, ...]:
    """The tree sizes at which a compiled forward's cost steps when trees are padded to `buckets`
    (ascending): each bucket's span (`bucket_spans`) at both ends, and one row past the largest
    (the symbolic graph's first size). Every size a bucket serves costs about what the bucket
    does, so a verify-cost curve measured at these sizes, interpolated linearly, prices 3 rows
    like 4 and 5 like 8 (with (4, 8): 3, 4, 5, 8, 9). With `two_rows` (compile_base's static
    two-row graph, `one_row_options`), 3 rows too even without buckets: the symbolic graph's
    first size, which interpolated between 2 and 4 looked ~3 ms cheaper than it runs (2-core AMD
    EPYC Zen 4, bf16, commit 538c1f4 of 2026-12-06: 2 rows 12.4 ms, 3 rows 17.5, priced 14.9). Empty: none."""
    edges = {3} if two_rows else set()
    if buckets:
        edges |= {n for span in bucket_spans(buckets) for n in span} | {buckets[-1] + 1}
    return tuple(sorted(edges))


def branching_tree(n: int):
    """A DraftTree of n nodes (tokens 1..n), each node i > 0 a child of node (i - 1) // 2: a
    binary tree, so its forward takes a tree mask (warm-ups and timings use it)."""
    return DraftTree.from_parents(list(range(1, n + 1)), [-1] + [(i - 1) // 2 for i in range(1, n)], "eagle")


def pad_rows(kwargs: dict, rows: int, past: int, dtype: torch.dtype) -> dict:
    """A forward's keywords for n rows (3 <= n <= rows; a chain without a mask, or a tree with its
    additive mask [1, 1, n, past + n]) as those of `rows` rows: the extra rows repeat the last
    token and position and attend to the cached prefix and themselves only, and no real row
    attends to them, so the first n rows' outputs are the unpadded forward's (up to the graph's
    rounding). Always with a mask: [1, 1, rows, past + rows]. The caller crops the extra cache
    rows after the call and cuts the outputs back (`first_rows`)."""
    ids, pos, mask = kwargs["input_ids"], kwargs["position_ids"], kwargs.get("attention_mask")   # [1, n] each
    n = ids.shape[1]
    extra = rows - n
    blocked = ~torch.eye(rows, dtype=torch.bool, device=ids.device)                        # [rows, rows]
    if mask is None:                       # a chain: the causal mask over its own rows
        blocked[:n, :n] = torch.ones(n, n, dtype=torch.bool, device=ids.device).triu(1)
    else:                                  # a tree: what its additive mask blocks among its own rows
        blocked[:n, :n] = mask[0, 0, :, past:] != 0
    return dict(kwargs, input_ids=torch.cat([ids, ids[:, -1:].expand(1, extra)], dim=1),
                position_ids=torch.cat([pos, pos[:, -1:].expand(1, extra)], dim=1),
                attention_mask=additive_mask(blocked, past, dtype))                        # [1, 1, rows, past+rows]


def first_rows(out, n: int):
    """A model output of a padded call cut back to its first n rows (last_hidden_state [1, n, H]
    and each of hidden_states, when returned)."""
    out.last_hidden_state = out.last_hidden_state[:, :n]
    if getattr(out, "hidden_states", None) is not None:
        out.hidden_states = tuple(h[:, :n] for h in out.hidden_states)
    return out


def compile_base(base: torch.nn.Module, buckets: tuple[int, ...] = ()) -> Trusted:
    """The base model's forward compiled (see the module docstring). One-token steps and
    multi-token forwards (trees) go through two separately compiled wrappers, so the one-token
    graph keeps its single query row static (specialised kernels) while the other's row count is
    symbolic. With `buckets` (`tree_buckets`), a forward called with `static=True` (the caller
    padded it to a bucket, `pad_rows`) goes to a static graph per row count, with the small-row
    options."""
    compile_base_settings(next(base.parameters()).device)

    def one_token(**kwargs):
        return base(**kwargs)

    def several(**kwargs):
        return base(**kwargs)

    def two_tokens(**kwargs):
        return base(**kwargs)

    def bucket_rows(**kwargs):
        return base(**kwargs)

    options = one_row_options(next(base.parameters()).device)
    one = torch.compile(one_token, backend="inductor", dynamic=True, options=options)
    # two-token chains (a root and one draft token) get a static graph of their own when the small-row
    # graphs are autotuned: see `one_row_options`
    two = None if options is None else torch.compile(two_tokens, backend="inductor", dynamic=True, options=options)
    many = torch.compile(several, backend="inductor", dynamic=True)
    padded = None if not buckets else torch.compile(bucket_rows, backend="inductor", dynamic=True,
                                                    options=options or None)

    def forward(static: bool = False, **kwargs):
        rows = kwargs["input_ids"].shape[1]
        if rows == 1:
            return one(**kwargs)
        if static and padded is not None:
            torch._dynamo.mark_static(kwargs["input_ids"], 1)           # [1, bucket]
            torch._dynamo.mark_static(kwargs["position_ids"], 1)        # [1, bucket]
            torch._dynamo.mark_static(kwargs["attention_mask"], 2)      # [1, 1, bucket, past + bucket]
            return padded(**kwargs)
        if rows == 2 and two is not None and kwargs.get("attention_mask") is None:
            torch._dynamo.mark_static(kwargs["input_ids"], 1)           # [1, 2]: the rows stay a static 2
            torch._dynamo.mark_static(kwargs["position_ids"], 1)        # [1, 2]
            return two(**kwargs)
        return many(**kwargs)

    return Trusted(forward)


FEW_LOGIT_ROWS = 4   # output-layer calls of 2..this many rows run static, autotuned graphs (compile_logits)


def compile_logits(target) -> Trusted:
    """hidden [n, H], tokens [n], parents [n] -> (float32 logits [n, V] of `target` (HFTarget.lm_head
    then .float()), their `number_table` [n, 7] or None for a vocabulary of 2**24 ids or more),
    compiled (see the module docstring): one-row, few-row (static per count) and several-row
    wrappers. The bodies are the same on purpose: dynamo keeps its compiled graphs per code
    object, so each def keeps its own cache."""

    fuse = target.vocab_size < 2 ** 24          # the table's ids are float32; else the eager numbers

    def one_row(hidden, tokens, parents):
        logits = target.lm_head(hidden).float()
        return logits, number_table(logits, tokens, parents) if fuse else None

    def rows(hidden, tokens, parents):
        logits = target.lm_head(hidden).float()
        return logits, number_table(logits, tokens, parents) if fuse else None

    def few_rows(hidden, tokens, parents):
        logits = target.lm_head(hidden).float()
        return logits, number_table(logits, tokens, parents) if fuse else None

    options = one_row_options(target.device)
    one = torch.compile(one_row, backend="inductor", dynamic=True, options=options)
    few = None if options is None else torch.compile(few_rows, backend="inductor", dynamic=True, options=options)
    many = torch.compile(rows, backend="inductor", dynamic=True)
    as_two = one_row_as_two(target.device, target.dtype)

    def logits(hidden: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor):
        if 2 <= hidden.shape[0] <= FEW_LOGIT_ROWS and few is not None:
            for t in (hidden, tokens, parents):                       # [n, H], [n], [n]: a static n
                torch._dynamo.mark_static(t, 0)
            return few(hidden, tokens, parents)
        if hidden.shape[0] > 1:
            return many(hidden, tokens, parents)
        if not as_two:
            return one(hidden, tokens, parents)
        # the row twice (its parent is itself, so its numbers read only its own logits)
        logits, table = many(hidden.expand(2, -1).contiguous(), tokens.expand(2).contiguous(),
                             parents.expand(2).contiguous())
        return logits[:1], None if table is None else table[:1]

    return Trusted(logits)


def compile_count() -> int:
    """Frames dynamo has compiled so far in this process (tests count recompiles with it)."""
    from torch._dynamo.utils import counters
    return int(counters["frames"]["ok"])


@torch.inference_mode()
def warm_up(target, progress: bool = True, pause: Callable[[], None] | None = None) -> float:
    """Run the forwards that trigger the compiles (see the module docstring) on `target` (an
    HFTarget with compiling on) in a throwaway cache; returns the seconds it took. `pause`, when
    given, is called before each shape (a background compile waits there while requests run)."""
    from tqdm.auto import tqdm


    t0 = time.perf_counter()
    compiled = [f for f in (target.fast.base, target.fast.logits) if isinstance(f, Trusted)]
    for f in compiled:
        f.trusted = False            # every guard while warming up: new graphs compile
    vocab = min(target.vocab_size, 1000)
    # a prefill longer than the slab cache's first capacity grows its buffers, so the capacity
    # dimension turns symbolic here, not in the middle of a long prompt's first request
    long = min(INITIAL_CAPACITY + 16, max(48, target.context_length // 2))
    # chains (the model's causal mask) and branching trees (an explicit tree mask) are separate
    # graphs: both are compiled, at two sizes each, before and after the growth
    # with buckets (`tree_buckets`), 3..max(buckets) rows are the padded static graphs and the
    # symbolic-row graphs serve larger trees only: their shapes move above the buckets, and each
    # bucket's graph warms up at a chain and a tree size on each side of the growth
    buckets = target.fast.buckets
    up = max(buckets, default=0)
    spans = bucket_spans(buckets)                       # (the fewest rows each bucket serves, bucket)
    plan = [("prefill", 24), ("chain", 1), ("chain", 1), ("chain", 1), ("chain", 3 + up), ("chain", 5 + up),
            ("chain", 2), ("tree", 3 + up), ("tree", 6 + up), ("tree", 4 + up)]
    plan += [step for lo, b in spans for step in (("chain", lo), ("tree", b))]
    plan += [("prefill", long), ("chain", 1), ("chain", 2), ("chain", 4 + up), ("tree", 5 + up)]
    plan += [step for lo, b in spans for step in (("tree", lo), ("chain", b))]
    with target.scratch_cache():
        bar = tqdm(plan, desc=f"compiling {target.name}'s forward (once per process)", disable=not progress,
                   unit="shape")
        for kind, n in bar:
            if pause is not None:
                pause()
            if kind == "prefill":
                target.prefill([(7 * i) % vocab for i in range(n)])
            else:
                tree = (DraftTree.chain(1, [2 + i for i in range(n - 1)], "eagle") if kind == "chain"
                        else branching_tree(n))
                target.forward_tree(tree, need_hidden=False)
                target.keep([0])
    for f in compiled:
        f.trusted = True
    return time.perf_counter() - t0
