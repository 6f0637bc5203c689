"""EAGLE-2 mechanics: the dynamic tree's scores equal sequential head runs along each path (tree
mask, positions and feature routing), catch-up after non-drafting steps, and checkpoint loading in
the published format (Llama-style and Qwen2-style with q/k/v biases)."""
import json

import pytest
import torch

from respec.config import TreeConfig
from respec.drafters.eagle2 import Eagle2Drafter, expand_tree
from respec.drafters.heads.eagle import random_head
from respec.drafters.heads.checkpoint import load_eagle_head, save_eagle_head
from respec.errors import ModelLoadError
from tests.conftest import inject_costs, make_target, run

PROMPT = [5, 17, 33, 9, 71, 4, 88, 12]


def _sequential_scores(target, head, prompt, tree):
    """Score every node by running the head along its path one token at a time."""
    from transformers import DynamicCache
    hidden = target.prefill(prompt).hidden
    root = tree.tokens[0]
    scores = {}
    for node in range(1, tree.size):
        path = [tree.tokens[j] for j in tree.path_to(node)]          # root ... node
        cache = DynamicCache()
        toks = list(prompt[1:]) + [root]
        pos = torch.arange(len(prompt))
        out = head(target.embed(torch.tensor(toks)), hidden, pos, cache, None)
        f = out[-1]
        total = 0.0
        for i, tok in enumerate(path[1:]):
            lp = torch.log_softmax(target.lm_head(f[None]).float(), -1)[0]
            total += lp[tok].item()
            if i < len(path) - 2:
                f = head(target.embed(torch.tensor([tok])), f[None], torch.tensor([len(prompt) + i]), cache, None)[0]
        scores[node] = total
    return scores


@pytest.mark.parametrize("arch,qkv", [("llama", False), ("qwen2", True)])
def test_tree_scores_equal_sequential_head_runs(arch, qkv):
    target = make_target(arch, seed=1)
    head = random_head(target, seed=2, qkv_bias=qkv)
    drafter = Eagle2Drafter(target, head, TreeConfig(top_k=3, depth=3, total_tokens=12))
    hidden = target.prefill(PROMPT).hidden
    drafter.reset(PROMPT, hidden)
    root = 40
    tree = drafter.draft_tree(PROMPT, root).tree
    assert tree.size == 12 and set(tree.sources[1:]) == {"eagle"}
    assert drafter.kv_len == len(PROMPT), "Draft-tree KV must be discarded; only the context stays."
    want = _sequential_scores(target, head, PROMPT, tree)
    for node, s in want.items():
        assert tree.scores[node] == pytest.approx(s, abs=1e-9), \
            f"Node {node}: a tree-masked head step must equal running its path alone."


def test_expand_tree_keeps_best_nodes_ancestor_closed():
    V = 6
    # fake head: child log-probs depend only on depth, so the search is predictable
    def step_fn(feats, tokens, depth, parent_slots):
        lp = torch.log_softmax(torch.arange(V, dtype=torch.float64).flip(0) * (depth + 1.0), -1)
        return feats, lp.expand(len(tokens), V)
    root_logp = torch.log_softmax(torch.tensor([3.0, 2.0, 1.0, 0.0, -1.0, -2.0]), -1)
    tree = expand_tree(step_fn, 99, torch.zeros(4), root_logp, TreeConfig(top_k=2, depth=2, total_tokens=6))
    assert tree.size == 6
    for i in range(1, tree.size):
        p = tree.parents[i]
        assert p == 0 or tree.scores[p] >= tree.scores[i], "Scores never increase along a path."
    assert tree.tokens[1] == 0, "The most likely first token is kept."


