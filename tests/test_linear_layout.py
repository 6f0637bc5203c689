"""Small-row linears as W @ x^T (respec/accel/linear_layout.py): the same numbers as F.linear, the
plan decides which calls swap (one-row calls as two rows only for its one-row shapes), and greedy
speculative output still equals vanilla with every linear swapped. No verdict here reads the clock: which layout
a machine measures faster is its own business; only the plan's shape is checked."""
import contextlib
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from respec.accel import linear_layout as ll
from respec.accel.head_compile import plan_head_linears
from respec.models.hf import HFTarget
from respec.models.tiny import tiny_llama, tiny_qwen2
from tests.conftest import EOS, run

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8, 9]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("swap, shape", [("transposed_linear", (3, 16)), ("transposed_linear", (1, 5, 16)),
                                         ("transposed_linear", (2, 4, 16)), ("padded_linear", (1, 16)),
                                         ("padded_linear", (1, 1, 16))])
def test_swapped_linears_equal_f_linear(swap, shape, bias):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64)
    w = torch.randn(24, 16, generator=gen, dtype=torch.float64)
    b = torch.randn(24, generator=gen, dtype=torch.float64) if bias else None
    got = getattr(ll, swap)(x, w, b)
    assert got.shape == (*shape[:-1], 24) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, w, b))


def test_one_row_calls_run_as_two_only_for_the_plans_one_row_shapes():
    plan = ll.LinearLayouts((((24, 16), 8),), "test", one_row=((24, 16),))
    w, other = torch.randn(24, 16), torch.randn(8, 16)
    with mock.patch.object(ll, "padded_linear", wraps=ll.padded_linear) as padded:
        with plan.active(1):
            y = F.linear(torch.randn(1, 1, 16), w)
            F.linear(torch.randn(1, 1, 16), other)            # another shape: unchanged
            F.linear(torch.randn(1, 3, 16), w)                 # not one row after all: unchanged
        with plan.active(2):
            F.linear(torch.randn(1, 2, 16), w)                 # two rows: transposed, not padded
    assert y.shape == (1, 1, 24) and padded.call_count == 1
    assert plan.shapes(1) == {(24, 16)} and "one row as two for 24x16" in plan.describe()
    assert ll.LinearLayouts(one_row=((24, 16),)).describe() != "linear layout: F.linear everywhere (off)"


def test_the_plan_swaps_only_its_shapes_up_to_their_row_counts():
    plan = ll.LinearLayouts((((24, 16), 8),), "test")
    w, other = torch.randn(24, 16), torch.randn(8, 16)
    with mock.patch.object(ll, "transposed_linear", wraps=ll.transposed_linear) as swapped:
        for rows in (2, 5, 8):                                 # planned: up to 8 rows
            with plan.active(rows):
                y = F.linear(torch.randn(1, rows, 16), w)
                F.linear(torch.randn(1, rows, 16), other)      # another shape: unchanged
            assert y.shape == (1, rows, 24)
        assert swapped.call_count == 3
        for rows in (1, 9, 100):                               # one row, above the plan's bound
            with plan.active(rows):
                F.linear(torch.randn(rows, 16), w)
        assert swapped.call_count == 3, "Only planned shapes, up to their row counts, may run transposed."
    assert plan.shapes(1) == plan.shapes(9) == frozenset() and plan.shapes(2) == {(24, 16)}
    assert "24x16 up to 8 rows" in plan.describe()


def test_the_setting_chooses_the_plan(monkeypatch):
    model = tiny_llama(seed=0, dtype=torch.float32)
    shapes = {tuple(m.weight.shape) for m in model.modules() if isinstance(m, torch.nn.Linear)}
    monkeypatch.setenv("RESPEC_LINEAR_LAYOUT", "off")
    assert ll.linear_layouts(model).limits == ()
    monkeypatch.setenv("RESPEC_LINEAR_LAYOUT", "Transposed")
    forced = ll.linear_layouts(model)
    assert dict(forced.limits) == {shape: ll.ROWS[-1] for shape in shapes} and forced.source == "transposed"
    assert set(forced.one_row) == shapes
    monkeypatch.setenv("RESPEC_LINEAR_LAYOUT", "auto")
    measured = ll.linear_layouts(model)
    assert measured.source == "auto" and all(s in shapes and most in ll.ROWS for s, most in measured.limits), \
        "A measured plan names only the model's own shapes, up to a measured row count."
    assert set(measured.one_row) <= shapes
    monkeypatch.setenv("RESPEC_LINEAR_LAYOUT", "sideways")
    with pytest.raises(ValueError, match="auto, off, transposed"):
        ll.linear_layouts(model)


