"""EAGLE head training pipeline on tiny targets: the batched training forward equals the inference
head, left-padded batched generation equals vanilla greedy, training lowers the loss and raises
top-1, the output loads back and stays lossless, resume continues exactly, fine-tuning starts from
a saved head, batches group similar lengths, bad input is refused."""
import dataclasses
import json
import random

import pytest
import torch

from respec.drafters.heads.checkpoint import load_eagle_head

from respec.drafters.heads.eagle import random_head
from respec.errors import ConfigError, RespecError
from respec.train.data import (Example, Prompt, ResponseStore, generate_responses, load_prompt_file,
                               offline_texts, passage_prompts, text_examples)
from respec.train.pipeline import PipelineConfig, collect_prompts
from respec.train.prompts import CATEGORIES, builtin_prompts
from respec.train.features import FeatureCache, collate, frequent_next_tokens, target_features
from respec.train.head import head_forward, head_unroll, make_head, ttt_mask
from respec.train.trainer import TrainConfig, _epoch_order, train_eagle
from tests.conftest import make_target, run


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models are thread-overhead bound; one thread is ~50x faster on a busy 2-core box."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _prompts(n, seed=0):
    rng = random.Random(seed)
    return [Prompt(key=f"p{i}", category="synthetic",
                   ids=tuple(rng.randrange(3, 128) for _ in range(rng.randint(4, 12)))) for i in range(n)]


@pytest.fixture(scope="module")
def llama_data(tmp_path_factory):
    target = make_target("llama", seed=0)
    store = ResponseStore(tmp_path_factory.mktemp("data"))
    assert generate_responses(target, _prompts(96), store, max_new_tokens=32, batch_size=16, chunk_size=40,
                              progress=False) == 96
    return target, store


