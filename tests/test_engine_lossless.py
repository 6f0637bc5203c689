"""The master test: greedy speculative output equals greedy vanilla output token for token, for
every strict method and drafter pattern, on tiny Llama and Qwen2 targets in float64."""
import pytest
import torch

from respec.drafters.heads.eagle import random_head
from respec.models.hf import HFTarget
from respec.tree import DraftTree
from tests.conftest import EOS, OracleDrafter, make_target, run

PROMPTS = {
    "plain": [5, 17, 33, 9, 71, 4, 88, 12],
    # repetitive: SAM's suffix automaton finds long matches here
    "repetitive": [5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8, 9],
}


@pytest.mark.parametrize("prompt", PROMPTS.values(), ids=PROMPTS.keys())
@pytest.mark.parametrize("mode", ["same", "random", "partial"])
def test_oracle_tree_drafters_are_lossless(tiny_target, prompt, mode):
    ref = run(tiny_target, "vanilla", prompt, max_new_tokens=40)
    drafter = OracleDrafter(ref.tokens, len(prompt), mode, tiny_target.vocab_size, seed=len(prompt))
    out = run(tiny_target, "eagle2", prompt, drafter=drafter, max_new_tokens=40)
    assert out.tokens == ref.tokens, f"Greedy output with the {mode} drafter must equal vanilla."
    if mode == "same":
        assert out.stats.mean_accepted_length > 4.0, "A drafter that is always right must be accepted."
    if mode == "random":
        assert out.stats.acceptance_rate < 0.05, "Random drafts must be (nearly) all rejected."


@pytest.mark.parametrize("prompt", PROMPTS.values(), ids=PROMPTS.keys())
@pytest.mark.parametrize("method", ["eagle2", "sam", "respec-strict", "respec", "respec-no-gate",
                                    "respec-no-feedback", "respec-no-model", "respec-no-trigger", "respec-no-ema"])
@pytest.mark.parametrize("tree", [(10, 5, 60, False), (3, 2, 8, False), (1, 0, 1, False), (4, 3, 16, True)],
                         ids=["paper", "small", "none", "auto"])
def test_strict_methods_equal_vanilla(tiny_target, prompt, method, tree):
    """respec* run with relax.budget = 0 here (respec-strict always is): all must be lossless.
    θ_H is raised so the entropy trigger fires on the tiny model and retrieval tries are exercised."""
    top_k, depth, total, auto = tree
    ref = run(tiny_target, "vanilla", prompt, max_new_tokens=48)
    out = run(tiny_target, method, prompt, max_new_tokens=48,
              **{"tree.top_k": top_k, "tree.depth": depth, "tree.total_tokens": total, "sam.len_threshold": 2,
                 "tree.auto": auto,
                 "relax.budget": 0, "trigger.theta_entropy": 20.0, "candidates.min_match": 2})
    assert out.tokens == ref.tokens, f"{method} must reproduce vanilla's greedy output exactly."


def test_sam_retrieves_on_repetitive_text():
    target = make_target("llama", seed=3)
    prompt = PROMPTS["repetitive"]
    ref = run(target, "vanilla", prompt, max_new_tokens=40)
    # Feed the model's own continuation back as the prompt twice: retrieval must then fire and be right.
    prompt2 = prompt + list(ref.tokens[:30]) + prompt + list(ref.tokens[:5])
    ref2 = run(target, "vanilla", prompt2, max_new_tokens=30)
    out = run(target, "sam", prompt2, max_new_tokens=30)
    assert out.tokens == ref2.tokens
    assert out.stats.steps_by_source.get("retrieval", 0) > 0, "SAM must draft by retrieval on repeated text."
    assert out.stats.accepted_tokens > 0


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_random_eagle_head_with_qkv_bias_is_lossless(arch):
    target = make_target(arch, seed=1)
    head = random_head(target, seed=4, qkv_bias=True)
    ref = run(target, "vanilla", PROMPTS["plain"], max_new_tokens=32)
    out = run(target, "eagle2", PROMPTS["plain"], head=head, max_new_tokens=32)
    assert out.tokens == ref.tokens


def test_tree_forward_matches_chain_forward_for_every_node():
    target = make_target("llama")
    fresh = make_target("llama")
    prompt = PROMPTS["plain"]
    tree = DraftTree.from_parents([40, 1, 2, 3, 4, 5, 6], [-1, 0, 0, 1, 1, 2, 5], "eagle")
    target.prefill(prompt)
    logits = target.forward_tree(tree).logits                                   # [7, V]
    for i in range(tree.size):
        chain = prompt + [tree.tokens[j] for j in tree.path_to(i)]
        expect = fresh.prefill(chain[:-1])  # prefill returns the last position; feed the last token as a chain
        out = fresh.forward_tree(DraftTree.root_only(chain[-1])).logits[0]
        fresh.keep([0])
        assert torch.allclose(logits[i], out, atol=1e-9), f"Tree node {i} must see exactly its ancestors."


