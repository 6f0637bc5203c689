"""The compiled EAGLE head (respec/accel/head_compile.py) on tiny models in float32: the same
features and draft logits as the eager head (EAGLE-1/2 and EAGLE-3, Llama and Qwen2 style) for
catch-ups and tree batches over a growing cache; no recompilation after the warm-up across 20
drafting steps of a real Eagle2Drafter or the head's row timing; greedy eagle2 on a compiled target and head equal to
vanilla; an eager target leaves the head eager; a background compile (Runner.compile_later) serves
eagerly meanwhile, then installs the compiled target and head without recompiling."""
from __future__ import annotations

import threading
from dataclasses import dataclass

import pytest
import torch

from respec.config import EngineConfig, TreeConfig
from respec.drafters.eagle2 import Eagle2Drafter
from respec.drafters.heads.eagle3 import random_eagle3_head
from respec.drafters.heads.eagle import random_head
from respec.accel.head_compile import ROUTES
from respec.models.attention import additive_mask
from respec.accel.compiled import compile_count
from respec.accel.head_compile import compile_head
from respec.models.kv import INITIAL_CAPACITY, slab_cache
from respec.runner import Runner
from tests.conftest import frames_compiled, make_target, run

PROMPT = [5, 17, 9, 33, 12, 8, 21, 40, 7, 3, 19, 26]
FIXED_TREES = {"tree.auto": False, "tree.total_tokens": 8, "tree.depth": 3, "tree.top_k": 2}


def _head(kind: str, target):
    qkv = target.name.endswith("qwen2")
    return random_eagle3_head(target, seed=3, qkv_bias=qkv) if kind == "eagle3" else random_head(target, seed=3, qkv_bias=qkv)


@dataclass(frozen=True)
class HeadPair:
    """A compiled target, an eager head and its compiled twin (the same weights), the head's
    compile seconds and the eager-from choice its warm-up measured (before the fixture cleared it)."""
    target: object
    eager_head: object
    head: object
    seconds: float
    measured_eager_from: int | None


def _head_pair(target, kind: str) -> HeadPair:
    eager_head, head = _head(kind, target), _head(kind, target)    # same seed: the same weights
    seconds = compile_head(head, target, progress=False)
    measured = head.route.eager_from
    # the tests below check the symbolic-row graphs: larger calls stay compiled whatever this machine
    # measured (CompiledHead.choose_eager; test_head_calls_past_the_small_rows_run_eagerly_... checks that)
    head.route.eager_from = None
    return HeadPair(target, eager_head, head, seconds, measured)