def _log(out):
    return [json.loads(l) for l in (out / "training_log.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_batched_training_forward_equals_inference_head(arch):
    from transformers import DynamicCache
    target = make_target(arch, seed=1)
    head = make_head(target, seed=3, init_from_last_layer=(arch == "qwen2")).eval()
    assert head.qkv_bias == (arch == "qwen2")
    ids = torch.randint(3, 128, (3, 10), generator=torch.Generator().manual_seed(0))
    feats = target_features(target, ids)
    emb = target.embed(ids[:, 1:])
    with torch.no_grad():
        out = head_forward(head, emb, feats[:, :-1])
        for b in range(3):
            ref = head(emb[b], feats[b, :-1], torch.arange(9), DynamicCache(), None)
            assert torch.allclose(out[b], ref, atol=1e-10), "Training forward must equal the inference head."


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_unrolled_training_depths_equal_the_drafters_tree_steps(arch):
    """Depth d at position t must be what the drafter computes for the d-th node of a draft chain
    whose committed context ends at t - d: catch-up on real features (positions 0..t-d), then each
    chain node fed its parent's predicted feature at the next position, seeing the cache and its
    ancestors."""
    from transformers import DynamicCache
    target = make_target(arch, seed=1)
    head = make_head(target, seed=3).eval()
    ids = torch.randint(3, 128, (2, 12), generator=torch.Generator().manual_seed(0))
    feats = target_features(target, ids)
    emb = target.embed(ids[:, 1:])
    with torch.no_grad():
        preds = head_unroll(head, emb, feats[:, :-1], 3)
        assert torch.allclose(preds[0], head_forward(head, emb, feats[:, :-1]), atol=1e-10)
        for b in range(2):
            for t in (2, 5, 10):
                for d in (1, 2):
                    real = t - d                       # last position fed a real feature
                    cache = DynamicCache()
                    f = head(emb[b, :real + 1], feats[b, :real + 1], torch.arange(real + 1), cache, None)[-1]
                    for i in range(1, d + 1):
                        f = head(emb[b, real + i][None], f[None], torch.tensor([real + i]), cache,
                                 torch.zeros(1, 1, 1, real + i + 1, dtype=f.dtype))[0]
                    assert torch.allclose(preds[d][b, t], f, atol=1e-6), (b, t, d)
    m = ttt_mask(4, 1, torch.float32)
    assert m.shape == (1, 1, 4, 8) and (m[0, 0] == 0).tolist()[3] == [True, True, True, False,
                                                                     False, False, False, True]


def test_ttt_training_logs_unrolled_top1_and_beats_teacher_forcing_there(llama_data, tmp_path):
    target, store = llama_data
    base = dict(steps=200, batch_size=8, lr=3e-3, warmup=20, eval_every=200, save_every=200,
                val_fraction=0.15, seed=0)
    plain = train_eagle(target, store.examples(), tmp_path / "plain", TrainConfig(**base),
                        progress=False, log=lambda m: None)
    ttt = train_eagle(target, store.examples(), tmp_path / "ttt", TrainConfig(**base, ttt_depth=3),
                      progress=False, log=lambda m: None)
    assert "val_top1_depth3" in ttt and "val_top1_depth2" not in plain
    # score the teacher-forced head the same way
    plain_head = load_eagle_head(tmp_path / "plain", target, torch.float32)
    from respec.drafters.heads.eagle import LMHead
    from respec.train.trainer import evaluate, split
    _, val = split(store.examples(), 0.15, 64)
    unrolled = evaluate(plain_head, target, LMHead.of(target, torch.float32), val,
                        TrainConfig(**base, ttt_depth=3))
    assert unrolled["top1"] == pytest.approx(plain["val_top1"])
    assert ttt["val_top1_depth3"] > unrolled["top1_depth3"], "Unrolled training must help the unrolled steps."
    head = load_eagle_head(tmp_path / "ttt", target)
    prompt = list(store.examples()[0].ids[:store.examples()[0].start])
    assert run(target, "eagle2", prompt, head=head, max_new_tokens=40).tokens == \
        run(target, "vanilla", prompt, max_new_tokens=40).tokens


def test_collate_masks_only_response_features():
    ids, mask = collate([Example("a", (5, 6, 7, 8, 9), 3), Example("b", (5, 6, 7), 0)], max_len=16)
    assert ids.tolist() == [[5, 6, 7, 8, 9], [5, 6, 7, 0, 0]]
    # entry t covers the predicted feature f_{t+1}
    assert mask.tolist() == [[False, False, True, True], [True, True, False, False]]


def test_left_padded_batched_generation_equals_vanilla(llama_data):
    target, store = llama_data
    recs = store.records()
    assert len(store.chunk_files()) == 2, "A chunk is written once >= 40 answers are pending (48 + 48)."
    for r in recs[:6]:
        want = run(target, "vanilla", r["prompt_ids"], max_new_tokens=32).tokens
        assert r["response_ids"] == list(want)[:len(r["response_ids"])] and len(r["response_ids"]) >= min(len(want), 1)
    # a rerun answers nothing twice; new prompts only
    assert generate_responses(target, _prompts(96), store, max_new_tokens=32, batch_size=16,
                              progress=False) == 0
    assert generate_responses(target, _prompts(100), store, max_new_tokens=32, batch_size=16,
                              progress=False) == 4
    assert len(store.records()) == 100
    assert not any("prompt_text" in r for r in store.records())


def test_keep_text_stores_the_prompt_text_for_later_stages(tmp_path):
    target = make_target("llama")
    store = ResponseStore(tmp_path / "s")
    p = [Prompt(key="a", category="c", text="write a question", ids=(3, 4, 5)), Prompt(key="b", category="c", ids=(6, 7))]
    generate_responses(target, p, store, max_new_tokens=4, batch_size=2, progress=False, keep_text=True)
    assert sorted(r.get("prompt_text", "-") for r in store.records()) == ["-", "write a question"]


def test_training_lowers_loss_raises_top1_and_output_loads_back(llama_data, tmp_path):
    target, store = llama_data
    out = tmp_path / "head"
    cfg = TrainConfig(steps=300, batch_size=8, lr=3e-3, warmup=20, eval_every=100, save_every=100,
                      val_fraction=0.15, seed=0)
    last = train_eagle(target, store.examples(), out, cfg, progress=False, log=lambda m: None)
    log = _log(out)
    init = log[0]
    assert init["event"] == "init" and last["event"] == "final" and last["step"] == 300
    assert {"epoch", "eval"} <= {r["event"] for r in log}
    assert last["val_loss"] < 0.8 * init["val_loss"], "Validation loss must go down."
    assert last["val_top1"] > init["val_top1"] + 0.2, "Validation top-1 must go up."
    assert last["train_top1"] > 0.4
    assert {"config.json", "model.safetensors", "checkpoint.pt"} <= {p.name for p in out.iterdir()}

    head = load_eagle_head(out, target)
    prompt = list(store.examples()[0].ids[:store.examples()[0].start])
    vanilla = run(target, "vanilla", prompt, max_new_tokens=40)
    trained = run(target, "eagle2", prompt, head=head, max_new_tokens=40)
    assert trained.tokens == vanilla.tokens, "A trained head must stay lossless."
    untrained = run(target, "eagle2", prompt, head=random_head(target, seed=0), max_new_tokens=40)
    assert trained.stats.mean_accepted_length > untrained.stats.mean_accepted_length


def test_frequent_next_tokens_counts_only_covered_positions():
    ex = [Example("a", (9, 9, 5, 5, 5, 7), 2), Example("b", (7, 4, 4, 6), 0), Example("c", (3, 3, 3, 3, 8, 8), 1)]
    # covered with max_len 5: a -> 5 5 5 (7 is cut); b -> 4 4 6 (position 0 is never predicted); c -> 3 3 3 8
    assert frequent_next_tokens(ex, 2, max_len=5).tolist() == [3, 5]       # 3 x3, 5 x3 (ties by id), then 4 x2
    assert frequent_next_tokens(ex, 3, max_len=5).tolist() == [3, 4, 5]
    assert frequent_next_tokens(ex, 99, max_len=5).tolist() == [3, 4, 5, 6, 8]


def test_feature_cache_equals_recomputed_features(llama_data):
    target, store = llama_data
    ex = store.examples()[:11]
    cache = FeatureCache(target, ex, max_len=20, batch_tokens=64, progress=False)
    ids, _ = collate(ex, 20)
    want = target_features(target, ids)
    got = cache.batch(ex, ids.shape[1])
    for b, e in enumerate(ex):
        n = min(len(e.ids), 20)
        assert torch.allclose(got[b, :n], want[b, :n], atol=1e-12)
        assert not got[b, n:].any()


def test_feature_store_on_disk_is_reused_and_extended(llama_data, tmp_path, monkeypatch):
    """A second cache over the same store computes only the examples the file lacks, and gives the
    same features; an example whose ids changed is recomputed, not served stale, and its old
    features stay stored beside the new ones."""
    import respec.train.features as features
    target, store = llama_data
    ex = store.examples()[:8]
    path = tmp_path / "features.safetensors"
    first = FeatureCache(target, ex[:5], max_len=20, batch_tokens=64, progress=False, store=path)
    calls = []
    real = features.target_features
    monkeypatch.setattr(features, "target_features", lambda t, ids, layers=None: calls.append(ids.shape[0]) or real(t, ids, layers))
    changed = dataclasses.replace(ex[0], ids=ex[0].ids[:-1] + ((ex[0].ids[-1] + 1) % 50,))
    second = FeatureCache(target, [changed] + ex[1:], max_len=20, batch_tokens=64, progress=False, store=path)
    assert sum(calls) == 4, "Only the 3 new examples and the changed one are computed."
    for e in ex[1:5]:
        assert torch.equal(second.feats[e.key], first.feats[e.key])
    calls.clear()
    FeatureCache(target, ex, max_len=12, batch_tokens=64, progress=False, store=path)
    assert sum(calls) == 0, ("Shorter max_len reuses prefixes, the original ex[0]'s too: a store is never rewritten "
                             "without features it holds (here the old ex[0]'s beside the changed one's).")


def test_feature_extraction_stopped_midway_resumes_from_its_shards(llama_data, tmp_path, monkeypatch):
    """Shards written while computing keep what was done: a run stopped after some batches leaves
    them on disk, the next run computes only the rest (and gives the same features), and its final
    store replaces the shards."""
    import respec.train.features as features
    target, store = llama_data
    ex = store.examples()[:9]
    path = tmp_path / "features.safetensors"
    real, calls = features.target_features, []

    def stop_after_three_batches(t, ids, layers=None):
        if len(calls) == 3:
            raise KeyboardInterrupt("stopped")
        calls.append(ids.shape[0])
        return real(t, ids, layers)
    monkeypatch.setattr(features, "target_features", stop_after_three_batches)
    with pytest.raises(KeyboardInterrupt):
        FeatureCache(target, ex, max_len=20, batch_tokens=20, progress=False, store=path, shard_tokens=1)
    done = sum(calls)
    shards = sorted(tmp_path.glob("features.shard-*.safetensors"))
    assert not path.exists() and len(shards) == 3 and 0 < done < len(ex)
    calls.clear()
    monkeypatch.setattr(features, "target_features", lambda t, ids, layers=None: calls.append(ids.shape[0]) or real(t, ids, layers))
    resumed = FeatureCache(target, ex, max_len=20, batch_tokens=20, progress=False, store=path, shard_tokens=10**9)
    assert sum(calls) == len(ex) - done, "only the examples no shard holds are computed again"
    assert path.is_file() and not list(tmp_path.glob("features.shard-*")), "the final store replaces the shards"
    fresh = FeatureCache(target, ex, max_len=20, batch_tokens=20, progress=False)
    for e in ex:
        assert torch.allclose(resumed.feats[e.key], fresh.feats[e.key], atol=1e-12)


def test_feature_extraction_goes_in_key_order_runs_each_sorted_by_length():
    """A stopped extraction has done the first examples by key (the sample `--max-examples` trains
    on), not the shortest answers: runs of about shard_tokens tokens in key order, each by length."""
    rng = random.Random(7)
    ex = [Example(f"{rng.getrandbits(64):016x}", tuple(range(rng.randint(3, 40))), 0) for _ in range(60)]
    order = FeatureCache._order(ex, max_len=30, shard_tokens=100)
    assert sorted(e.key for e in order) == sorted(e.key for e in ex)
    by_key = sorted(ex, key=lambda e: e.key)
    runs, i = [], 0
    while i < len(by_key):                       # rebuild the runs: key order, >= 100 tokens each but the last
        j, tokens = i, 0
        while j < len(by_key) and tokens < 100:
            tokens += min(len(by_key[j].ids), 30)
            j += 1
        runs.append(by_key[i:j])
        i = j
    assert len(runs) > 3
    at = 0
    for chunk in runs:
        got = order[at:at + len(chunk)]
        assert {e.key for e in got} == {e.key for e in chunk}, "each run holds the next examples by key"
        assert [len(e.ids) for e in got] == sorted(len(e.ids) for e in got), "and is sorted by length"
        at += len(chunk)


def test_features_too_big_to_merge_stay_in_shards_that_a_later_run_reads(llama_data, tmp_path, monkeypatch):
    """Above merge_bytes the store is not rewritten (it would hold every feature twice): the last
    features go to one more shard, no store file appears, and a later run computes nothing."""
    import respec.train.features as features
    target, store = llama_data
    ex = store.examples()[:6]
    path = tmp_path / "features.safetensors"
    real, calls = features.target_features, []
    monkeypatch.setattr(features, "target_features", lambda t, ids, layers=None: calls.append(ids.shape[0]) or real(t, ids, layers))
    first = FeatureCache(target, ex, max_len=20, batch_tokens=20, progress=False, store=path, shard_tokens=50,
                         merge_bytes=0)
    shards = sorted(tmp_path.glob("features.shard-*.safetensors"))
    assert not path.exists() and len(shards) >= 2 and sum(calls) == len(ex)
    calls.clear()
    again = FeatureCache(target, ex, max_len=20, batch_tokens=20, progress=False, store=path, merge_bytes=0)
    assert sum(calls) == 0, "every example's features are read back from the shards"
    assert sorted(tmp_path.glob("features.shard-*.safetensors")) == shards
    for e in ex:
        assert torch.equal(again.feats[e.key], first.feats[e.key])


def test_cached_reduced_vocab_training_matches_and_still_learns(llama_data, tmp_path):
    target, store = llama_data
    ex = store.examples()
    base = dict(steps=12, batch_size=8, lr=3e-3, warmup=2, eval_every=6, save_every=6, seed=2)
    train_eagle(target, ex, tmp_path / "plain", TrainConfig(**base), progress=False, log=lambda m: None)
    train_eagle(target, ex, tmp_path / "cached", TrainConfig(**base, cache_features=True), progress=False,
                log=lambda m: None)
    a = torch.load(tmp_path / "plain" / "checkpoint.pt", weights_only=False)["head"]
    b = torch.load(tmp_path / "cached" / "checkpoint.pt", weights_only=False)["head"]
    assert all(torch.allclose(a[k], b[k], atol=1e-9) for k in a), "Cached features must train the same head."

    out = tmp_path / "reduced"
    cfg = TrainConfig(steps=300, batch_size=8, lr=3e-3, warmup=20, eval_every=100, save_every=100,
                      val_fraction=0.15, seed=0, cache_features=True, draft_vocab=40)
    last = train_eagle(target, ex, out, cfg, progress=False, log=lambda m: None)
    init = _log(out)[0]
    assert last["val_loss"] < 0.8 * init["val_loss"] and last["val_top1"] > init["val_top1"] + 0.2
    head = load_eagle_head(out, target)
    covered = {t for e in ex for t in e.ids[max(e.start, 1):]}
    assert head.draft_vocab.numel() == 40 and set(head.draft_vocab.tolist()) <= covered, \
        "The head drafts over the reduced vocabulary it was trained on (saved as d2t)."
    prompt = list(ex[1].ids[:ex[1].start])
    assert run(target, "eagle2", prompt, head=head, max_new_tokens=40).tokens == \
        run(target, "vanilla", prompt, max_new_tokens=40).tokens


def test_a_head_with_a_narrower_mlp_trains_saves_loads_and_stays_lossless(llama_data, tmp_path):
    """--head-intermediate N: the head's MLP is N wide (config.json says so), it loads like any head
    and eagle2 with it still equals vanilla; it refuses to start from weights of another width."""
    target, store = llama_data
    ex = store.examples()
    wide = target.model.config.intermediate_size
    cfg = TrainConfig(steps=4, batch_size=8, lr=3e-3, warmup=1, eval_every=4, save_every=4, seed=0,
                      head_intermediate=wide // 4)
    train_eagle(target, ex, tmp_path / "narrow", cfg, progress=False, log=lambda m: None)
    assert json.loads((tmp_path / "narrow" / "config.json").read_text())["intermediate_size"] == wide // 4
    head = load_eagle_head(tmp_path / "narrow", target)
    assert head.layers[0].mlp.up_proj.weight.shape[0] == wide // 4
    prompt = list(ex[2].ids[:ex[2].start])
    assert run(target, "eagle2", prompt, head=head, max_new_tokens=24).tokens == \
        run(target, "vanilla", prompt, max_new_tokens=24).tokens
    for other in (dict(init_from_last_layer=True), dict(init_from=str(tmp_path / "narrow"))):
        with pytest.raises(ConfigError, match="head_intermediate"):
            TrainConfig(head_intermediate=8, **other).validate()


def test_max_examples_takes_a_fixed_sample_that_grows_by_inclusion(llama_data):
    from respec.train.pipeline import sample_examples
    ex = llama_data[1].examples()
    small, large = sample_examples(ex, 10), sample_examples(list(reversed(ex)), 30)
    assert len(small) == 10 and len(large) == 30 and {e.key for e in small} <= {e.key for e in large}
    assert sample_examples(ex, None) == ex and sample_examples(ex, 10**6) == ex
    with pytest.raises(ConfigError, match="max-examples"):
        PipelineConfig(max_examples=0).validate()


def test_resume_continues_exactly_from_the_saved_step(llama_data, tmp_path):
    target, store = llama_data
    ex = store.examples()
    cfg = TrainConfig(steps=60, batch_size=8, lr=3e-3, warmup=5, eval_every=40, save_every=20, seed=1)
    train_eagle(target, ex, tmp_path / "full", cfg, progress=False, log=lambda m: None)

    class Crash(Exception):
        pass

    def crash_at_40(msg):
        if "step 40" in msg:
            raise Crash

    with pytest.raises(Crash):          # interrupted after the step-20 checkpoint, before step 40's
        train_eagle(target, ex, tmp_path / "cut", cfg, progress=False, log=crash_at_40)
    assert torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=False)["step"] == 20
    with pytest.raises(RespecError, match="--resume"):
        train_eagle(target, ex, tmp_path / "cut", cfg, progress=False, log=lambda m: None)
    last = train_eagle(target, ex, tmp_path / "cut", cfg, resume=True, progress=False, log=lambda m: None)
    assert last["step"] == 60
    a = torch.load(tmp_path / "full" / "checkpoint.pt", weights_only=False)["head"]
    b = torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=False)["head"]
    assert all(torch.equal(a[k], b[k]) for k in a), "Resume must continue the same run exactly."
    # extending a finished run
    last = train_eagle(target, ex, tmp_path / "cut", TrainConfig(steps=70, eval_every=40, save_every=20),
                       resume=True, progress=False, log=lambda m: None)
    assert last["step"] == 70 and _log(tmp_path / "cut")[-1]["step"] == 70


def test_bad_arguments_raise_clear_errors(llama_data, tmp_path):
    target, store = llama_data
    for bad in [dict(steps=0), dict(lr=-1.0), dict(lr=float("nan")), dict(batch_size=0), dict(val_fraction=0.9),
                dict(v_weight=0.0, p_weight=0.0), dict(steps=2.5), dict(draft_vocab=-1), dict(draft_vocab=1.5)]:
        with pytest.raises(ConfigError):
            TrainConfig(**bad).validate()
    with pytest.raises(RespecError, match="cannot resume"):
        train_eagle(target, store.examples(), tmp_path / "none", TrainConfig(steps=2), resume=True, progress=False)
    with pytest.raises(RespecError, match="no training data"):
        train_eagle(target, [Example("x", (5,), 0)], tmp_path / "o", TrainConfig(steps=2), progress=False)
    (tmp_path / "file").write_text("x")
    with pytest.raises(RespecError, match="not a directory"):
        train_eagle(target, store.examples(), tmp_path / "file", TrainConfig(steps=2), progress=False)
    with pytest.raises(RespecError, match="not found"):
        PipelineConfig(prompts_files=[str(tmp_path / "missing.jsonl")]).validate()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"turns": ["ok"]}\n{"nope": 1}\n')
    with pytest.raises(RespecError, match="bad.jsonl:2"):
        load_prompt_file(bad)


