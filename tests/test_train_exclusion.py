"""No benchmark question in head training data: the guard (respec/train/exclusion.py), the prompt
sources, and every committed response shard under data/eagle/ (decoded with the default model's
tokenizer) are checked against the committed Spec-Bench fingerprints and, where the dev split sits
at its default path, against the full text of every one of its questions."""
import json
import random
from pathlib import Path

import pytest

from respec.errors import RespecError
from respec.train.data import ResponseStore, passage_prompts, text_prompts
from respec.train.exclusion import FINGERPRINT_FILE, BenchmarkGuard, question_texts, words, write_fingerprints
from respec.train.pipeline import (PipelineConfig, benchmark_guard, check_prompts, collect_prompts,
                                   default_data_dir, default_spec_bench)
from respec.train.prompts import builtin_prompts
from respec.train.self_instruct import derived_prompts, seed_prompts

QUESTIONS = [
    "Imagine you are writing a blog post about a trip to Hawaii; describe the cultural experiences and sights.",
    "Solve for x: 3x + 7 = 22.",
    "Translate into English: Der Hund schläft im Garten neben dem alten Apfelbaum.",
]


def _questions_file(tmp_path: Path) -> Path:
    f = tmp_path / "q.jsonl"
    f.write_text("".join(json.dumps({"question_id": i, "category": "x", "turns": [q, "Now shorten it."]}) + "\n"
                         for i, q in enumerate(QUESTIONS)))
    return f


def test_guard_finds_questions_inside_prompts_whatever_the_case_and_punctuation(tmp_path):
    guard = BenchmarkGuard.from_texts(question_texts(_questions_file(tmp_path)))
    for q in QUESTIONS:
        assert guard.matches(q)
        assert guard.matches("Please help.\n\n" + q.upper().replace(";", " -") + "\nThanks!")
    words_ = words(QUESTIONS[0])
    mid = (len(words_) - 12) // 2
    assert guard.matches("so " + " ".join(words_[mid:mid + 12])), "Sharing the middle 12-word window matches."
    assert not guard.matches("Write a short poem about the sea and the wind in autumn.")
    assert not guard.matches(" ".join(words_[:11]) + " and something else entirely"), "11 words are not a window."
    assert guard.matches("Now shorten it."), "Every turn of a question is fingerprinted."
    with pytest.raises(RespecError, match="2 of the prompts overlap Spec-Bench"):
        guard.check_prompts([("a", QUESTIONS[1]), ("b", "fine"), ("c", "x " + QUESTIONS[2])])


def test_pipeline_refuses_a_prompts_file_of_benchmark_questions(tmp_path):
    f = _questions_file(tmp_path)
    pc = PipelineConfig(prompts_files=[str(f)], exclude_questions=[str(f)], builtin=False)
    with pytest.raises(RespecError, match="overlap Spec-Bench"):
        check_prompts(benchmark_guard(pc), collect_prompts(pc), tokenizer=None)


def test_committed_fingerprints_are_those_of_the_dev_split(tmp_path):
    lines = FINGERPRINT_FILE.read_text().split()
    assert len(lines) > 1000 and all(":" in x for x in lines)
    dev = default_spec_bench()
    if dev.is_file():
        out = tmp_path / "fp.txt"
        write_fingerprints([dev], out)
        assert out.read_text().split() == lines, "Rewrite them: python -m respec.train.exclusion --write DEV"
        guard = BenchmarkGuard.load()
        assert all(guard.matches(q) for q in question_texts(dev))


def test_every_prompt_source_is_free_of_benchmark_questions():
    guard = BenchmarkGuard.load()
    prompts = builtin_prompts() + seed_prompts() + passage_prompts(120)
    assert not [t for _, t in prompts if guard.matches(t)]


