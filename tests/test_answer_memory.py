"""ReSpec's cross-request memory (`candidates.memory_tokens`, respec/retrieval/answers.py): earlier
answers kept bounded and separated, searched beside the context, tagged in the trace and the
explorer, lossless under strict verification, and off by default."""
import json

import pytest

from respec.lab.bench import Question, run_bench
from respec.config import EngineConfig
from respec.retrieval.answers import SEPARATOR, AnswerMemory, MemoryIndex
from tests.test_app_render import tiny_runner


def test_answers_are_bounded_newest_kept_and_separated():
    m = AnswerMemory(max_tokens=10)
    for answer in ([1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], []):
        m.add(answer)
    assert len(m) == 2, "the oldest answer is dropped beyond max_tokens; an empty one is not kept"
    assert m.corpus(100) == [4, 5, 6, 7, SEPARATOR, 8, 9, 10, 11, SEPARATOR]
    assert m.corpus(6) == [8, 9, 10, 11, SEPARATOR], "within the limit: the newest answers only"
    idx = MemoryIndex(m.corpus(100))
    assert idx.positions([5, 6, 7], min_match=2, max_n=8) == [], "an answer's last token has nothing to copy"
    found = idx.positions([4, 5, 6], min_match=2, max_n=8)
    assert [p.end for p in found] == [2] and idx.continuation(2, 5) == [7], "no copy crosses a separator"
    assert idx.continuation(0, 2) == [5, 6]


def _records(tmp_path, memory_tokens, method="respec-strict"):
    runner = tiny_runner()
    questions = [Question(i, "qa", ("w5 w17 w33 w9 w71 w4 w88 w12 " * 3,)) for i in (1, 2)]
    base = EngineConfig().with_overrides({"max_new_tokens": 40, "tree.auto": False,
                                          "candidates.memory_tokens": memory_tokens, "candidates.min_match": 2,
                                          "trigger.theta_entropy": 20.0})
    out = tmp_path / f"m{memory_tokens}"
    run_bench(runner, questions, ["vanilla", method], base, out, progress=False, fresh=True)
    return runner, [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines()]


def test_memory_candidates_come_from_earlier_answers_and_stay_lossless(tmp_path, monkeypatch):
    import respec.drafters.respec as respec_mod
    seen = []
    real = respec_mod.ReSpecDrafter.propose

    def spy(self, ctx):
        p = real(self, ctx)
        seen.extend(c for c in p.candidates if c.origin == "memory")
        return p
    monkeypatch.setattr(respec_mod.ReSpecDrafter, "propose", spy)
    runner, recs = _records(tmp_path, 4096)
    assert all(r["matches_vanilla"] for r in recs), "respec-strict with memory equals vanilla"
    assert seen, "the second question finds positions in the first one's answer"
    assert all(c.end_pos < 0 and c.to_dict()["origin"] == "memory" for c in seen)
    assert any(c.draft for c in seen), "a memory position drafts"
    seen.clear()
    _records(tmp_path, 0)
    assert not seen, "memory_tokens 0 (the default) never looks at earlier answers"
    assert EngineConfig().candidates.memory_tokens == 0


def test_the_explorer_names_an_earlier_answer():
    from app.views.render import candidate_rows
    from respec.trace import StepTrace
    from respec.tree import DraftTree
    from respec.verify import Verdict
    step = StepTrace(step=0, source="retrieval", tree=DraftTree.root_only(1),
                     verdict=Verdict(path=(0,), next_token=2, next_kind="bonus", node_status=("accepted",)),
                     new_tokens=(2,), entropies=(0.0,), margins=(1.0,), draft_ms=0.0, verify_ms=1.0,
                     candidates=({"end_pos": 4, "match_len": 3}, {"end_pos": -7, "match_len": 2, "origin": "memory"}))
    keys, rows = candidate_rows(step, type("D", (), {"piece": staticmethod(str)})())
    col = keys.index("origin")
    assert [r[col] for r in rows] == ["this request", "an earlier answer"]
