"""SuffixDecoding as a peer (`suffix`, respec/drafters/suffix.py, drafting through arctic-inference's
SuffixDecodingCache): greedy output equal to vanilla on tiny Llama and Qwen2, the library's tree
turned into a DraftTree, the global cache carrying from one bench (Lab) question to the next, its
settings range-checked, and a missing library refused in one line while the other methods run."""
import json
from types import SimpleNamespace

import pytest

from respec.config import EngineConfig
from respec.drafters import make_drafter
from respec.drafters import suffix as suffix_mod
from respec.drafters.suffix import library_tree, suffix_library
from respec.memory import RunnerMemory
from respec.errors import ConfigError
from tests.conftest import EOS, make_target, run

needs_library = pytest.mark.skipif(suffix_library()[0] is None, reason="arctic-inference is not built here "
                                   "(scripts/setup.sh builds it; the refusal test runs without it)")
PROMPT = [5, 17, 33, 9, 71, 4, 88, 12] * 3


@needs_library
@pytest.mark.parametrize("arch", ["llama", "qwen2"])
@pytest.mark.parametrize("auto", [False, True])
def test_suffix_is_greedy_equal_to_vanilla_and_drafts(arch, auto):
    target = make_target(arch, seed=0)
    ref = run(target, "vanilla", PROMPT, max_new_tokens=60)
    out = run(target, "suffix", PROMPT, max_new_tokens=60, **{"tree.auto": auto, "suffix.max_depth": 12})
    assert out.tokens == ref.tokens, f"{arch} auto={auto}: suffix must be lossless"
    assert out.stats.steps_by_source.get("retrieval", 0) > 0 and out.stats.mean_accepted_length > 1.5
    reasons = [s.decision.reason for s in out.steps if s.decision is not None]
    assert reasons and all(r.startswith("suffix tree:") for r in reasons)
    assert all(n <= 12 for n in (s.num_draft for s in out.steps)), "never more than suffix.max_depth"


@needs_library
def test_the_library_tree_becomes_a_draft_tree_cut_after_stop_tokens():
    draft = SimpleNamespace(token_ids=[7, 8, EOS, 9, 10, 11], parents=[-1, 0, 1, 2, 0, 4],
                            probs=[0.9, 0.8, 0.7, 0.6, 0.3, 0.5], score=3.0, match_len=4)
    tree, probs = library_tree(1, draft, frozenset({EOS}), cap=10)
    assert tree.tokens == (1, 7, 8, EOS, 10, 11), "the stop token is drafted, nothing after it"
    assert tree.parents == (-1, 0, 1, 2, 1, 4) and set(tree.sources[1:]) == {"retrieval"}
    assert probs == [1.0, 0.9, 0.8, 0.7, 0.3, 0.3], "a path's probability never grows"
    capped, _ = library_tree(1, draft, frozenset(), cap=2)
    assert capped.tokens == (1, 7, 8)
    empty, _ = library_tree(1, None, frozenset(), cap=5)
    assert empty.num_draft == 0


def _questions(tmp_path, n=2):
    from respec.lab.bench import Question
    return [Question(i, "qa", ("w5 w17 w33 w9 w71 w4 w88 w12 " * 3,)) for i in range(1, n + 1)]


@needs_library
@pytest.mark.parametrize("global_cache", [True, False])
def test_the_global_cache_carries_from_one_bench_question_to_the_next(tmp_path, global_cache):
    """Two questions with the same text in one run (as the Lab runs them): with the global cache the
    second drafts from the first's answer from its first step, so it needs fewer target forwards;
    without it both run alike."""
    from respec.lab.bench import run_bench
    from tests.test_app_render import tiny_runner
    runner = tiny_runner()
    base = EngineConfig().with_overrides({"max_new_tokens": 40, "tree.auto": False, "tree.total_tokens": 16,
                                          "suffix.global_cache": global_cache})
    run_bench(runner, _questions(tmp_path), ["suffix"], base, tmp_path / "out", progress=False, fresh=True)
    recs = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    first, second = [r for r in recs if r["method"] == "suffix"]
    assert first["tokens"] == second["tokens"]
    if global_cache:
        assert second["steps"] < first["steps"], (first["steps"], second["steps"])
    else:
        assert second["steps"] == first["steps"]