def test_cli_refuses_bad_arguments_before_loading_a_model(tmp_path, capsys):
    from respec.cli import main
    assert main(["train-eagle", "--out", str(tmp_path / "o"), "--steps", "0"]) == 2
    assert "steps" in capsys.readouterr().err
    assert main(["train-eagle", "--out", str(tmp_path / "o"), "--prompts-file", str(tmp_path / "nope")]) == 2
    assert main(["train-eagle", "--out", str(tmp_path / "o"), "--resume"]) == 2
    assert "cannot resume" in capsys.readouterr().err
    assert main(["train-eagle", "--out", str(tmp_path / "o"), "--gen-max-new-tokens", "0"]) == 2


def test_prompt_sets_and_sources(tmp_path):
    items = builtin_prompts()
    assert items == builtin_prompts() and len(items) > 500
    assert {c for c, _ in items} == set(CATEGORIES)
    f = tmp_path / "p.txt"
    f.write_text("first prompt\n\nsecond prompt\n")
    pc = PipelineConfig(prompts_files=[str(f)], max_prompts=12)
    got = collect_prompts(pc)
    assert len(got) == 12 and got[0].text == "first prompt" and got[6].text == "second prompt"
    assert len({p.category for p in got}) == 6, "A cap keeps a mix of every source (round-robin)."
    assert len({p.key for p in collect_prompts(PipelineConfig())}) == len(
        collect_prompts(PipelineConfig()))