@pytest.fixture(scope="module")
def llama_pair(compiled_llama) -> HeadPair:
    """The session's compiled Llama (conftest.compiled_llama: no second target compile) with a
    compiled EAGLE head; the eager-from test reads its measured choice rather than compiling a third head."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv("RESPEC_EAGER_FROM", raising=False)          # measured, not forced
        return _head_pair(compiled_llama.target, "eagle")


@pytest.fixture(scope="module", params=[pytest.param(("llama", "eagle"), marks=pytest.mark.xdist_group("compiled_llama")),
                                        pytest.param(("qwen2", "eagle3"), marks=pytest.mark.xdist_group("compiled_qwen2"))])
def compiled_pair(request):
    arch, kind = request.param
    if arch == "llama":
        pair = request.getfixturevalue("llama_pair")
    else:
        target = make_target(arch, dtype=torch.float32)
        target.enable_compile(progress=False)
        pair = _head_pair(target, kind)
    return pair.target, pair.eager_head, pair.head, pair.seconds


def test_compiled_head_equals_eager_for_catch_ups_and_trees_over_a_growing_cache(compiled_pair):
    target, eager_head, head, _ = compiled_pair
    assert head.route is not None and eager_head.route is None
    # (rows, tree mask?): a first catch-up, one-row and tree steps, a feed past the first capacity
    _assert_calls_equal(target, eager_head, head, [(20, False), (1, False), (3, False), (4, True), (1, True),
                                                   (INITIAL_CAPACITY, False), (2, False), (5, True)], seed=0)


def _assert_calls_equal(target, eager_head, head, plan, seed: int) -> None:
    """Feed both heads the same random calls, (rows, tree mask?) each, over caches of their own:
    the same features [q, H] and draft logits [q, V], and the caches grow alike."""
    width = head.fc.in_features // (1 if head.feature_layers is not None else 2)
    g = torch.Generator().manual_seed(seed)
    caches = slab_cache(head.config), slab_cache(head.config)
    for q, masked in plan:
        kv = caches[0].get_seq_length()
        with torch.inference_mode():      # as the drafter calls it
            emb = target.embed(torch.randint(3, target.vocab_size, (q,), generator=g))      # [q, H]
            feat = torch.randn(q, width, generator=g)                                        # [q, F]
            mask = additive_mask(~torch.eye(q, dtype=torch.bool), kv, torch.float32) if masked else None
            pos = torch.arange(kv, kv + q)
            a = eager_head(emb, feat, pos, caches[0], mask)
            b = head(emb, feat, pos, caches[1], mask)
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)                         # [q, H]
            torch.testing.assert_close(head.draft_logits(target, b), eager_head.draft_logits(target, a),
                                       rtol=1e-4, atol=1e-4)                               # [q, V]
        assert caches[0].get_seq_length() == caches[1].get_seq_length() == kv + q


def test_no_recompilation_after_the_warm_up_across_twenty_drafting_steps(compiled_pair):
    target, _, head, _ = compiled_pair
    # an EAGLE-3 head's first run compiles the target's feature-returning graphs (its warm-up)
    run(target, "eagle2", PROMPT[:4], head=head, max_new_tokens=2)
    before = compile_count()
    steps = []
    with frames_compiled() as frames:
        for shift in range(6):                     # prompts until 20 steps (a tiny model may stop early)
            prompt = [(t + 7 * shift) % target.vocab_size for t in PROMPT]
            steps += run(target, "eagle2", prompt, head=head, max_new_tokens=24, **FIXED_TREES).steps
            if len(steps) >= 20:
                break
    assert len(steps) >= 20 and all(s.tree.size > 1 for s in steps)      # the head drafted a tree each step
    assert compile_count() == before, (f"compiled after the warm-up: {frames}; target {target.fast.describe()}; "
                                       f"head {head.route.describe_routes()}; tree sizes {[s.tree.size for s in steps]}")


def test_the_heads_row_timing_is_paid_in_the_warm_up_and_compiles_nothing(compiled_pair):
    """EagleHead.row_ms (the cost model's draft cost before a tree layer is timed) fed one tensor
    as both embedding and feature: a graph for aliased inputs that no warm-up compiled, which cost
    the first eagle2 request ~1.1 s on the default model. It runs in the warm-up now, on two
    tensors, and timing it again compiles nothing."""
    target, _, head, _ = compiled_pair
    assert head._row_ms is not None and head._row_ms[0] is target
    head._row_ms = None
    before = compile_count()
    assert head.row_ms(target) > 0
    assert compile_count() == before


def test_greedy_eagle2_with_a_compiled_target_and_head_equals_vanilla(compiled_pair):
    target, _, head, _ = compiled_pair
    eager_target = make_target(target.name.removeprefix("tiny-"), dtype=torch.float32)
    ref = run(eager_target, "vanilla", PROMPT, max_new_tokens=40)
    for overrides in (FIXED_TREES, {}):
        assert run(target, "eagle2", PROMPT, head=head, max_new_tokens=40, **overrides).tokens == ref.tokens
        assert run(target, "sam", PROMPT, head=head, max_new_tokens=40, **overrides).tokens == ref.tokens


def test_calls_of_a_few_rows_run_the_static_small_row_graphs_and_larger_ones_the_symbolic_one(compiled_pair):
    """On the CPU (compiled.one_row_options), head calls of up to SMALL_ROWS rows, with or without
    a tree mask, go to the static small-row graphs; larger ones to the symbolic-row graph; after
    the warm-up neither compiles."""
    from respec.accel.head_compile import SMALL_ROWS
    target, _, head, _ = compiled_pair
    ch = head.route
    assert ch.small_fn is not None, "a CPU compiles the small-row graphs"
    width = head.fc.in_features // (1 if head.feature_layers is not None else 2)
    calls: list[tuple[str, int]] = []
    inner = {name: getattr(ch, name).fn for name in ("small_fn", "forward_fn")}

    def counted(name: str):
        def fn(emb, *args):
            calls.append((name, int(emb.shape[0])))
            return inner[name](emb, *args)
        return fn

    cache = slab_cache(head.config)
    before = compile_count()
    try:
        for name in inner:
            getattr(ch, name).fn = counted(name)
        with torch.inference_mode():
            for q, masked in [(12, False), (1, False), (SMALL_ROWS, False), (SMALL_ROWS + 1, False), (2, True),
                              (SMALL_ROWS, True), (SMALL_ROWS + 1, True)]:
                kv = cache.get_seq_length()
                mask = additive_mask(~torch.eye(q, dtype=torch.bool), kv, torch.float32) if masked else None
                head(target.embed(torch.arange(q) + 3), torch.zeros(q, width), torch.arange(kv, kv + q), cache, mask)
    finally:
        for name, fn in inner.items():
            getattr(ch, name).fn = fn
    # the first feed over an empty cache: its first row eagerly, the other 11 through the symbolic graph
    assert calls == [("forward_fn", 11), ("small_fn", 1), ("small_fn", SMALL_ROWS), ("forward_fn", SMALL_ROWS + 1),
                     ("small_fn", 2), ("small_fn", SMALL_ROWS), ("forward_fn", SMALL_ROWS + 1)]
    assert compile_count() == before


def test_an_eager_target_leaves_the_head_eager_and_compiling_twice_is_free(compiled_pair):
    target, _, head, seconds = compiled_pair
    assert seconds > 0 and compile_head(head, target, progress=False) == 0.0
    eager_target = make_target("llama", dtype=torch.float32)
    fresh = random_head(eager_target, seed=3)
    Eagle2Drafter(eager_target, fresh, TreeConfig())
    assert fresh.route is None
    Eagle2Drafter(target, head, TreeConfig())         # already compiled: no new warm-up
    assert head.route.target is target


@pytest.mark.xdist_group("compiled_llama")
def test_a_background_compile_serves_eagerly_then_installs_the_compiled_target_and_head(compiled_llama):
    """Runner.compile_later compiles on a twin target (the same weights) while runs go on eagerly
    under the step lock; then the runner's own target and head run compiled (the meta says so),
    with no recompilation, greedy eagle2 still equal to vanilla. The target is a fresh, eager one
    over the session's compiled Llama's model (conftest.compiled_llama), so the twin's forward
    finds that model's graphs already compiled in this process; the head compiles anew."""
    from respec.models.hf import HFTarget
    target = HFTarget(compiled_llama.target.model, eos_token_ids=compiled_llama.target.eos_token_ids,
                      context_length=256, name="tiny-llama")
    runner = Runner(target)                       # a random head, eager
    cfg = EngineConfig().with_overrides({"method": "eagle2", "max_new_tokens": 24})
    ref = run(make_target("llama", dtype=torch.float32), "vanilla", PROMPT, max_new_tokens=24).tokens
    lock = threading.Lock()
    pauses = []
    thread = runner.compile_later(lock, pause=lambda: pauses.append(1))   # the app passes ModelHub.wait_idle
    assert thread is not None and runner.compile_state == "compiling" and runner.compile_later(lock) is None
    with lock:                                    # a run while the twin compiles: the eager forward
        assert not target.compiled and runner.meta(cfg)["forward"] == "eager"
        assert runner.engine(cfg).generate(PROMPT).tokens == ref
    thread.join(timeout=600)
    assert not thread.is_alive() and runner.compile_state == "on"
    assert len(pauses) >= 14, "the compile paused before each warm-up shape (and while the run held the lock)"
    assert target.compiled and runner.head.route.target is target and runner.meta(cfg)["forward"] == "compiled"
    before = compile_count()
    for _ in range(2):
        assert runner.engine(cfg).generate(PROMPT).tokens == ref
    assert compile_count() == before, "the twin's graphs serve the runner's target as they are"
    with pytest.raises(ValueError, match="twin"):
        target.adopt_compiled(make_target("llama", dtype=torch.float32))


def test_the_output_layer_route_is_chosen_from_given_times():
    """choose_routes is pure: the times are given, no clock is read."""
    from respec.accel.head_compile import choose_routes
    times = {1: {"compiled": 1.3, "eager": 0.7, "transposed": 0.65},     # transposed, well under 90%
             2: {"compiled": 2.6, "eager": 2.0, "transposed": 0.7},
             4: {"compiled": 2.6, "eager": 1.9, "transposed": 0.8},
             8: {"compiled": 3.3, "eager": 3.1, "transposed": 3.0},       # within the margin: compiled
             16: {"compiled": 3.6, "eager": 3.4, "transposed": 1.6}}
    routes = choose_routes(times, margin=0.9)
    assert routes[1] == routes[2] == routes[4] == "transposed" and routes[8] == "compiled"
    assert routes[3] == "transposed"                  # both neighbours agree
    assert routes[5] == routes[12] == "compiled"      # neighbours disagree: compiled
    assert routes[16] == "transposed" and 17 not in routes and max(routes) == 16
    assert choose_routes({1: {"compiled": 1.0}}) == {1: "compiled"}     # nothing eager offered
    assert choose_routes({}) == {}


def test_every_output_layer_route_gives_the_compiled_logits_and_draft_logits_follows_the_routes(compiled_pair, monkeypatch):
    target, eager_head, head, _ = compiled_pair
    compiled = head.route
    saved = dict(compiled.routes)
    g = torch.Generator().manual_seed(1)
    before = compile_count()
    try:
        with torch.inference_mode():
            for q in (1, 3, 8):
                out = torch.randn(q, head.config.hidden_size, generator=g)                   # [q, H]
                want = eager_head.draft_logits(target, out)                                  # [q, V]
                for route in ROUTES:
                    torch.testing.assert_close(compiled.run_route(route, out), want, rtol=1e-4, atol=1e-4)
                    compiled.routes = {q: route}
                    torch.testing.assert_close(head.draft_logits(target, out), want, rtol=1e-4, atol=1e-4)
        assert compile_count() == before                 # no route compiles anything after the warm-up
        # a measured plan names only the known ways, and none of them transposed when that is off
        monkeypatch.setenv("RESPEC_LINEAR_LAYOUT", "off")
        routes = compiled.measure_routes(rows=(1, 2, 4), rounds=1)
        assert set(routes) == {1, 2, 3, 4} and set(routes.values()) <= {"compiled", "eager"}
        assert compiled.weight_t is None, "the [H, V] copy is dropped where no row count reads it"
        assert "draft output layer" in compiled.describe_routes() == head.output_layer_routes()
        assert eager_head.output_layer_routes() == "eager"
        monkeypatch.setenv("RESPEC_LINEAR_LAYOUT", "sideways")
        with pytest.raises(ValueError, match="RESPEC_LINEAR_LAYOUT"):
            compiled.measure_routes(rows=(1,), rounds=1)
    finally:
        compiled.routes = saved


@pytest.mark.parametrize("route", ["eager", "transposed", "pretransposed"])
def test_greedy_eagle2_equals_vanilla_with_the_output_layer_routed_eagerly(compiled_pair, route):
    target, _, head, _ = compiled_pair
    compiled = head.route
    saved = dict(compiled.routes)
    compiled.routes = {rows: route for rows in range(1, 33)}
    try:
        eager_target = make_target(target.name.removeprefix("tiny-"), dtype=torch.float32)
        ref = run(eager_target, "vanilla", PROMPT, max_new_tokens=40)
        for overrides in (FIXED_TREES, {}):
            assert run(target, "eagle2", PROMPT, head=head, max_new_tokens=40, **overrides).tokens == ref.tokens
    finally:
        compiled.routes = saved


@pytest.mark.xdist_group("compiled_llama")
def test_head_calls_past_the_small_rows_run_eagerly_where_measured_or_forced(llama_pair, monkeypatch):
    """CompiledHead.choose_eager (at the warm-up's end): unforced, the choice is timed at the symbolic
    graph's fewest rows and recorded (which way it goes is the machine's business; the record must
    agree with EAGER_MARGIN); with RESPEC_EAGER_FROM=5, calls of 5 rows and more and their draft
    logits (past the measured routes) run eagerly and equal the eager head, nothing compiles after
    the warm-up, and greedy eagle2 still equals vanilla. The head is the llama pair's (compiled with
    RESPEC_EAGER_FROM unset, conftest.compiled_llama); its choice is put back after."""
    from respec.accel.head_compile import SMALL_ROWS
    from respec.accel.graph_choice import EAGER_MARGIN
    target, eager_head, head = llama_pair.target, llama_pair.eager_head, llama_pair.head
    rows, compiled_ms, eager_ms = head.route.eager_choice
    assert rows == SMALL_ROWS + 1 and compiled_ms > 0 and eager_ms > 0
    assert llama_pair.measured_eager_from == (rows if eager_ms < EAGER_MARGIN * compiled_ms else None)
    assert f"{rows} rows: {compiled_ms:.1f} ms compiled" in head.route.describe_routes()
    for name in ("eager_from", "eager_choice"):           # the forced choice below is undone after the test
        monkeypatch.setattr(head.route, name, getattr(head.route, name))
    monkeypatch.setenv("RESPEC_EAGER_FROM", "5")
    head.route.choose_eager()                  # the choice a compile makes at its warm-up's end, now forced
    assert head.route.eager_from == 5 and head.route.eager_choice is None
    assert "head calls of 5 rows and more eager" in head.output_layer_routes()
    before = compile_count()
    _assert_calls_equal(target, eager_head, head, [(20, False), (1, False), (4, True), (6, True),
                                                   (INITIAL_CAPACITY, False), (5, False), (3, False)], seed=2)
    assert compile_count() == before
    out = run(target, "vanilla", PROMPT, max_new_tokens=20)
    assert run(target, "eagle2", PROMPT, head=head, max_new_tokens=20).tokens == out.tokens
