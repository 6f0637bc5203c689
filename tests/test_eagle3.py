"""EAGLE-3 heads: the target's fused low/mid/high features, the published checkpoint layout (tiny
Llama- and Qwen2-style heads written from a config), the layer's semantics against a hand-written
formula, drafting real trees through the same Eagle2Drafter, and greedy output equal to vanilla."""
import json

import pytest
import torch
from safetensors.torch import load_file

from respec.drafters.heads.eagle3 import Eagle3Head, default_feature_layers, random_eagle3_head
from respec.drafters.heads.eagle import random_head
from respec.drafters.heads.checkpoint import load_eagle_head, save_eagle_head
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
    save_eagle_head(head, tmp_path)
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
    save_eagle_head(loaded, tmp_path / "again")          # a loaded head writes the same layout back
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
    save_eagle_head(random_eagle3_head(target, seed=4, qkv_bias=(arch == "qwen2"), draft_vocab=vocab), tmp_path)
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
    save_eagle_head(random_eagle3_head(small, seed=0), tmp_path)
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


# ------------------------------------------------------------------------------------ training
@pytest.fixture(scope="module")
def eagle3_data(tmp_path_factory):
    import random
    from respec.train.data import Prompt, ResponseStore, generate_responses
    torch.set_num_threads(1)
    target = six_layer("llama", seed=5)
    store = ResponseStore(tmp_path_factory.mktemp("data3"))
    rng = random.Random(0)
    prompts = [Prompt(key=f"p{i}", category="synthetic",
                      ids=tuple(rng.randrange(3, 128) for _ in range(rng.randint(4, 12)))) for i in range(96)]
    generate_responses(target, prompts, store, max_new_tokens=32, batch_size=16, progress=False)
    return target, store


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_the_batched_training_forward_equals_the_inference_head(arch):
    from transformers import DynamicCache
    from respec.train.features import target_features
    from respec.train.head import head_forward, make_head
    target = six_layer(arch, seed=1)
    head = make_head(target, seed=3, arch="eagle3", draft_vocab=torch.arange(0, 128, 2)).eval()
    assert head.feature_layers == (2, 3, 3) and head.lm_head.weight.shape[0] == 64
    ids = torch.randint(3, 128, (3, 10), generator=torch.Generator().manual_seed(0))
    feats = target_features(target, ids, head.feature_layers)
    h = target.hidden_size
    assert feats.shape == (3, 10, 4 * h)
    torch.testing.assert_close(feats[..., :h], target_features(target, ids))
    emb = target.embed(ids[:, 1:])
    with torch.no_grad():
        batched = head_forward(head, emb, feats[:, :-1, h:])
        for b in range(3):
            one = head(emb[b], feats[b, :-1, h:], torch.arange(9), DynamicCache(), None)
            torch.testing.assert_close(batched[b], one)


def test_train_eagle3_learns_publishes_and_loads_back_bit_identically(eagle3_data, tmp_path):
    from respec.train.trainer import TrainConfig, train_eagle
    target, store = eagle3_data
    cfg = TrainConfig(steps=240, batch_size=8, lr=3e-3, warmup=20, eval_every=80, save_every=80,
                      val_fraction=0.15, seed=0, arch="eagle3", draft_vocab=96, ttt_depth=2)
    out = tmp_path / "head3"
    last = train_eagle(target, store.examples(), out, cfg, progress=False, log=lambda m: None,
                       publish=tmp_path / "pub")
    log = [json.loads(line) for line in (out / "training_log.jsonl").read_text().splitlines()]
    assert last["val_top1"] > log[0]["val_top1"] + 0.2, "validation top-1 must go up"
    assert last["val_loss"] < 0.8 * log[0]["val_loss"]
    assert "val_top1_depth2" in last
    loaded = load_eagle_head(out, target)
    assert isinstance(loaded, Eagle3Head) and loaded.draft_vocab.numel() == 96
    state = torch.load(out / "checkpoint.pt", weights_only=False)["head"]
    got = loaded.state_dict()
    assert all(torch.equal(got[k], state[k].to(got[k].dtype)) for k in state if not k.startswith("rotary"))
    assert (tmp_path / "pub" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "pub" / "config.json").read_text())["architectures"] == ["LlamaForCausalLMEagle3"]
    prompt = list(store.examples()[0].ids[:store.examples()[0].start])
    ref = run(target, "vanilla", prompt, max_new_tokens=32)
    fixed = {"tree.auto": False, "tree.total_tokens": 8, "tree.depth": 3, "tree.top_k": 2}
    trained = run(target, "eagle2", prompt, head=loaded, max_new_tokens=32, **fixed)
    assert trained.tokens == ref.tokens, "a trained EAGLE-3 head must stay lossless"
    untrained = run(target, "eagle2", prompt, head=random_eagle3_head(target, seed=9), max_new_tokens=32, **fixed)
    assert trained.stats.mean_accepted_length > untrained.stats.mean_accepted_length
    # fine-tuning from the saved EAGLE-3 head keeps its vocabulary; an EAGLE-1/2 start is refused
    again = train_eagle(target, store.examples(), tmp_path / "ft", TrainConfig(
        steps=20, batch_size=8, lr=1e-3, warmup=0, eval_every=20, save_every=20, val_fraction=0.15,
        arch="eagle3", draft_vocab=32, init_from=str(out)), progress=False, log=lambda m: None)
    assert again["val_top1"] > 0.8 * last["val_top1"]
    assert load_eagle_head(tmp_path / "ft", target).draft_vocab.numel() == 96
    save_eagle_head(random_head(target), tmp_path / "e2")
    from respec.errors import RespecError
    with pytest.raises(RespecError, match="EAGLE-1/2"):
        train_eagle(target, store.examples(), tmp_path / "bad", TrainConfig(
            steps=2, arch="eagle3", init_from=str(tmp_path / "e2")), progress=False, log=lambda m: None)