def test_offline_text_is_packed_into_windows():
    class CharTokenizer:
        def __call__(self, text, add_special_tokens=False):
            return {"input_ids": [3 + ord(c) % 120 for c in text]}

    texts = offline_texts()
    first = [next(texts) for _ in range(3)]
    assert all(len(t) >= 200 for _, t in first)
    ex = text_examples(CharTokenizer(), offline_texts(), max_tokens=5000, window=256, progress=False)
    assert len(ex) == 19 and all(len(e.ids) == 256 and e.start == 0 for e in ex)
    assert len({e.key for e in ex}) == len(ex)


def test_fine_tuning_starts_from_the_saved_head(llama_data, tmp_path):
    target, store = llama_data
    ex = store.examples()
    cfg = TrainConfig(steps=120, batch_size=8, lr=3e-3, warmup=10, eval_every=60, save_every=60, seed=0)
    first = train_eagle(target, ex, tmp_path / "a", cfg, progress=False, log=lambda m: None)
    msgs = []
    tuned = dataclasses.replace(cfg, steps=20, init_from=str(tmp_path / "a"))
    train_eagle(target, ex, tmp_path / "b", tuned, progress=False, log=msgs.append)
    init = _log(tmp_path / "b")[0]
    assert init["event"] == "init" and any("starting from the head" in m for m in msgs)
    # the fine-tuning run's step-0 evaluation is the first run's final one (same head, same split)
    assert init["val_loss"] == pytest.approx(first["val_loss"], rel=1e-5)
    assert init["val_top1"] == pytest.approx(first["val_top1"])
    fresh = _log(tmp_path / "a")[0]
    assert init["val_loss"] < 0.8 * fresh["val_loss"]
    with pytest.raises(ConfigError, match="exclude"):
        dataclasses.replace(tuned, init_from_last_layer=True).validate()
    with pytest.raises(RespecError, match="config.json"):
        train_eagle(target, ex, tmp_path / "c", dataclasses.replace(tuned, init_from=str(tmp_path / "none")),
                    progress=False, log=lambda m: None)