def test_self_instruct_stages_are_deterministic_and_build_on_stage_one_answers():
    seeds = seed_prompts()
    assert seeds == seed_prompts() and len(seeds) > 1500
    assert len({t for _, t in seeds}) == len(seeds)
    kinds = {c for c, _ in seeds}
    assert {"si1-question", "si1-article", "si1-problem", "si1-german", "si1-writing", "si1-coding"} <= kinds
    rng = random.Random(1)
    article = "The town of Elmford opened a library on Monday. Mayor Ruth Kane said 4,000 books were donated."
    records = ([{"category": "si1-question", "prompt_text": "p", "response_ids": [1]}] * 2
               + [{"category": "si1-article", "prompt_text": "p", "response_ids": [2]} for _ in range(4)]
               + [{"category": "si1-problem", "prompt_text": "p", "response_ids": [3]}]
               + [{"category": "si1-german", "prompt_text": "p", "response_ids": [4]}]
               + [{"category": "si1-writing", "prompt_text": f"w{i}", "response_ids": [5]} for i in range(4)]
               + [{"category": "chat", "response_ids": [6]}])
    texts = {1: "How do glaciers move?", 2: article, 3: "Ann has 3 apples and buys 5 more. How many now?",
             4: "Der Hund schläft. Die Katze spielt. Es regnet heute.", 5: "A poem about the sea, long enough.",
             6: "unrelated chat answer that is not material"}
    rng.shuffle(records)
    decode = lambda ids: texts[ids[0]]  # noqa: E731
    items = derived_prompts(records, decode)
    assert items == derived_prompts(records, decode)
    cats = [c for c, _ in items]
    asked = [p for c, p in items if p == "How do glaciers move?"]
    assert len(asked) == 2 and len(text_prompts([("q", p) for p in asked], "s")) == 1, \
        "Each written question is asked; duplicates collapse by text when they become prompts."
    assert sum(c in ("si2-summarization", "si2-extraction", "si2-qa", "si2-translation") for c in cats) >= 12
    assert cats.count("si2-rag") == 2 and cats.count("si2-math_reasoning") == 1
    assert any(c == "si2-translation" and "Der Hund" in p for c, p in items)
    multi = [p for c, p in items if c == "si2-multiturn"]
    assert len(multi) == 2 and all([m["role"] for m in p] == ["user", "assistant", "user"] for p in multi)
    assert all(article in p for c, p in items if c == "si2-summarization")


@pytest.mark.slow
def test_committed_response_shards_hold_no_benchmark_question():
    """Decodes every stored prompt: none overlaps a fingerprint, and (where the dev split is present)
    none contains a dev question's text in normal form."""
    from respec.models import load_target
    store = ResponseStore(default_data_dir("smollm2-135m-instruct"))
    records = store.records()
    assert len(records) >= 700, f"the committed data is missing from {store.dir}"
    _assert_clean(records, load_target("default").tokenizer)


def _stores_shipping_their_tokenizer() -> list[Path]:
    return sorted(p.parent.parent for p in default_data_dir("x").parent.glob("*/tokenizer/tokenizer_config.json"))


def test_the_stores_of_other_targets_ship_their_tokenizer():
    """Every response store besides the default model's carries the tokenizer that decodes it, so its
    check below runs without that model's weights (CI has only the default model)."""
    stores = {p.parent for p in default_data_dir("x").parent.glob("*/responses-*.jsonl")}
    assert stores - {default_data_dir("smollm2-135m-instruct")} <= set(_stores_shipping_their_tokenizer())


@pytest.mark.parametrize("folder", _stores_shipping_their_tokenizer(), ids=lambda p: p.name)
def test_a_store_shipped_with_its_tokenizer_holds_no_benchmark_question(folder):
    from respec.train.store_convert import load_store_tokenizer
    records = ResponseStore(folder).records()
    assert records, f"{folder} holds a tokenizer but no responses"
    _assert_clean(records, load_store_tokenizer(folder))


def _assert_clean(records, tok):
    prompts = [(r["key"], tok.decode(r["prompt_ids"])) for r in records]
    BenchmarkGuard.load().check_prompts(prompts, what="committed responses")
    assert not [r for r in records if r.get("source", "").startswith("specbench")]
    dev = default_spec_bench()
    if dev.is_file():
        normal = [" ".join(words(t)) for _, t in prompts]
        for q in question_texts(dev):
            nq = " ".join(words(q))
            assert not any(nq in p for p in normal), q[:80]