def test_a_twin_shares_its_targets_plan(monkeypatch):
    monkeypatch.setenv("RESPEC_LINEAR_LAYOUT", "transposed")
    target = HFTarget(tiny_llama(seed=0, dtype=torch.float32), eos_token_ids=frozenset({EOS}), context_length=256)
    with mock.patch.object(ll, "measure_layouts") as measure:
        assert target.twin().linear_layouts is target.linear_layouts
        measure.assert_not_called()


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_swapped_linears_keep_every_strict_method_lossless(monkeypatch, arch):
    """Every linear of a tree forward (and the output layer over its rows) swapped, one-token steps
    padded to two rows: greedy speculative output equals vanilla, in float64 and float32, and both
    kinds of forward did run swapped."""
    monkeypatch.setenv("RESPEC_LINEAR_LAYOUT", "transposed")
    build = tiny_llama if arch == "llama" else tiny_qwen2
    for dtype in (torch.float64, torch.float32):
        target = HFTarget(build(seed=2, dtype=dtype), eos_token_ids=frozenset({EOS}), context_length=256)
        ref = run(target, "vanilla", PROMPT, max_new_tokens=40)
        with mock.patch.object(ll, "transposed_linear", wraps=ll.transposed_linear) as swapped, \
                mock.patch.object(ll, "padded_linear", wraps=ll.padded_linear) as padded:
            run(target, "vanilla", PROMPT[:1], max_new_tokens=4)      # a one-row prefill, one-token steps
            assert padded.call_count > 0 and swapped.call_count == padded.call_count, \
                "One-row forwards must run their linears as two rows, nothing else."
            for method in ("eagle2", "sam", "respec-strict"):
                out = run(target, method, PROMPT, max_new_tokens=40, **{"tree.auto": False, "sam.len_threshold": 2,
                                                                       "trigger.theta_entropy": 20.0,
                                                                       "candidates.min_match": 2})
                assert out.tokens == ref.tokens, f"{method} ({dtype}) must reproduce vanilla's greedy output."
            assert swapped.call_count > padded.call_count, "Tree forwards must have run their linears swapped."


def test_one_row_forwards_stay_plain_without_one_row_shapes():
    model = tiny_llama(seed=0, dtype=torch.float32)
    plan = ll.LinearLayouts(tuple((tuple(m.weight.shape), 8) for m in model.modules() if isinstance(m, torch.nn.Linear)),
                            "test")
    target = HFTarget(model, eos_token_ids=frozenset({EOS}), context_length=256, layouts=plan)
    with mock.patch.object(ll, "transposed_linear", wraps=ll.transposed_linear) as swapped:
        run(target, "vanilla", PROMPT[:1], max_new_tokens=4)
    assert swapped.call_count == 0, "Without one-row shapes, one-row forwards must run F.linear untouched."


def test_per_call_swaps_each_call_by_its_own_row_count():
    plan = ll.LinearLayouts((((24, 16), 4),), "test", one_row=((24, 16),))
    w, other = torch.randn(24, 16), torch.randn(8, 16)
    with mock.patch.object(ll, "padded_linear", wraps=ll.padded_linear) as padded, \
            mock.patch.object(ll, "transposed_linear", wraps=ll.transposed_linear) as swapped:
        with plan.per_call():
            for rows in (1, 3, 6):
                torch.testing.assert_close(F.linear(torch.ones(rows, 16), w), torch.ones(rows, 16) @ w.t())
            F.linear(torch.randn(1, 16), other)                        # another shape: unchanged
    assert padded.call_count == 1, "one row: as two"
    assert swapped.call_count == 2, "three rows swapped (and the padded call's own), six rows above the plan plain"
    assert isinstance(ll.LinearLayouts().per_call(), type(contextlib.nullcontext()))


def test_an_eager_head_plans_its_own_linears_and_its_draft_output_layer(monkeypatch):
    """An eager EAGLE drafter measures its head's plan (RESPEC_LINEAR_LAYOUT applies): every head
    shape and the draft output layer's; drafting runs swapped calls and greedy output stays
    vanilla's; calls with gradients (training) are never swapped."""
    from respec.config import TreeConfig
    from respec.drafters.eagle2 import Eagle2Drafter
    from respec.drafters.heads.eagle import random_head
    monkeypatch.setenv("RESPEC_LINEAR_LAYOUT", "transposed")
    target = HFTarget(tiny_llama(seed=2, dtype=torch.float32), eos_token_ids=frozenset({EOS}), context_length=256)
    head = random_head(target)
    head.draft_vocab = torch.arange(64)
    Eagle2Drafter(target, head, TreeConfig(total_tokens=8, depth=2, top_k=2, auto=False))
    plan = head.eager_plan[1]
    shapes = {tuple(m.weight.shape) for m in head.modules() if isinstance(m, torch.nn.Linear)}
    assert set(plan.one_row) == shapes | {(64, target.model.config.hidden_size)}
    monkeypatch.setenv("RESPEC_LINEAR_LAYOUT", "off")
    assert plan_head_linears(head, target) is plan, "measured once per target"
    x = torch.randn(3, 2 * target.model.config.hidden_size)
    with mock.patch.object(ll, "transposed_linear", wraps=ll.transposed_linear) as swapped:
        with torch.no_grad(), head._planned():
            head.fc(x)
        assert swapped.call_count == 1
        with torch.enable_grad(), head._planned():
            head.fc(x)
        assert swapped.call_count == 1, "training calls run F.linear"
