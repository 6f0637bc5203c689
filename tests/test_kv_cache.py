"""The slab KV cache (respec/models/kv.py) behaves exactly like transformers' DynamicCache: same
rows after any mix of appends, crops and in-place compaction, and bit-identical target logits."""
from __future__ import annotations

import random

import pytest
import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from respec.models.hf import HFTarget
from respec.models.kv import INITIAL_CAPACITY, SlabLayer, slab_cache
from respec.models.tiny import tiny_llama
from respec.tree import DraftTree
from tests.conftest import make_target


def test_slab_layer_matches_a_dynamic_layer_through_appends_crops_and_compaction():
    rng = random.Random(0)
    slab, ref = SlabLayer(), DynamicLayer()
    length = 0
    for _ in range(200):
        n = rng.choice([1, 1, 3, 16, 40])
        k, v = torch.randn(1, 2, n, 4), torch.randn(1, 2, n, 4)
        ks, vs = slab.update(k, v)
        kr, vr = ref.update(k, v)
        length += n
        assert torch.equal(ks, kr) and torch.equal(vs, vr) and slab.get_seq_length() == length
        drop = rng.randint(0, n - 1)
        if drop:
            slab.crop(-drop)
            ref.crop(-drop)
            length -= drop
        if length > 3 and rng.random() < 0.3:      # HFTarget.keep's compaction writes through the view
            src = torch.tensor([length - 1, length - 3])
            for layer in (slab, ref):
                for t in (layer.keys, layer.values):
                    t[:, :, length - 3:length - 1] = t.index_select(2, src)
        assert torch.equal(slab.keys, ref.keys) and torch.equal(slab.values, ref.values)
    assert length > INITIAL_CAPACITY, "the test grows the slab past its first capacity"
    with pytest.raises(ValueError, match="negative"):
        slab.crop(3)


def test_slab_cache_replaces_only_plain_full_attention_layers():
    target = make_target("llama")
    cache = slab_cache(target.model.config)
    assert cache.layers and all(isinstance(layer, SlabLayer) for layer in cache.layers)
    assert len(cache.layers) == len(DynamicCache(config=target.model.config).layers)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_target_logits_are_bit_identical_with_the_slab_cache(arch, monkeypatch):
    """The same prefill, trees, keeps and chains through both caches give equal logits."""
    rng = random.Random(1)
    prompt = [rng.randrange(3, 120) for _ in range(30)]
    plan = []
    for _ in range(12):
        n = rng.randint(1, 9)
        parents = [-1] + [rng.randrange(0, i) for i in range(1, n)]
        tokens = [rng.randrange(3, 120) for _ in range(n)]
        node, path = n - 1, []
        while node >= 0:
            path.append(node)
            node = parents[node]
        plan.append((tokens, parents, sorted(path)))

    def logits_with(cache_factory):
        target = make_target(arch)
        monkeypatch.setattr("respec.models.hf.slab_cache", cache_factory)
        outs = [target.prefill(prompt).logits]
        for tokens, parents, path in plan:
            outs.append(target.forward_tree(DraftTree.from_parents(tokens, parents, "eagle")).logits)
            target.keep(path)
        return outs, target.kv_len

    slab, slab_len = logits_with(slab_cache)
    dyn, dyn_len = logits_with(lambda config: DynamicCache(config=config))
    assert slab_len == dyn_len == len(prompt) + sum(len(p) for _, _, p in plan)
    for a, b in zip(slab, dyn):
        assert torch.equal(a, b)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_tree_attention_packs_the_query_heads_and_matches_stock_sdpa(arch, monkeypatch):
    """HFTarget switches the model to respec_sdpa; masked tree forwards then fold the g query heads
    of each KV head into its rows and tile the mask (no repeat_kv, no enable_gqa). In float32 the
    logits equal those of the stock sdpa path, and calls without the flag (model.generate, the hf
    peers) stay on the stock function."""
    from respec.models import attention

    target = make_target(arch, dtype=torch.float32)
    cfg = target.model.config
    assert cfg._attn_implementation == attention.NAME and target._tree_kwargs
    assert cfg.num_attention_heads > cfg.num_key_value_heads, "a GQA model, or the test shows nothing"
    seen = []                     # (enable_gqa, heads of the query, heads of the keys, masked) of every SDPA call
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((kw.get("enable_gqa", False), q.shape[1], k.shape[1], kw.get("attn_mask") is not None))
        return sdpa(q, k, v, **kw)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)

    rng = random.Random(2)
    prompt = [rng.randrange(3, 120) for _ in range(40)]
    tree = DraftTree.from_parents([rng.randrange(3, 120) for _ in range(9)], [-1, 0, 0, 1, 1, 2, 3, 3, 6], "eagle")
    chain = DraftTree.chain(7, [8, 9, 10, 11], "retrieval")
    outs = {}
    hkv, h = cfg.num_key_value_heads, cfg.num_attention_heads
    for flag in (True, False):
        target._tree_kwargs = {"respec_gqa": True} if flag else {}
        target.prefill(prompt)
        seen.clear()
        a = target.forward_tree(tree).logits
        target.keep([0, 1, 3])
        b = target.forward_tree(chain).logits
        target.keep([0, 1])
        outs[flag] = (a, b)
        assert seen and all(masked for *_, masked in seen), "tree and chain forwards carry a mask"
        want = {(False, hkv, hkv, True)} if flag else {(False, h, h, True)}
        assert set(seen) == want, f"respec_gqa={flag}: SDPA calls {seen[:3]}"
    for got, ref in zip(outs[True], outs[False]):
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
        assert torch.equal(got.argmax(-1), ref.argmax(-1))
    seen.clear()
    target.model.generate(torch.tensor([prompt]), max_new_tokens=3, do_sample=False)
    # stock sdpa uses grouped SDPA only without a mask; with one it repeats the keys to every head
    assert seen and not any(g and masked for g, _, _, masked in seen), "model.generate stays on the stock path"