def test_text_prompts_keys_do_not_depend_on_order():
    a = text_prompts([("c", "one"), ("c", "two")], "s")
    b = text_prompts([("c", "two"), ("c", "one")], "s")
    assert {p.key for p in a} == {p.key for p in b}


class _CharTokenizer:
    """Token id = code point; counts decodes so a test sees which shards were checked."""
    def __init__(self, extra: str = ""):
        self.decoded = 0
        self.extra = extra

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, ids) -> str:
        self.decoded += 1
        return "".join(chr(i) for i in ids)

    def get_vocab(self) -> dict[str, int]:
        return {chr(i): i for i in range(256)} | ({self.extra: 999} if self.extra else {})


def test_store_check_skips_shards_found_clean_and_refuses_a_new_or_changed_one(tmp_path):
    from respec.train.store_check import check_store
    guard = BenchmarkGuard.from_texts(QUESTIONS)
    tok = _CharTokenizer()
    store = ResponseStore(tmp_path / "store")
    verdicts = tmp_path / "cache" / "clean-shards.json"

    def rec(key: str, text: str) -> dict:
        return {"key": key, "source": "test", "prompt_ids": tok.encode(text), "response_ids": [1]}

    first = store.append([rec("a", "Write a short poem about the sea."), rec("b", "Explain recursion simply.")])
    check_store(guard, store, tok, verdicts=verdicts)
    assert tok.decoded == 2 and verdicts.is_file()
    check_store(guard, store, tok, verdicts=verdicts)
    assert tok.decoded == 2, "An unchanged shard found clean is not decoded again."

    bad = store.append([rec("c", "Please: " + QUESTIONS[0])])
    for _ in range(2):
        with pytest.raises(RespecError, match="1 of the stored responses .* overlap Spec-Bench"):
            check_store(guard, store, tok, verdicts=verdicts)
    assert tok.decoded == 4, "Only the new shard is decoded, and a refused shard is never remembered."
    bad.unlink()

    first.write_text(first.read_text() + json.dumps(rec("d", QUESTIONS[1])) + "\n")
    with pytest.raises(RespecError, match="overlap Spec-Bench"):
        check_store(guard, store, tok, verdicts=verdicts)

    first.write_text(json.dumps(rec("e", "Describe a calm morning at the harbour.")) + "\n")
    check_store(guard, store, tok, verdicts=verdicts)
    decoded = tok.decoded
    grown = BenchmarkGuard.from_texts(QUESTIONS + ["Describe a calm morning at the harbour."])
    with pytest.raises(RespecError, match="overlap Spec-Bench"):
        check_store(grown, store, tok, verdicts=verdicts)
    other = _CharTokenizer(extra="<x>")
    check_store(guard, store, other, verdicts=verdicts)
    assert tok.decoded == decoded + 1 and other.decoded == 1, "Another guard or tokenizer checks again."


def test_the_shipped_head_was_trained_on_the_committed_clean_store_only():
    """The default model's shipped head records (training.json, written by train-eagle --publish)
    which responses it saw: exactly the committed store's records, which the test above decodes
    and finds free of benchmark questions; it started from scratch or from a head published the
    same way (a restart: --init-from the shipped directory itself)."""
    from respec.models.default_model import project_root
    from respec.train.publish import PUBLISHED, responses_fingerprint
    shipped = project_root() / "assets" / "eagle" / "smollm2-135m-instruct"
    info = json.loads((shipped / PUBLISHED).read_text())
    responses = ResponseStore(default_data_dir("smollm2-135m-instruct")).examples()
    assert info["data"]["responses"] == len(responses)
    assert info["data"]["responses_fingerprint"] == responses_fingerprint(e.key for e in responses)
    assert info["init_from"] in (None, "assets/eagle/smollm2-135m-instruct", str(shipped))
