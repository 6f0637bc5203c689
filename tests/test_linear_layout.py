"""Small-row linears as W @ x^T (respec/models/linear_layout.py): the same numbers as F.linear, the
plan decides which calls swap, one-token forwards never do, and greedy speculative output still
equals vanilla with every linear of 2+ rows swapped. No verdict here reads the clock: which layout
a machine measures faster is its own business; only the plan's shape is checked."""
from unittest import mock

import pytest
import torch
import torch.nn.functional as F

from respec.models import linear_layout as ll
from respec.models.hf import HFTarget
from respec.models.tiny import tiny_llama, tiny_qwen2
from tests.conftest import EOS, run

PROMPT = [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8, 9]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(3, 16), (1, 5, 16), (2, 4, 16)])
def test_transposed_linear_equals_f_linear(shape, bias):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(*shape, generator=gen, dtype=torch.float64)
    w = torch.randn(24, 16, generator=gen, dtype=torch.float64)
    b = torch.randn(24, generator=gen, dtype=torch.float64) if bias else None
    got = ll.transposed_linear(x, w, b)
    assert got.shape == (*shape[:-1], 24) and got.is_contiguous()
    torch.testing.assert_close(got, F.linear(x, w, b))


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
    monkeypatch.setenv("RESPEC_LINEAR_LAYOUT", "auto")
    measured = ll.linear_layouts(model)
    assert measured.source == "auto" and all(s in shapes and most in ll.ROWS for s, most in measured.limits), \
        "A measured plan names only the model's own shapes, up to a measured row count."
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
    plain: greedy speculative output equals vanilla, in float64 and float32, and trees did run
    swapped while one-token steps did not."""
    monkeypatch.setenv("RESPEC_LINEAR_LAYOUT", "transposed")
    build = tiny_llama if arch == "llama" else tiny_qwen2
    for dtype in (torch.float64, torch.float32):
        target = HFTarget(build(seed=2, dtype=dtype), eos_token_ids=frozenset({EOS}), context_length=256)
        ref = run(target, "vanilla", PROMPT, max_new_tokens=40)
        with mock.patch.object(ll, "transposed_linear", wraps=ll.transposed_linear) as swapped:
            run(target, "vanilla", PROMPT[:1], max_new_tokens=4)      # a one-row prefill, one-token steps
            assert swapped.call_count == 0, "One-row forwards must run F.linear untouched."
            for method in ("eagle2", "sam", "respec-strict"):
                out = run(target, method, PROMPT, max_new_tokens=40, **{"tree.auto": False, "sam.len_threshold": 2,
                                                                       "trigger.theta_entropy": 20.0,
                                                                       "candidates.min_match": 2})
                assert out.tokens == ref.tokens, f"{method} ({dtype}) must reproduce vanilla's greedy output."
            assert swapped.call_count > 0, "Tree forwards must have run their linears swapped."