def test_epoch_order_is_a_permutation_in_length_homogeneous_batches():
    rng = random.Random(0)
    lengths = [rng.choice([20, 500, 1500]) + rng.randrange(10) for _ in range(1000)]
    order = _epoch_order(lengths, 8, seed=3, epoch=2)
    assert sorted(order) == list(range(1000))
    assert order == _epoch_order(lengths, 8, seed=3, epoch=2) and order != _epoch_order(lengths, 8, seed=3, epoch=3)
    batches = [order[i:i + 8] for i in range(0, 1000, 8)]
    pad = sum(8 * max(lengths[j] for j in b) - sum(lengths[j] for j in b) for b in batches)
    shuffled = list(range(1000))
    rng.shuffle(shuffled)
    pad_random = sum(8 * max(lengths[j] for j in shuffled[i:i + 8]) - sum(lengths[j] for j in shuffled[i:i + 8])
                     for i in range(0, 1000, 8))
    assert pad < 0.1 * pad_random, "Batches must group sequences of similar length."
    first = [max(lengths[j] for j in b) for b in batches[:64]]
    assert first != sorted(first), "Batches themselves stay shuffled, not sorted by length."


def test_passage_prompts_wrap_offline_passages_in_long_context_tasks(tmp_path):
    doc = "Passage about frobnication. " * 60                      # 1680 characters
    (tmp_path / "mod.py").write_text(f'"""{doc}"""\n\ndef f():\n    """{"short " * 10}"""\n')
    got = passage_prompts(3, roots=[tmp_path])
    assert len(got) == 1, "One candidate passage (the short docstring is too short)."
    category, text = got[0]
    assert category == "summarisation" and doc.strip() in text and text != doc.strip()
    assert passage_prompts(0, roots=[tmp_path]) == []
    with pytest.raises(ConfigError):
        passage_prompts(-1, roots=[tmp_path])
    with pytest.raises(RespecError, match="no offline passages"):
        passage_prompts(2, roots=[tmp_path], min_chars=5000)
    with pytest.raises(ConfigError, match="passage"):
        PipelineConfig(passage_prompts=-2).validate()
    with pytest.raises(ConfigError, match="text-window"):
        PipelineConfig(text_window=4).validate()


