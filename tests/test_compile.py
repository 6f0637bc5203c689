"""The compiled target forward (`--compile on`, respec/accel/compiled.py) on a tiny Llama in
float32: the same logits (and verification numbers) as the eager forward for 1-, 7- and 33-token
trees over growing contexts,
no recompilation after the warm-up across mixed tree sizes, greedy methods equal to vanilla, and
`off` leaving the eager path."""
from __future__ import annotations

import random

import pytest
import torch

from respec.accel.compiled import check_compile_choice, compile_count
from respec.tree import DraftTree
from respec.verify import read_number_table, read_numbers
from tests.conftest import OracleDrafter, kept_path, make_target, random_tree, run

PROMPT = [5, 17, 9, 33, 12, 8, 21, 40, 7, 3, 19, 26]

# with pytest-xdist (README's test command), every test here runs in the worker that holds the
# session's compiled Llama (conftest.compiled_llama), as do the tests of test_head_compile.py that use it
pytestmark = pytest.mark.xdist_group("compiled_llama")


@pytest.fixture
def pair(shared_compiled, monkeypatch):
    """An eager tiny Llama and the session's compiled one (conftest.compiled_llama: same seed, the
    same weights)."""
    eager = make_target("llama", dtype=torch.float32)
    # the tests below check the symbolic-row graph: larger trees stay compiled whatever this
    # machine measured (graph_choice.choose_eager_from; test_larger_trees_run_eagerly_... checks that)
    monkeypatch.setattr(shared_compiled.fast, "eager_from", None)
    return eager, shared_compiled


def test_compiled_logits_equal_eager_for_trees_over_growing_contexts(pair):
    eager, compiled = pair
    assert compiled.compiled and not eager.compiled and compiled.fast.logits is not None   # the output layer too
    rng = random.Random(0)
    a, b = eager.prefill(PROMPT), compiled.prefill(PROMPT)
    torch.testing.assert_close(b.logits, a.logits, rtol=1e-4, atol=1e-4)
    for n in (1, 2, 7, 33, 3, 4, 1, 2, 7, 33, 4, 3, 7):      # 2-4 rows: the static few-row output layer
        tree = random_tree(rng, n, eager.vocab_size)
        a, b = eager.forward_tree(tree), compiled.forward_tree(tree)
        torch.testing.assert_close(b.logits, a.logits, rtol=1e-4, atol=1e-4)        # [n, V]
        torch.testing.assert_close(b.hidden, a.hidden, rtol=1e-4, atol=1e-4)        # [n, H]
        fused = read_number_table(b.numbers)          # the numbers the compiled output layer fused
        plain = read_numbers(tree, b.logits)
        assert fused.top1 == plain.top1 and fused.ranks == plain.ranks
        for name in ("entropies", "margins", "gaps", "logprobs", "probs"):
            assert getattr(fused, name) == pytest.approx(getattr(plain, name), abs=1e-4), name
        path = kept_path(tree, rng)
        eager.keep(path)
        compiled.keep(path)
        assert eager.kv_len == compiled.kv_len


def test_no_recompilation_after_warm_up_across_mixed_tree_sizes(compiled_llama):
    """A freshly loaded target: the warm-up alone must have compiled every graph a run takes
    (one token, chains, branching trees, over grown caches). Checked on the session's compiled
    Llama right after its warm-up, before any other test used it (conftest._fresh_load_compiles)."""
    assert compiled_llama.fresh_compiles["mixed tree sizes"] == 0


def test_no_recompilation_when_a_step_fills_the_cache_to_its_last_row(compiled_llama):
    """The slab's view covering its whole buffer (contiguous) is another case for the graphs'
    guards: one-token steps and chains stepping across the first capacity compile nothing new
    (conftest._fresh_load_compiles, right after the warm-up)."""
    assert compiled_llama.fresh_compiles["the first slab filled to its last row"] == 0


@pytest.mark.parametrize("mode", ["same", "partial", "random"])
def test_greedy_drafting_on_the_compiled_forward_equals_vanilla(pair, mode):
    eager, compiled = pair
    ref = run(eager, "vanilla", PROMPT, max_new_tokens=40)
    drafter = OracleDrafter(ref.tokens, len(PROMPT), mode, compiled.vocab_size, seed=3)
    out = run(compiled, "eagle2", PROMPT, drafter=drafter, max_new_tokens=40)
    assert out.tokens == ref.tokens
    assert run(compiled, "vanilla", PROMPT, max_new_tokens=40).tokens == ref.tokens