def test_kv_compaction_equals_a_fresh_prefill_after_every_step():
    target = make_target("qwen2")
    fresh = make_target("qwen2")
    prompt = PROMPTS["repetitive"]
    ref = run(target, "vanilla", prompt, max_new_tokens=30)
    from respec.config import EngineConfig
    from respec.engine import Engine
    drafter = OracleDrafter(ref.tokens, len(prompt), "partial", target.vocab_size, seed=7)
    engine = Engine(target, drafter, EngineConfig(method="eagle2", max_new_tokens=30))
    committed = list(prompt)
    for step in engine.stream(prompt):
        committed += [step.tree.tokens[i] for i in step.verdict.path]
        assert target.kv_len == len(committed)
        fresh.prefill(committed)
        for got, want in zip(target.cache.layers, fresh.cache.layers):
            assert torch.allclose(got.keys, want.keys, atol=1e-10) and torch.allclose(got.values, want.values, atol=1e-10), \
                f"After step {step.step} the KV cache must equal a fresh prefill of the committed text."


def test_cache_layer_attribute_names_are_pinned():
    target = make_target("llama")
    target.prefill([1, 2, 3])
    layer = target.cache.layers[0]
    assert layer.keys.shape[-2] == 3 and layer.values.shape[-2] == 3, \
        "transformers 5.24 DynamicCache layers must expose .keys/.values [B, H, S, D]."


def test_stops_at_eos_and_max_new_tokens():
    target = make_target("llama")
    prompt = PROMPTS["plain"]
    ref = run(target, "vanilla", prompt, max_new_tokens=20)
    assert len(ref.tokens) == 20 and ref.stop_reason == "max_new_tokens"
    # Make the 6th generated token a stop token: every method must stop right there.
    stop = ref.tokens[5]
    for method in ("vanilla", "eagle2", "sam"):
        from respec.config import EngineConfig
        from respec.drafters import make_drafter
        from respec.engine import Engine
        cfg = EngineConfig(method=method, max_new_tokens=20)
        out = Engine(target, make_drafter(method, target, cfg), cfg, stop_token_ids=[stop]).generate(prompt)
        first = list(ref.tokens).index(stop)
        assert out.tokens == ref.tokens[:first + 1] and out.stop_reason == "stop_token"


class TargetTopKDrafter:
    """Drafts the target's own top-3 tokens as siblings, each followed by the target's top-1 after
    it: plausible drafts that are sometimes accepted and sometimes rejected (exercises residuals)."""
    name, needs_hidden, feature_layers = "topk", False, None

    def __init__(self, copy):
        self.copy = copy

    def reset(self, prompt, hidden):
        pass

    def observe(self, outcome):
        pass

    def propose(self, ctx):
        from respec.drafters.base import Proposal
        base = list(ctx.tokens) + [ctx.root]
        firsts = torch.topk(self.copy.prefill(base).logits[0], 3).indices.tolist()
        tokens, parents = [ctx.root], [-1]
        for a in firsts:
            tokens.append(a); parents.append(0)
            tokens.append(int(self.copy.prefill(base + [a]).logits[0].argmax())); parents.append(len(tokens) - 2)
        return Proposal(tree=DraftTree.from_parents(tokens, parents, "eagle"), source="eagle")


def test_sampling_mode_preserves_the_distribution_of_the_first_two_tokens():
    """Speculative sampling through the whole engine must leave the joint distribution of the first
    two generated tokens equal to the target's (top-k 4 keeps the support small enough to test)."""
    from collections import Counter
    from respec.config import SamplingConfig
    from respec.sampling import probs_from_logits

    target = make_target("llama", seed=2)
    prompt = [5, 6, 7]
    sc = SamplingConfig(temperature=0.7, top_k=4)
    exact = {}
    p1 = probs_from_logits(target.prefill(prompt).logits, sc)[0]
    for a in torch.nonzero(p1).flatten().tolist():
        p2 = probs_from_logits(target.prefill(prompt + [a]).logits, sc)[0]
        for b in torch.nonzero(p2).flatten().tolist():
            exact[(a, b)] = (p1[a] * p2[b]).item()
    n = 1500
    drafter = TargetTopKDrafter(make_target("llama", seed=2))
    counts = Counter()
    for seed in range(n):
        r = run(target, "eagle2", prompt, drafter=drafter, max_new_tokens=2,
                **{"sampling.temperature": 0.7, "sampling.top_k": 4, "sampling.seed": seed})
        counts[tuple(r.tokens[:2])] += 1
    keys = set(exact) | set(counts)
    tv = 0.5 * sum(abs(counts[k] / n - exact.get(k, 0.0)) for k in keys)
    assert set(counts) <= set(exact), "Speculative sampling emitted a pair outside the target's support."
    assert tv < 0.08, f"Joint distribution of the first two tokens is off (TV {tv:.3f} over {len(exact)} pairs)."