def test_publish_writes_each_better_head_in_bf16_and_a_resumed_run_keeps_the_best(llama_data, tmp_path):
    """--publish DIR: a head that beats the best validation top-1 recorded in DIR (same validation
    set) is written there in bf16 with training.json; a second run starting from it (the restart on a
    new machine: --init-from DIR --publish DIR) replaces it only with a better head."""
    from respec.train.publish import PUBLISHED
    target, store = llama_data
    pub = tmp_path / "shipped"
    cfg = TrainConfig(steps=120, batch_size=8, lr=3e-3, warmup=10, eval_every=40, save_every=40,
                      val_fraction=0.15, seed=0)
    msgs: list[str] = []
    train_eagle(target, store.examples(), tmp_path / "a", cfg, progress=False, log=msgs.append, publish=pub)
    evals = [r for r in _log(tmp_path / "a") if r["event"] != "init"]
    info = json.loads((pub / PUBLISHED).read_text())
    best = max(evals, key=lambda r: r["val_top1"])
    assert info["val_top1"] == best["val_top1"] and info["step"] == best["step"]
    assert info["val_examples"] > 0 and len(info["val_fingerprint"]) == 16
    assert any(m.startswith("published the head") for m in msgs)
    from safetensors.torch import load_file
    assert {v.dtype for k, v in load_file(str(pub / "model.safetensors")).items()} == {torch.bfloat16}
    head = load_eagle_head(pub, target)                      # loads as any shipped head
    prompt = list(store.examples()[0].ids[:store.examples()[0].start])
    assert run(target, "eagle2", prompt, head=head, max_new_tokens=24).tokens == \
        run(target, "vanilla", prompt, max_new_tokens=24).tokens

    # a restart from the published head at a tiny learning rate: nothing better, nothing replaced
    before = (pub / "model.safetensors").read_bytes()
    again = dataclasses.replace(cfg, steps=40, lr=1e-9, warmup=0, init_from=str(pub))
    msgs.clear()
    train_eagle(target, store.examples(), tmp_path / "b", again, progress=False, log=msgs.append, publish=pub)
    rec = [r for r in _log(tmp_path / "b") if r["event"] != "init"]
    assert all(r["val_top1"] <= info["val_top1"] for r in rec)
    assert (pub / "model.safetensors").read_bytes() == before
    assert not any(m.startswith("published the head") for m in msgs)
    # another validation set (another split fraction) does not compare against the recorded figure
    other = dataclasses.replace(again, val_fraction=0.3)
    train_eagle(target, store.examples(), tmp_path / "c", other, progress=False, log=msgs.append, publish=pub)
    assert json.loads((pub / PUBLISHED).read_text())["val_fingerprint"] != info["val_fingerprint"]


