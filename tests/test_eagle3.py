"""EAGLE-3 heads: the target's fused low/mid/high features, the published checkpoint layout (tiny
Llama- and Qwen2-style heads written from a config), the layer's semantics against a hand-written
formula, drafting real trees through the same Eagle2Drafter, and greedy output equal to vanilla."""
import json

import pytest
import torch
from safetensors.torch import load_file

from respec.drafters.eagle3_head import Eagle3Head, default_feature_layers, random_eagle3_head, save_eagle3_head
from respec.drafters.eagle_head import load_eagle_head, random_head, save_eagle_head
from respec.errors import ModelLoadError
from respec.models.hf import HFTarget
from respec.models.tiny import tiny_llama, tiny_qwen2
from respec.tree import DraftTree
from tests.conftest import EOS, run

PROMPT = [5, 17, 33, 9, 71, 4, 88, 12, 5, 17, 33, 9]


def six_layer(arch: str, seed: int = 0) -> HFTarget:
    model = (tiny_llama if arch == "llama" else tiny_qwen2)(seed=seed, layers=6)
    return HFTarget(model, eos_token_ids=frozenset({EOS}), context_length=256, name=f"tiny-{arch}-6")


def test_default_feature_layers_are_low_mid_high():
    assert default_feature_layers(32) == (2, 16, 29)
    assert default_feature_layers(30) == (2, 15, 27)        # the default model's 30 layers
    assert default_feature_layers(6) == (2, 3, 3)
    assert all(0 <= i < 2 for i in default_feature_layers(2))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_use_features_returns_the_inputs_of_the_chosen_layers(arch):
    target = six_layer(arch)
    ids = torch.tensor([PROMPT])
    ref = target.model(input_ids=ids, output_hidden_states=True).hidden_states   # [0] embeddings, [i] input of layer i
    plain = target.prefill(PROMPT).hidden
    assert plain.shape == (len(PROMPT), target.hidden_size)
    target.use_features((2, 3, 4))
    fused = target.prefill(PROMPT).hidden
    assert fused.shape == (len(PROMPT), 3 * target.hidden_size)
    want = torch.cat([ref[2][0], ref[3][0], ref[4][0]], dim=-1)
    torch.testing.assert_close(fused, want)
    tree = DraftTree.chain(7, [8, 9], "eagle")
    out = target.forward_tree(tree)
    assert out.hidden.shape == (3, 3 * target.hidden_size)
    target.use_features(None)
    target.keep([0])
    torch.testing.assert_close(target.prefill(PROMPT).hidden, plain)
    with pytest.raises(ValueError, match="out of range"):
        target.use_features((0, 6))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_published_layout_round_trips_bit_identically(arch, tmp_path):
    target = six_layer(arch)
    vocab = torch.tensor(sorted({*range(0, 128, 3), *PROMPT, EOS}))
    head = random_eagle3_head(target, seed=1, qkv_bias=(arch == "qwen2"), draft_vocab=vocab)
    save_eagle3_head(head, tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == vocab.numel()
    assert cfg["eagle_aux_hidden_state_layer_ids"] == [2, 3, 3]
    state = load_file(str(tmp_path / "model.safetensors"))
    h = target.hidden_size
    assert state["fc.weight"].shape == (h, 3 * h)
    assert state["midlayer.self_attn.q_proj.weight"].shape[1] == 2 * h
    assert ("midlayer.self_attn.q_proj.bias" in state) == (arch == "qwen2")
    assert {"midlayer.hidden_norm.weight", "midlayer.input_layernorm.weight", "norm.weight"} <= set(state)
    assert state["lm_head.weight"].shape == (vocab.numel(), h)
    assert torch.equal(torch.arange(vocab.numel()) + state["d2t"], vocab)
    assert state["t2d"].dtype == torch.bool and int(state["t2d"].sum()) == vocab.numel()
    loaded = load_eagle_head(tmp_path, target)
    assert isinstance(loaded, Eagle3Head) and loaded.feature_layers == (2, 3, 3)
    assert torch.equal(loaded.draft_vocab, vocab)
    a, b = head.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    save_eagle_head(loaded, tmp_path / "again")          # the generic writer keeps the EAGLE-3 layout
    again = load_file(str(tmp_path / "again" / "model.safetensors"))
    assert again.keys() == state.keys() and all(torch.equal(again[k], state[k]) for k in state)


def test_one_position_matches_the_eagle3_formula():
    """With one position and no cache, attention over a single key returns its value, so the layer is
    g + o(v([norm_in(emb) ; norm_h(g)])) followed by the MLP residual: the published semantics."""
    target = six_layer("llama")
    head = random_eagle3_head(target, seed=2)
    torch.manual_seed(0)
    emb, fused = torch.randn(1, 64, dtype=torch.float64), torch.randn(1, 192, dtype=torch.float64)
    layer = head.layers[0]
    from transformers import DynamicCache
    out = head(emb, fused, torch.tensor([0]), DynamicCache(), None)
    g = head.fc(fused)
    x = torch.cat([layer.input_layernorm(emb), layer.hidden_norm(g)], dim=-1)
    v = layer.self_attn.v_proj(x).view(1, 2, 16)                      # 2 KV heads of 16 dims
    attn = layer.self_attn.o_proj(v.repeat_interleave(2, dim=1).reshape(1, 64))   # 4 query heads share them
    h = g + attn
    want = h + layer.mlp(layer.post_attention_layernorm(h))
    torch.testing.assert_close(out, want)
    logits = head.draft_logits(target, out)
    torch.testing.assert_close(logits, head.lm_head(head.norm(out)))
    # the probe's cheap bound reads the same logits, by target id
    ids = torch.tensor([3, 40, 77])
    torch.testing.assert_close(head.logits_over(target, out, ids), logits[:, ids])


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("method", ["eagle2", "sam", "respec-strict"])
def test_an_eagle3_head_drafts_trees_and_stays_greedy_equal(arch, method, tmp_path):
    target = six_layer(arch, seed=3)
    vocab = torch.tensor(sorted({*range(0, 128, 2), EOS}))
    save_eagle3_head(random_eagle3_head(target, seed=4, qkv_bias=(arch == "qwen2"), draft_vocab=vocab), tmp_path)
    head = load_eagle_head(tmp_path, target)
    ref = run(target, "vanilla", PROMPT, max_new_tokens=40)
    fixed = {"tree.auto": False, "tree.total_tokens": 12, "tree.depth": 3, "tree.top_k": 3}
    out = run(target, method, PROMPT, head=head, max_new_tokens=40, **fixed)
    assert out.tokens == ref.tokens, f"{arch} {method}: an EAGLE-3 head must stay lossless"
    if method == "eagle2":
        assert out.stats.steps_by_source.get("eagle", 0) > 0, "EAGLE-3 trees must be verified"
        assert max(s.num_draft for s in out.steps) > 3, "a tree, not a single token"
    assert target.feature_layers == ((2, 3, 3) if method != "vanilla" else None)
    # the same target serves an EAGLE-1/2 head next: it goes back to final-norm features
    assert run(target, "eagle2", PROMPT, head=random_head(target), max_new_tokens=20, **fixed).tokens == ref.tokens[:20]
    assert target.feature_layers is None


def test_an_eagle3_head_for_another_target_is_refused(tmp_path):
    small = six_layer("llama")
    save_eagle3_head(random_eagle3_head(small, seed=0), tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["eagle_aux_hidden_state_layer_ids"] = [1, 3, 9]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="layers"):
        load_eagle_head(tmp_path, small)
    cfg["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3]
    cfg["target_hidden_size"] = 96
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ModelLoadError, match="width 96"):
        load_eagle_head(tmp_path, small)