def test_catch_up_after_steps_without_drafting():
    """SAM retrieval steps skip the head; the next EAGLE draft must catch up over every pending pair."""
    target = make_target("llama", seed=3)
    prompt = [5, 6, 7, 8, 9, 10, 11, 12] * 3
    r = run(target, "sam", prompt, max_new_tokens=40, **{"sam.len_threshold": 2, "tree.total_tokens": 8,
                                                          "tree.depth": 2, "tree.top_k": 3})
    assert r.tokens == run(target, "vanilla", prompt, max_new_tokens=40).tokens
    assert {"retrieval", "eagle"} <= set(r.stats.steps_by_source), "Both sources must be exercised."


@pytest.mark.parametrize("arch,qkv", [("llama", False), ("qwen2", True)])
@pytest.mark.parametrize("fmt", ["safetensors", "bin"])
def test_published_checkpoint_format_loads_and_is_lossless(tmp_path, arch, qkv, fmt):
    target = make_target(arch, seed=1)
    head = random_head(target, seed=5, qkv_bias=qkv)
    save_eagle_head(head, tmp_path)
    state = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary")}
    keys = set(state)
    assert "fc.weight" in keys and "layers.0.self_attn.q_proj.weight" in keys
    assert ("layers.0.self_attn.q_proj.bias" in keys) is qkv and "layers.0.self_attn.o_proj.bias" not in keys
    assert not any("input_layernorm" in k for k in keys), "EAGLE's layer 0 has no input norm."
    if fmt == "bin":   # the published .bin layout also carries a copy of the target embedding
        (tmp_path / "model.safetensors").unlink()
        state["embed_tokens.weight"] = target.model.get_input_embeddings().weight.detach().clone()
        torch.save(state, tmp_path / "pytorch_model.bin")
    loaded = load_eagle_head(tmp_path, target)
    for k, v in head.state_dict().items():
        assert torch.equal(v, loaded.state_dict()[k]), f"{k} must round-trip."
    ref = run(target, "vanilla", PROMPT, max_new_tokens=24)
    out = run(target, "eagle2", PROMPT, head=loaded, max_new_tokens=24)
    assert out.tokens == ref.tokens


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_reduced_draft_vocabulary_round_trips_drafts_only_its_ids_and_is_lossless(tmp_path, arch):
    from safetensors.torch import load_file
    target = make_target(arch, seed=1)
    head = random_head(target, seed=5, qkv_bias=arch == "qwen2")
    vocab = torch.tensor(sorted({3, 9} | set(range(20, 120, 3))))               # [Vd] target ids
    head.draft_vocab = vocab
    save_eagle_head(head, tmp_path)
    d2t = load_file(str(tmp_path / "model.safetensors"))["d2t"]
    assert torch.equal(torch.arange(len(vocab)) + d2t, vocab), "d2t follows EAGLE-3: target = i + d2t[i]."
    assert json.loads((tmp_path / "config.json").read_text())["draft_vocab_size"] == len(vocab)
    loaded = load_eagle_head(tmp_path, target)
    assert torch.equal(loaded.draft_vocab, vocab)

    # drafted tokens come from the draft vocabulary; scores are log-softmax over its lm_head rows
    drafter = Eagle2Drafter(target, loaded, TreeConfig(total_tokens=12, depth=3, top_k=3))
    pre = target.prefill(PROMPT)
    drafter.reset(PROMPT, pre.hidden)
    root = int(pre.logits[-1].argmax())
    tree = drafter.draft_tree(list(PROMPT), root).tree
    assert tree.num_draft == 11 and set(tree.tokens[1:]) <= set(vocab.tolist())
    drafter.reset(PROMPT, pre.hidden)
    f, logp = drafter.catch_up(list(PROMPT), root)
    full = torch.log_softmax(target.lm_head(f[None])[0, vocab].float(), -1)
    assert torch.allclose(logp, full, atol=1e-9)
    assert {tree.tokens[i] for i in range(1, tree.size) if tree.parents[i] == 0} == \
        set(vocab[full.topk(3).indices].tolist())

    ref = run(target, "vanilla", PROMPT, max_new_tokens=24)
    for method in ("eagle2", "sam"):
        assert run(target, method, PROMPT, head=loaded, max_new_tokens=24).tokens == ref.tokens