def test_publishing_under_training_time_test_ranks_heads_by_their_top1_chain(tmp_path):
    """With --ttt-depth > 1 the published head is the best by chain score (top-1 at depth 1, plus
    depth 1 x depth 2, ...), so a head a little worse at depth 1 but better deeper wins; a score
    recorded at another depth or on another validation set is not compared against."""
    from respec.train.publish import PUBLISHED, chain_score, published_score
    shallow = {"val_top1": 0.62, "val_top1_depth2": 0.40, "val_top1_depth3": 0.30}
    deep = {"val_top1": 0.60, "val_top1_depth2": 0.55, "val_top1_depth3": 0.50}
    assert chain_score(shallow, 1) == pytest.approx(0.62)
    assert chain_score(deep, 3) == pytest.approx(0.60 + 0.60 * 0.55 + 0.60 * 0.55 * 0.50)
    assert chain_score(deep, 3) > chain_score(shallow, 3) and chain_score(deep, 1) < chain_score(shallow, 1)
    (tmp_path / PUBLISHED).write_text(json.dumps({**shallow, "val_fingerprint": "f" * 16, "score_depth": 3}))
    assert published_score(tmp_path, "f" * 16, 3) == pytest.approx(chain_score(shallow, 3))
    assert published_score(tmp_path, "f" * 16, 1) == -1.0      # measured at another depth
    assert published_score(tmp_path, "g" * 16, 3) == -1.0      # on other examples
    (tmp_path / PUBLISHED).write_text(json.dumps({"val_top1": 0.5, "val_fingerprint": "f" * 16}))
    assert published_score(tmp_path, "f" * 16, 1) == pytest.approx(0.5)   # older records: depth 1