@pytest.mark.parametrize("q_len", [1, 6])
def test_the_packed_path_is_the_same_on_every_device(q_len, monkeypatch):
    """The engine's masked GQA call packs wherever its tensors live (here the meta device, which is
    neither the CPU nor CUDA): one SDPA call over the KV heads, never the stock repeat_kv path."""
    from respec.models.attention import respec_sdpa

    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        calls.append((tuple(q.shape), tuple(k.shape), kw.get("enable_gqa", False)))
        return sdpa(q, k, v, **kw)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    module = torch.nn.Module()
    module.num_key_value_groups, module.training = 3, False
    b, h, hkv, k, d = 1, 9, 3, 20, 8
    with torch.device("meta"):
        q = torch.randn(b, h, q_len, d)
        key, value = torch.randn(b, hkv, k, d), torch.randn(b, hkv, k, d)
        mask = torch.zeros(b, 1, q_len, k)
    out, _ = respec_sdpa(module, q, key, value, mask, scaling=0.3, respec_gqa=True)
    assert out.shape == (b, q_len, h, d)
    assert calls == [((b, hkv, 3 * q_len, d), (b, hkv, k, d), False)], calls


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_tree_attention_matches_repeated_heads(dtype):
    """Several queries under a tree mask, packed per KV head with the mask tiled, equal SDPA over
    keys and values repeated to every query head (head h reads KV head h // g)."""
    from respec.models.attention import packed_gqa

    gen = torch.Generator().manual_seed(1)
    b, h, hkv, q_len, past, d = 1, 8, 2, 5, 11, 16
    k = past + q_len
    q = torch.randn(b, h, q_len, d, generator=gen).to(dtype)
    key = torch.randn(b, hkv, k, d, generator=gen).to(dtype)
    value = torch.randn(b, hkv, k, d, generator=gen).to(dtype)
    tree = DraftTree.from_parents([1, 2, 3, 4, 5], [-1, 0, 0, 1, 2], "eagle")
    from respec.models.attention import additive_mask
    mask = additive_mask(~tree.attention_mask(), past, dtype)                           # [1, 1, q, k]
    g = h // hkv
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), key.float().repeat_interleave(g, dim=1), value.float().repeat_interleave(g, dim=1),
        attn_mask=mask.float(), scale=0.25)                                            # [b, h, q, d]
    out = packed_gqa(q, key, value, mask, 0.25, g)                                      # [b, q, h, d]
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref.transpose(1, 2), atol=tol, rtol=tol)