@needs_library
def test_a_bench_never_lets_a_method_see_its_own_earlier_repeat_or_another_methods_answer(tmp_path):
    """One question, two repeats, vanilla and ReSpec (with memory) before suffix: every suffix
    record takes the same steps as with a cold cache, so repeats and other methods leak nothing."""
    from respec.lab.bench import run_bench
    from tests.test_app_render import tiny_runner
    runner = tiny_runner()
    kept, before = runner.memory, len(runner.memory.answers)
    base = EngineConfig().with_overrides({"max_new_tokens": 40, "tree.auto": False, "candidates.memory_tokens": 4096})
    run_bench(runner, _questions(tmp_path, 1), ["respec-strict", "suffix"], base, tmp_path / "out",
              progress=False, fresh=True, repeats=2)
    recs = [json.loads(x) for x in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    for m in ("suffix", "respec-strict"):
        steps = [r["steps"] for r in recs if r["method"] == m]
        assert len(steps) == 2 and steps[0] == steps[1], (m, steps)
    assert runner.memory is kept and len(kept.answers) == before, "the runner's own memory is left as it was"


@needs_library
def test_suffix_settings_are_range_checked():
    cfg = EngineConfig().with_overrides({"suffix.max_depth": 8, "suffix.min_prob": 0.2, "suffix.global_cache": 0})
    assert cfg.suffix.max_depth == 8 and cfg.suffix.global_cache is False
    for bad in ({"suffix.max_depth": 0}, {"suffix.min_prob": 1.5}, {"suffix.tree": "maybe"}, {"suffix.nope": 1}):
        with pytest.raises(ConfigError):
            EngineConfig().with_overrides(bad)


def test_without_the_library_suffix_is_refused_in_one_line_and_the_rest_runs(monkeypatch):
    monkeypatch.setattr(suffix_mod, "_LIBRARY", [(None, "the suffix method needs arctic-inference (not here)")])
    target = make_target("llama")
    cfg = EngineConfig().with_overrides({"method": "suffix"})
    with pytest.raises(ConfigError) as err:
        make_drafter("suffix", target, cfg, memory=RunnerMemory())
    assert "arctic-inference" in str(err.value) and "\n" not in str(err.value)
    from respec.lab.bench import parse_bench_methods
    with pytest.raises(ConfigError, match="arctic-inference"):
        parse_bench_methods("vanilla,suffix")
    assert parse_bench_methods("vanilla,sam") == ["vanilla", "sam"]
    assert run(target, "sam", PROMPT, max_new_tokens=12).tokens == run(target, "vanilla", PROMPT, max_new_tokens=12).tokens


@needs_library
def test_suffix_runs_from_the_command_line_generate_and_sweep(tmp_path, monkeypatch, capsys):
    """`generate --method suffix` writes a lossless trace; `sweep --method suffix` sweeps its own
    settings (the tiny model stands in for the default one, as in tests/test_cli_preset.py)."""
    from respec import cli
    from respec.trace import result_from_json
    from tests.test_app_render import tiny_runner
    runner = tiny_runner("llama", seed=3)
    monkeypatch.setattr(cli, "_runner", lambda args: runner)
    prompt = "w5 w17 w33 w9 w71 w4 w88 w12 w5 w17 w33 w9 w71 w4 w88 w12"
    traces = {}
    for method in ("vanilla", "suffix"):
        traces[method] = tmp_path / f"{method}.json"
        assert cli.main(["generate", "--prompt", prompt, "--no-chat", "--method", method, "--max-new-tokens", "24",
                         "--trace", str(traces[method])]) == 0, capsys.readouterr().err
    ours, ref = (result_from_json(traces[m].read_text()) for m in ("suffix", "vanilla"))
    assert ours.config.method == "suffix" and ours.tokens == ref.tokens
    q = tmp_path / "q.jsonl"
    q.write_text(json.dumps({"question_id": 1, "category": "qa", "turns": [prompt]}) + "\n")
    assert cli.main(["sweep", "--questions", str(q), "--method", "suffix", "--grid", "suffix.max_depth=4,16",
                     "--max-new-tokens", "16", "--out", str(tmp_path / "sw")]) == 0, capsys.readouterr().err
    rows = (tmp_path / "sw" / "sweep.csv").read_text().splitlines()
    assert len(rows) == 3 and "suffix.max_depth" in rows[0]