def test_bad_checkpoints_give_clear_errors(tmp_path):
    target = make_target("llama")
    with pytest.raises(ModelLoadError, match="config.json"):
        load_eagle_head(tmp_path, target)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 64, "num_attention_heads": 4}))
    with pytest.raises(ModelLoadError, match="no weights"):
        load_eagle_head(tmp_path, target)
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 32}))
    (tmp_path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(ModelLoadError):
        load_eagle_head(tmp_path, target)
    from safetensors.torch import load_file, save_file
    good = tmp_path / "good"
    save_eagle_head(random_head(target, seed=0), good)
    state = load_file(str(good / "model.safetensors"))
    for bad in (torch.tensor([0, 500]), torch.tensor([5, 4]), torch.tensor([-1, 0])):   # out of range, duplicate, negative
        save_file({**state, "d2t": bad}, str(good / "model.safetensors"))
        with pytest.raises(ModelLoadError, match="d2t"):
            load_eagle_head(good, target)


def test_auto_budget_with_a_random_head_mostly_skips_drafting_and_stays_lossless(monkeypatch):
    target = make_target("llama", seed=0)
    inject_costs(monkeypatch, target, {1: 50.0, 2: 56.0, 4: 62.0, 8: 75.0, 16: 100.0, 32: 150.0}, row_ms=5.0)
    ref = run(target, "vanilla", PROMPT, max_new_tokens=60)
    assert len(ref.tokens) == 60
    out = run(target, "eagle2", PROMPT, max_new_tokens=60, **{"tree.auto": True, "tree.total_tokens": 16,
                                                               "tree.depth": 3, "tree.top_k": 4})
    assert out.tokens == ref.tokens
    assert out.stats.steps_by_source.get("none", 0) > out.stats.steps * 0.6, \
        "With a head that accepts nothing, auto must stop drafting most of the time."
    assert any(s.decision is not None and "auto" in s.decision.reason for s in out.steps)


def test_a_head_saved_in_shards_loads_the_same_and_a_later_save_replaces_them(tmp_path):
    """max_shard_bytes: whole tensors per shard, none over the bound unless one tensor is, an index
    naming each tensor's shard; loading reads it; saving again unsharded leaves no stale shard."""
    import json
    from respec.drafters.heads.checkpoint import SHARD_INDEX
    target = make_target("qwen2", seed=1)
    head = random_head(target, seed=5, qkv_bias=True)
    state = {k: v for k, v in head.state_dict().items() if not k.startswith("rotary")}
    biggest = max(v.numel() * v.element_size() for v in state.values())
    save_eagle_head(head, tmp_path, max_shard_bytes=biggest)
    shards = sorted(tmp_path.glob("model-*.safetensors"))
    index = json.loads((tmp_path / SHARD_INDEX).read_text())
    assert len(shards) > 1 and not (tmp_path / "model.safetensors").exists()
    assert set(index["weight_map"]) == set(state) and set(index["weight_map"].values()) == {p.name for p in shards}
    assert all(p.stat().st_size <= biggest + 2**14 for p in shards)        # + the safetensors header
    loaded = load_eagle_head(tmp_path, target)
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
    save_eagle_head(head, tmp_path)
    assert not list(tmp_path.glob("model-*.safetensors")) and not (tmp_path / SHARD_INDEX).exists()
    assert (tmp_path / "model.safetensors").is_file()


def test_head_uses_the_target_rope_base_in_float32_and_saves_it(tmp_path):
    import json as _json
    from respec.drafters.heads.eagle import _rope_theta
    target = make_target("llama")
    target.model.config.rope_parameters = {"rope_type": "default", "rope_theta": 100000.0}
    head = random_head(target)
    assert _rope_theta(head.config) == 100000.0, "The random head must use the target's RoPE base."
    assert head.rotary.inv_freq.dtype == torch.float32, "RoPE frequencies stay in float32."
    save_eagle_head(head, tmp_path)
    assert _json.loads((tmp_path / "config.json").read_text())["rope_theta"] == 100000.0
    assert _rope_theta(load_eagle_head(tmp_path, target).config) == 100000.0


def _heads(target):
    from respec.drafters.heads.eagle3 import random_eagle3_head
    return {"eagle-llama": random_head(target, seed=4), "eagle-qwen2-bias": random_head(target, seed=5, qkv_bias=True),
            "eagle3": random_eagle3_head(target, seed=6)}


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_feeding_context_rows_keys_only_equals_the_full_layer(arch):
    """`feed_context` writes what the layer would write to its cache (keys and values) without the
    rows' outputs: rows fed after it predict exactly as after a full forward of the same rows."""
    from respec.models.kv import slab_cache
    target = make_target(arch, seed=7)
    gen = torch.Generator().manual_seed(0)
    m, ctx = 40, 29
    emb = target.embed(torch.randint(0, target.vocab_size, (m,), generator=gen))              # [m, H]
    pos = torch.arange(3, 3 + m)
    for name, head in _heads(target).items():
        feat = torch.randn(m, head.fc.in_features - (emb.shape[1] if head.feature_layers is None else 0),
                           generator=gen, dtype=emb.dtype)                                      # [m, F]
        full, split = slab_cache(head.config), slab_cache(head.config)
        with torch.inference_mode():
            want = head(emb, feat, pos, full, None)[ctx:]                                         # [m - ctx, H]
            head.feed_context(emb[:ctx], feat[:ctx], pos[:ctx], split)
            got = head(emb[ctx:], feat[ctx:], pos[ctx:], split, None)
        assert split.get_seq_length() == full.get_seq_length() == m
        assert torch.allclose(got, want, atol=1e-10, rtol=0), f"{name}: outputs after keys-only rows differ"
        assert torch.allclose(split.layers[0].keys, full.layers[0].keys, atol=1e-10, rtol=0), name
        assert torch.allclose(split.layers[0].values, full.layers[0].values, atol=1e-10, rtol=0), name


def test_a_long_catch_up_feeds_unread_rows_keys_only_and_predicts_and_probes_as_before(monkeypatch):
    """A prompt longer than KV_ONLY_ROWS: the catch-up's prediction and the probe's counted rows are
    those of a catch-up that runs the whole layer over every row."""
    import respec.drafters.eagle2 as eagle2
    target = make_target("llama", seed=8)
    head = random_head(target, seed=9)
    prompt = [int(t) for t in torch.randint(0, target.vocab_size, (80,), generator=torch.Generator().manual_seed(1))]
    hidden = target.prefill(prompt).hidden
    calls = []
    real = head.feed_context
    monkeypatch.setattr(head, "feed_context", lambda *a: (calls.append(a[0].shape[0]), real(*a)))
    results = {}
    for rows in (eagle2.KV_ONLY_ROWS, 10 ** 9):
        monkeypatch.setattr(eagle2, "KV_ONLY_ROWS", rows)
        drafter = Eagle2Drafter(target, head, TreeConfig(top_k=3, depth=3, total_tokens=12))
        drafter.reset(prompt, hidden)
        f, logp = drafter.catch_up(prompt, 40, check=True)
        drafter._exact_hits()
        results[rows] = (f, logp, drafter._hits, drafter._rows, drafter.kv_len)
    assert calls == [80 - eagle2.PROBE_ROWS - 1], "only the rows nobody reads go keys-only"
    (f1, lp1, h1, r1, n1), (f2, lp2, h2, r2, n2) = results.values()
    assert torch.allclose(f1, f2, atol=1e-10, rtol=0) and torch.allclose(lp1, lp2, atol=1e-9, rtol=0)
    assert (h1, r1, n1) == (h2, r2, n2) and r1 == eagle2.PROBE_ROWS and n1 == 80