def test_a_run_over_a_subset_keeps_the_other_examples_features(llama_data, tmp_path, monkeypatch):
    """A run over some examples (`--max-examples`) that computes new ones must not rewrite the store
    with its own examples only: the other examples' stored features stay readable."""
    import respec.train.features as features
    target, store = llama_data
    ex = store.examples()[:8]
    path = tmp_path / "features.safetensors"
    FeatureCache(target, ex[:5], max_len=20, batch_tokens=20, progress=False, store=path)
    assert path.is_file()
    FeatureCache(target, ex[3:], max_len=20, batch_tokens=20, progress=False, store=path)     # ex[5:] are new
    real, calls = features.target_features, []
    monkeypatch.setattr(features, "target_features", lambda t, ids, layers=None: calls.append(ids.shape[0]) or real(t, ids, layers))
    FeatureCache(target, ex, max_len=20, batch_tokens=20, progress=False, store=path)
    assert sum(calls) == 0, "every example's features, the first run's and the second's, are still stored"


def test_bf16_autocast_training_learns_and_keeps_float32_weights(llama_data, tmp_path):
    """--train-autocast: "auto" is bf16 only for a bf16 target; a bf16-autocast run still lowers the
    validation loss and keeps the head's weights (and so its checkpoint) in the training dtype
    (float32; this tiny target's float64); a bad mode is refused."""
    from types import SimpleNamespace
    from respec.train.head import train_autocast, train_dtype
    assert not isinstance(train_autocast(SimpleNamespace(dtype=torch.float32, device="cpu"), "auto"), torch.autocast)
    on = train_autocast(SimpleNamespace(dtype=torch.bfloat16, device="cpu"), "auto")
    assert isinstance(on, torch.autocast) and on.fast_dtype == torch.bfloat16
    assert isinstance(train_autocast(SimpleNamespace(dtype=torch.float32, device="cpu"), "bf16"), torch.autocast)
    with pytest.raises(ConfigError, match="autocast"):
        TrainConfig(autocast="fp8").validate()
    target, store = llama_data
    out = tmp_path / "head"
    cfg = TrainConfig(steps=120, batch_size=8, lr=3e-3, warmup=10, eval_every=120, save_every=120,
                      val_fraction=0.15, seed=0, autocast="bf16")
    last = train_eagle(target, store.examples(), out, cfg, progress=False, log=lambda m: None)
    assert last["val_loss"] < 0.85 * _log(out)[0]["val_loss"], "Validation loss must go down under bf16 autocast."
    state = torch.load(out / "checkpoint.pt", map_location="cpu", weights_only=False)
    weights = [v for k, v in state["head"].items() if torch.is_tensor(v) and v.is_floating_point()]
    assert weights and all(v.dtype == train_dtype(target) for v in weights)