def test_compile_off_is_the_eager_path_and_bad_choices_fail_in_one_line():
    assert check_compile_choice("OFF") == "off" and check_compile_choice("on") == "on"
    with pytest.raises(ValueError, match="--compile must be one of off, on"):
        check_compile_choice("fast")
    assert not make_target("qwen2", dtype=torch.float32).compiled


def test_reserve_grows_the_slabs_before_a_forward_so_none_grows_inside_it():
    from respec.models.kv import INITIAL_CAPACITY, reserve, slab_cache

    target = make_target("llama", dtype=torch.float32)
    target.prefill(PROMPT)
    layer = target.cache.layers[0]
    before = layer._k.shape[2]
    assert before == INITIAL_CAPACITY
    reserve(target.cache, INITIAL_CAPACITY)              # more rows than are left
    assert layer._k.shape[2] >= len(PROMPT) + INITIAL_CAPACITY and layer.keys.shape[2] == len(PROMPT)
    grown = layer._k.shape[2]
    tree = random_tree(random.Random(2), 33, target.vocab_size)
    target.forward_tree(tree)
    assert layer._k.shape[2] == grown                    # the forward itself grew nothing
    reserve(slab_cache(target.model.config), 10)         # uninitialised layers: nothing to grow


def test_a_one_token_step_run_as_two_rows_equals_the_one_row_graph(pair):
    """float32 with MKL runs a compiled one-token step as a two-token chain and drops the second
    row (compiled.one_row_as_two): the same logits, hidden state and numbers as the one-row graph,
    and the cache one row longer, as after any one-token step."""
    from respec.accel.compiled import one_row_as_two

    _, compiled = pair
    assert compiled.fast.pad_one == one_row_as_two(compiled.device, torch.float32)
    assert not one_row_as_two(compiled.device, torch.bfloat16)
    outs = {}
    for pad in (True, False):
        compiled.fast.pad_one = pad
        compiled.prefill(PROMPT)
        for step, token in enumerate((7, 11, 13)):
            out = compiled.forward_tree(DraftTree.root_only(token))
            compiled.keep([0])
            assert compiled.kv_len == len(PROMPT) + step + 1
            outs.setdefault(pad, []).append(out)
    compiled.fast.pad_one = one_row_as_two(compiled.device, torch.float32)
    for a, b in zip(outs[True], outs[False]):
        assert a.logits.shape == b.logits.shape == (1, compiled.vocab_size)
        torch.testing.assert_close(a.logits, b.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(a.hidden, b.hidden, rtol=1e-4, atol=1e-4)
        assert read_number_table(a.numbers).top1 == read_number_table(b.numbers).top1


def test_the_compiled_cost_curve_is_measured_at_3_rows_past_the_static_two_row_graph(pair, monkeypatch):
    """With the static two-row graph (compiled.one_row_options: the CPU), 3 rows are the symbolic
    graph's first size, so the curve measures them instead of interpolating between 2 and 4 (which
    priced them ~3 ms low on a bf16 CPU without AMX, commit 538c1f4 of 2026-12-06); an eager curve does not."""
    eager, compiled = pair
    monkeypatch.setattr(compiled.fast, "buckets", ())          # no bucket edge: the two-row graph's alone
    monkeypatch.setattr(compiled, "_cost_curves", {})
    assert compiled.fast.two_rows and eager.fast is None
    assert {1, 2, 3, 4, 8, 10} == set(compiled.verify_cost_curve(max_size=10, context=16, reps=0))
    assert {1, 2, 4, 8, 10} == set(eager.verify_cost_curve(max_size=10, context=16, reps=0))


def test_trees_padded_to_a_static_bucket_equal_the_unpadded_forward(shared_compiled, monkeypatch):
    """`RESPEC_PAD_ROWS=4,8` (compiled.tree_buckets, forced on a float32 tiny model): forwards of
    3-4 rows run padded to 4 and of 5-8 rows to 8 through the buckets' static graphs, larger ones
    through the symbolic graph; chains and branching trees alike give the eager logits, hidden states and numbers,
    the cache holds only the real rows, and nothing compiles after the warm-up."""
    monkeypatch.setenv("RESPEC_PAD_ROWS", "4,8")
    monkeypatch.setenv("RESPEC_EAGER_FROM", "off")            # larger trees: the symbolic graph
    from respec.accel.compiled import tree_buckets
    eager = make_target("llama", dtype=torch.float32)
    compiled = shared_compiled                                # its graphs hold both default float32 buckets
    compiled.fast.buckets = tree_buckets(compiled.device, compiled.dtype)   # what a load under the variable builds
    compiled.fast.choose(compiled)                            # the choices a load makes after its warm-up
    assert compiled.fast.buckets == (4, 8) and compiled.fast.bucket_choice == {}, "forced: not re-measured"
    assert compiled.fast.eager_from is None and compiled.fast.eager_choice is None, "forced off: not measured"
    assert compiled.fast.describe() == "compiled trees padded to static graphs of 4, 8 rows"
    rng = random.Random(4)
    eager.prefill(PROMPT)
    compiled.prefill(PROMPT)
    before = compile_count()
    for n, chain in ((3, True), (5, False), (8, False), (1, True), (8, True), (4, False), (12, False), (2, True),
                     (6, True), (7, False), (20, True), (3, False)):
        tree = (DraftTree.chain(rng.randrange(3, 60), [rng.randrange(3, 60) for _ in range(n - 1)], "eagle")
                if chain else random_tree(rng, n, eager.vocab_size))
        a, b = eager.forward_tree(tree), compiled.forward_tree(tree)
        assert b.logits.shape == a.logits.shape == (n, eager.vocab_size)
        torch.testing.assert_close(b.logits, a.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b.hidden, a.hidden, rtol=1e-4, atol=1e-4)
        assert read_number_table(b.numbers).top1 == read_numbers(tree, b.logits).top1
        assert compiled.cache.get_seq_length() == eager.cache.get_seq_length()     # no padded row left behind
        path = kept_path(tree, rng)
        eager.keep(path)
        compiled.keep(path)
        assert eager.kv_len == compiled.kv_len
    assert compile_count() == before
    # the cost curve is measured where the padded cost steps (3 runs as 4, 5 as 8, 9 unpadded); eager: none
    assert {3, 4, 5, 8, 9} <= set(compiled.verify_cost_curve(max_size=10, context=16, reps=0))
    assert set(eager.verify_cost_curve(max_size=10, context=16, reps=0)) == {1, 2, 4, 8, 10}
    assert compile_count() == before
    out = run(compiled, "vanilla", PROMPT, max_new_tokens=30)
    drafter = OracleDrafter(out.tokens, len(PROMPT), "partial", compiled.vocab_size, seed=5)
    assert run(compiled, "eagle2", PROMPT, drafter=drafter, max_new_tokens=30).tokens == out.tokens


def test_choose_buckets_keeps_a_bucket_only_where_padding_beats_the_symbolic_graph_at_its_fewest_rows():
    """Pure, on given times: each bucket is judged at the fewest rows it would serve (3, or one
    more than the last bucket kept); a dropped bucket's rows fall to the next one, judged from there."""
    from respec.accel.compiled import bucket_edges, bucket_for, bucket_spans
    from respec.accel.graph_choice import BUCKET_MARGIN, choose_buckets
    asked = []

    def times(table):
        def time_pair(bucket, rows):
            asked.append((bucket, rows))
            return table[bucket, rows]
        return time_pair
    kept, why = choose_buckets((4, 8), times({(4, 3): (13.0, 20.0), (8, 5): (19.0, 23.0)}), margin=0.9)
    assert kept == (4, 8) and asked == [(4, 3), (8, 5)]
    assert why == {4: (3, 13.0, 20.0), 8: (5, 19.0, 23.0)}
    asked.clear()
    kept, why = choose_buckets((4, 8), times({(4, 3): (20.0, 21.0), (8, 3): (24.0, 30.0)}), margin=0.9)
    assert kept == (8,) and asked == [(4, 3), (8, 3)], "4 barely faster: dropped; 8 judged from 3 rows"
    assert why == {4: (3, 20.0, 21.0), 8: (3, 24.0, 30.0)}
    kept, _ = choose_buckets((16,), times({(16, 3): (40.0, 30.0)}))
    assert kept == () and BUCKET_MARGIN < 1.0
    assert choose_buckets((), times({})) == ((), {})
    assert [bucket_for((4, 8), n) for n in (1, 2, 3, 4, 5, 8, 9)] == [None, None, 4, 4, 8, 8, None]
    assert bucket_for((), 5) is None
    assert bucket_edges((4, 8)) == (3, 4, 5, 8, 9) and bucket_edges((16,)) == (3, 16, 17) and bucket_edges(()) == ()
    assert bucket_edges((), two_rows=True) == (3,) and bucket_edges((4, 8), two_rows=True) == (3, 4, 5, 8, 9)
    assert bucket_spans((4, 8)) == ((3, 4), (5, 8)) and bucket_spans((16,)) == ((3, 16),) and bucket_spans(()) == ()


def test_choose_eager_from_sends_larger_trees_eagerly_only_where_eager_is_clearly_faster(monkeypatch):
    """Pure, on given times: judged once, at the symbolic graph's fewest rows; eager must take
    under EAGER_MARGIN of the symbolic graph's ms (commit 671c23f of 2026-12-07: 1,171 ms compiled against ~150 eager
    at 9 rows, bf16 without bf16 instructions). RESPEC_EAGER_FROM forces it either way."""
    from respec.accel.graph_choice import EAGER_MARGIN, choose_eager_from, forced_eager_from
    asked = []

    def times(symbolic, eager):
        def time_pair(rows):
            asked.append(rows)
            return symbolic, eager
        return time_pair
    assert choose_eager_from(9, times(1170.8, 150.0)) == (9, (9, 1170.8, 150.0)) and asked == [9]
    assert choose_eager_from(3, times(30.0, 45.0)) == (None, (3, 30.0, 45.0))
    assert choose_eager_from(9, times(30.0, 29.0)) == (None, (9, 30.0, 29.0)), "barely faster: stays compiled"
    assert choose_eager_from(9, times(30.0, 20.0), margin=0.5)[0] is None and 0.5 < EAGER_MARGIN < 1.0
    monkeypatch.delenv("RESPEC_EAGER_FROM", raising=False)
    assert forced_eager_from() == ""
    for value, want in (("off", None), ("OFF", None), ("12", 12), (" 9 ", 9)):
        monkeypatch.setenv("RESPEC_EAGER_FROM", value)
        assert forced_eager_from() == want
    for bad in ("1", "nine", "-3"):
        monkeypatch.setenv("RESPEC_EAGER_FROM", bad)
        with pytest.raises(ValueError, match="RESPEC_EAGER_FROM"):
            forced_eager_from()


def test_fastest_of_rounds_interleaves_the_ways_and_drops_the_first_round():
    """Pure: every round runs each way once, in order, after `pause`; the untimed first round
    (allocation) never counts, so a slow first call cannot decide a choice."""
    from respec.accel.graph_choice import fastest_of_rounds
    calls, pauses = [], []
    ms = {"a": iter([1.0, 9.0, 7.0, 8.0]), "b": iter([0.5, 6.0, 5.0, 6.5])}

    def run_ms(way):
        calls.append(way)
        return next(ms[way])
    assert fastest_of_rounds(["a", "b"], run_ms, 3, lambda: pauses.append(len(calls))) == (7.0, 5.0)
    assert calls == ["a", "b"] * 4 and pauses == [0, 2, 4, 6]


def test_larger_trees_run_eagerly_where_measured_or_forced_and_equal_the_compiled_results(compiled_llama,
                                                                                           shared_compiled,
                                                                                           monkeypatch):
    """Trees of eager_from rows and more take the eager forward and output layer (no compiled
    graph, nothing compiled after the warm-up); smaller ones the compiled graphs; every size gives
    the eager logits, hidden states and numbers, and a greedy method still equals vanilla. Unforced,
    the choice is measured at warm-up and recorded (which way it goes is the machine's business;
    the record must agree with EAGER_MARGIN)."""
    from respec.accel.graph_choice import EAGER_MARGIN
    measured = shared_compiled              # loaded with RESPEC_EAGER_FROM unset (conftest.compiled_llama)
    rows, symbolic, eager_ms = compiled_llama.eager_choice
    assert rows == max(measured.fast.buckets, default=2) + 1 and symbolic > 0 and eager_ms > 0
    assert measured.fast.eager_from == (rows if eager_ms < EAGER_MARGIN * symbolic else None)
    assert f"{rows} rows: {symbolic:.1f} ms compiled against {eager_ms:.1f} eager" in measured.fast.describe()
    monkeypatch.setenv("RESPEC_EAGER_FROM", "9")
    monkeypatch.setenv("RESPEC_PAD_ROWS", ",".join(map(str, measured.fast.buckets)) or "0")   # kept as measured
    eager = make_target("llama", dtype=torch.float32)
    compiled = measured
    compiled.fast.choose(compiled)                            # the choices a load makes after its warm-up
    assert compiled.fast.eager_from == 9 and compiled.fast.eager_choice is None
    assert [compiled.runs_compiled(n) for n in (1, 2, 8, 9, 33)] == [True, True, True, False, False]
    assert not eager.runs_compiled(1)
    rng = random.Random(7)
    eager.prefill(PROMPT)
    compiled.prefill(PROMPT)
    before = compile_count()
    for n in (9, 1, 33, 4, 12, 2, 8, 20):
        tree = random_tree(rng, n, eager.vocab_size)
        a, b = eager.forward_tree(tree), compiled.forward_tree(tree)
        torch.testing.assert_close(b.logits, a.logits, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(b.hidden, a.hidden, rtol=1e-4, atol=1e-4)
        assert (b.numbers is None) == (n >= 9), "the eager output layer leaves the numbers to the engine"
        if b.numbers is not None:
            assert read_number_table(b.numbers).top1 == read_numbers(tree, b.logits).top1
        path = kept_path(tree, rng)
        eager.keep(path)
        compiled.keep(path)
        assert eager.kv_len == compiled.kv_len == compiled.cache.get_seq_length()
    assert compile_count() == before
    out = run(compiled, "vanilla", PROMPT, max_new_tokens=30)
    drafter = OracleDrafter(out.tokens, len(PROMPT), "partial", compiled.vocab_size, seed=5)
    assert run(compiled, "eagle2", PROMPT, drafter=drafter, max_new_tokens=30).tokens == out.tokens


def test_tree_buckets_defaults_and_the_forcing_variable(monkeypatch):
    from respec.accel import compiled
    from respec.accel.compiled import BF16_BUCKETS, FLOAT32_BUCKETS, forced_buckets, tree_buckets
    cpu = torch.device("cpu")
    monkeypatch.setattr(compiled, "onednn_has_bf16", lambda: True)    # this CPU's oneDNN aside
    monkeypatch.delenv("RESPEC_PAD_ROWS", raising=False)
    monkeypatch.delenv("RESPEC_ONE_ROW_AUTOTUNE", raising=False)
    assert forced_buckets() is None
    assert tree_buckets(cpu, torch.float32) == FLOAT32_BUCKETS
    assert tree_buckets(cpu, torch.float16) == ()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True, raising=False)
    assert tree_buckets(cpu, torch.bfloat16) == (16,)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    assert tree_buckets(cpu, torch.bfloat16) == BF16_BUCKETS
    assert tree_buckets(torch.device("cuda"), torch.float32) == ()
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX512_CORE")
    assert tree_buckets(cpu, torch.bfloat16) == BF16_BUCKETS == (4,)   # stands in for a CPU without AMX
    monkeypatch.setattr(compiled, "onednn_has_bf16", lambda: False)   # bf16 on an AVX2-only CPU
    assert tree_buckets(cpu, torch.bfloat16) == FLOAT32_BUCKETS
    monkeypatch.setattr(compiled, "onednn_has_bf16", lambda: True)
    monkeypatch.setenv("RESPEC_ONE_ROW_AUTOTUNE", "0")
    assert tree_buckets(cpu, torch.float32) == ()                      # no small-row autotune: no static graphs
    monkeypatch.setenv("RESPEC_PAD_ROWS", "8, 4,2")
    assert tree_buckets(cpu, torch.float32) == (4, 8) == forced_buckets()   # forced anywhere; < 3 dropped
    monkeypatch.setenv("RESPEC_PAD_ROWS", "0")
    assert tree_buckets(cpu, torch.bfloat16) == ()
    monkeypatch.setenv("RESPEC_PAD_ROWS", "four")
    with pytest.raises(ValueError, match="RESPEC_PAD_ROWS"):
        tree_buckets(cpu, torch.float32)


def test_the_default_float32_buckets_are_measured_at_warm_up_and_kept_only_where_faster(pair):
    """The tiny float32 model compiles with FLOAT32_BUCKETS and keeps what `choose_buckets` found
    faster on this machine (which ones is the machine's business; the record must agree with it)."""
    from respec.accel.compiled import FLOAT32_BUCKETS
    from respec.accel.graph_choice import BUCKET_MARGIN
    _, compiled = pair
    choice = compiled.fast.bucket_choice
    assert choice and set(choice) <= set(FLOAT32_BUCKETS) and min(choice) == FLOAT32_BUCKETS[0]
    assert set(compiled.fast.buckets) <= set(choice)
    for b, (rows, padded, symbolic) in choice.items():
        assert 3 <= rows <= b and padded > 0 and symbolic > 0
        assert (b in compiled.fast.buckets) == (padded < BUCKET_MARGIN * symbolic)
        assert f"{b} rows: {rows} padded" in compiled.fast.describe()
    assert compiled.describe_forward().static_buckets == compiled.fast.buckets