@pytest.mark.parametrize("method", ["eagle2", "sam"])
def test_generation_across_the_slab_growth_equals_vanilla(method):
    """A prompt just under the slab's first capacity: the target's and the head's slabs grow during
    decoding, mid tree forward, and the output still equals vanilla's token for token."""
    from tests.conftest import OracleDrafter, run

    target = HFTarget(tiny_llama(max_positions=1024), eos_token_ids=frozenset(), context_length=1024,
                      name="tiny-llama-1k")
    rng = random.Random(4)
    prompt = [rng.randrange(3, 120) for _ in range(INITIAL_CAPACITY - 6)]
    ref = run(target, "vanilla", prompt, max_new_tokens=40)
    assert len(ref.tokens) == 40
    if method == "eagle2":        # an oracle that is right for a while, then wrong: long accepted paths
        drafter = OracleDrafter(ref.tokens, len(prompt), "partial", target.vocab_size, seed=1)
        out = run(target, "eagle2", prompt, drafter=drafter, max_new_tokens=40)
    else:                         # the random head's cache grows too
        out = run(target, "sam", prompt, max_new_tokens=40, **{"tree.auto": False, "sam.len_threshold": 2})
    assert out.tokens == ref.tokens
    assert target.cache.layers[0]._k.shape[2] > INITIAL_CAPACITY, "the target's slab grew"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_single_query_packing_matches_repeated_heads(dtype, masked):
    """One query per head, packed as the g queries of each KV head, equals SDPA over keys and values
    repeated to every query head (transformers' repeat_kv order: head h reads KV head h // g)."""
    from respec.models.attention import _single_query

    gen = torch.Generator().manual_seed(0)
    b, h, hkv, k, d = 2, 9, 3, 37, 16
    q = torch.randn(b, h, 1, d, generator=gen).to(dtype)
    key = torch.randn(b, hkv, k, d, generator=gen).to(dtype)
    value = torch.randn(b, hkv, k, d, generator=gen).to(dtype)
    mask = None
    if masked:
        blocked = torch.rand(b, 1, 1, k, generator=gen) < 0.3
        blocked[..., -1] = False
        mask = torch.zeros(b, 1, 1, k, dtype=dtype).masked_fill(blocked, torch.finfo(dtype).min)
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.float(), key.float().repeat_interleave(h // hkv, dim=1), value.float().repeat_interleave(h // hkv, dim=1),
        attn_mask=None if mask is None else mask.float(), scale=0.125)                 # [b, h, 1, d]
    out = _single_query(q, key, value, mask, 0.125, h // hkv)                          # [b, 1, h, d]
    assert out.shape == (b, 1, h, d) and out.dtype == dtype
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(out.float(), ref.transpose(1, 2), atol=tol, rtol=tol)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_decode_steps_pack_the_single_query(arch, monkeypatch):
    """A root-only step (vanilla's, and every method's non-drafting step) runs SDPA once per layer on
    the KV heads with the g queries of each packed (no enable_gqa, no repeated keys); its logits
    match the stock single-token path."""
    target = make_target(arch)
    cfg = target.model.config
    groups = cfg.num_attention_heads // cfg.num_key_value_heads
    assert groups > 1, "a GQA model, or the test shows nothing"
    seen = []                                      # (enable_gqa, heads of the query, query length) per call
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, **kw):
        seen.append((kw.get("enable_gqa", False), q.shape[1], q.shape[2]))
        return sdpa(q, k, v, **kw)
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    rng = random.Random(3)
    prompt = [rng.randrange(3, 120) for _ in range(30)]
    kwargs = dict(target._tree_kwargs)
    logits = {}
    for flag in (True, False):
        target._tree_kwargs = kwargs if flag else {}
        target.prefill(prompt)
        seen.clear()
        steps = []
        for tok in (7, 11, 13):
            steps.append(target.forward_tree(DraftTree.root_only(tok)).logits)
            target.keep([0])
        logits[flag] = torch.cat(steps)
        if flag:
            assert seen == [(False, cfg.num_key_value_heads, groups)] * (3 * cfg.num_hidden_layers)
        else:
            assert seen and all(q_heads == cfg.num_attention_heads for _, q_heads, _ in seen)
    torch.testing.assert_close(logits[True], logits[False], atol=1e-4, rtol=1e-4)
