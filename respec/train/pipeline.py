"""`python -m respec train-eagle`: prompts -> self-distilled responses (stored, resumable) +
offline teacher-forced text -> head training -> published-format head in --out.

Data directory (default `data/eagle/<target-slug>/` in the repository): the response chunk files
of every run for that target accumulate there; rerunning generates only what is missing.

No benchmark question enters the data: every prompt (and, before training, every stored record's
decoded prompt) is checked against the committed Spec-Bench fingerprints plus every questions file
named by `exclude_questions` (the dev split at its default path is added when present), and the run
stops with RespecError on any overlap (`respec/train/exclusion.py`). Shards of the store already
found clean under the same guard and tokenizer are not decoded again (`respec/train/store_check.py`).

Nothing else defaults into the repository: the head, checkpoint and log go to the required --out,
and cached features stay in memory unless --feature-store names a file.
"""
from __future__ import annotations

import hashlib
import json
import sys
from dataclasses import dataclass, field
from pathlib import Path

from respec.errors import ConfigError, RespecError
from respec.models.default_model import project_root
from respec.prompting import encode_prompt
from respec.train.data import (Prompt, ResponseStore, generate_responses, load_prompt_file, offline_texts,
                               passage_prompts, target_slug, text_examples, text_prompts)
from respec.train.exclusion import BenchmarkGuard
from respec.train.prompts import builtin_prompts
from respec.train.self_instruct import derived_prompts, seed_prompts
from respec.train.store_check import check_store
from respec.train.trainer import TrainConfig, train_eagle


def default_spec_bench() -> Path:
    return project_root().parent / "shared" / "spec_bench" / "question_dev.jsonl"


def default_data_dir(slug: str) -> Path:
    return project_root() / "data" / "eagle" / slug


@dataclass
class PipelineConfig:
    exclude_questions: list[str] = field(default_factory=list)   # extra benchmark files to refuse
    self_instruct: bool = False            # prompts the target writes itself (respec/train/self_instruct.py)
    prompts_files: list[str] = field(default_factory=list)
    builtin: bool = True
    max_prompts: int | None = None         # cap on prompts answered (after interleaving sources)
    gen_max_new_tokens: int = 256
    gen_batch_size: int = 8
    generate: bool = True
    passage_prompts: int = 0               # long-context summarise/answer prompts over offline text
    text_tokens: int = 0
    text_window: int | None = None         # tokens per teacher-forced text window (None: --max-len)
    data_dir: str | None = None
    generate_only: bool = False
    max_examples: int | None = None        # train on this many stored responses (a fixed subset by key)

    def validate(self) -> "PipelineConfig":
        if self.max_examples is not None and self.max_examples < 1:
            raise ConfigError("--max-examples must be >= 1")
        if self.max_prompts is not None and self.max_prompts < 0:
            raise ConfigError("--max-prompts must be >= 0")
        if self.gen_max_new_tokens < 1:
            raise ConfigError("--gen-max-new-tokens must be >= 1")
        if self.gen_batch_size < 1:
            raise ConfigError("--gen-batch-size must be >= 1")
        if self.text_tokens < 0:
            raise ConfigError("--text-tokens must be >= 0")
        if self.passage_prompts < 0:
            raise ConfigError("--passage-prompts must be >= 0")
        if self.text_window is not None and self.text_window < 8:
            raise ConfigError("--text-window must be >= 8")
        for f in [*self.prompts_files, *self.exclude_questions]:
            if not Path(f).is_file():
                raise RespecError(f"prompts file not found: {f}")
        if self.generate_only and not self.generate:
            raise ConfigError("--generate-only and --no-generate exclude each other")
        return self


def collect_prompts(pc: PipelineConfig) -> list[Prompt]:
    """Extra prompt files, the built-in sets and the long-context passage prompts, interleaved
    round-robin so that a --max-prompts cap keeps a mix of every source. (Self-instruct prompts are
    generated in stages by `generate_self_instruct`.)"""
    sources: list[list[Prompt]] = []
    for f in pc.prompts_files:
        sources.append(text_prompts(load_prompt_file(f), f"file:{Path(f).name}"))
    if pc.builtin:
        items = builtin_prompts()
        by_cat: dict[str, list] = {}
        for c, t in items:
            by_cat.setdefault(c, []).append((c, t))
        sources += [text_prompts(v, "builtin") for v in by_cat.values()]
    if pc.passage_prompts:
        sources.append(text_prompts(passage_prompts(pc.passage_prompts), "passage"))
    out, i = [], 0
    while any(i < len(s) for s in sources):
        out += [s[i] for s in sources if i < len(s)]
        i += 1
    return out if pc.max_prompts is None else out[:pc.max_prompts]


def benchmark_guard(pc: PipelineConfig) -> BenchmarkGuard:
    dev = default_spec_bench()
    return BenchmarkGuard.load([*pc.exclude_questions, *([str(dev)] if dev.is_file() else [])])


def check_prompts(guard: BenchmarkGuard, prompts: list[Prompt], tokenizer) -> None:
    guard.check_prompts((p.key, p.text if p.text is not None else tokenizer.decode(list(p.ids))) for p in prompts)


# per material kind: a short cap keeps batches of short answers from waiting on long ones
_STAGE1_CAPS = {"si1-question": 64, "si1-german": 128, "si1-problem": 128}
_MATERIAL = ("si1-question", "si1-article", "si1-problem", "si1-german")


def _message_prompts(items, tokenizer) -> list[Prompt]:
    out = []
    for category, msgs in items:
        key = hashlib.sha1(json.dumps(msgs).encode("utf-8")).hexdigest()[:16]
        out.append(Prompt(key=f"self-instruct:{key}", category=category, ids=tuple(encode_prompt(tokenizer, msgs))))
    return out


def generate_self_instruct(target, store: ResponseStore, pc: PipelineConfig, guard: BenchmarkGuard, *,
                           progress: bool, log) -> int:
    """Stage 1 material (questions, articles, problems, German text), then stage 2 built from it,
    then the directly answered stage-1 tasks, then stage 2 again (multi-turn continuations of those).
    Every step skips what the store already holds, so an interrupted run resumes."""
    seeds = seed_prompts()
    added = 0

    def gen(prompts: list[Prompt], cap: int, stage1: bool = False) -> None:
        nonlocal added
        check_prompts(guard, prompts, target.tokenizer)
        added += generate_responses(target, prompts, store, max_new_tokens=cap, batch_size=pc.gen_batch_size,
                                    progress=progress, keep_text=stage1)   # stage 2 builds on stage-1 prompts

    def stage2() -> None:
        items = derived_prompts(store.records(), lambda ids: target.tokenizer.decode(ids, skip_special_tokens=True))
        texts = text_prompts([(c, p) for c, p in items if isinstance(p, str)], "self-instruct")
        msgs = _message_prompts([(c, p) for c, p in items if not isinstance(p, str)], target.tokenizer)
        log(f"self-instruct stage 2: {len(texts)} prompts + {len(msgs)} multi-turn continuations")
        gen(texts + msgs, pc.gen_max_new_tokens)

    for kind in _MATERIAL:
        gen(text_prompts([x for x in seeds if x[0] == kind], "self-instruct"),
            _STAGE1_CAPS.get(kind, pc.gen_max_new_tokens), stage1=True)
    stage2()
    gen(text_prompts([x for x in seeds if x[0] not in _MATERIAL], "self-instruct"), pc.gen_max_new_tokens,
        stage1=True)
    stage2()
    return added


def sample_examples(examples: list, n: int | None) -> list:
    """`n` of the examples (all when None or fewer): the first by key. Keys are hashes, so this is a
    fixed random sample, and a larger n keeps every example of a smaller one (cached features stay
    useful as the data grows)."""
    return examples if n is None or len(examples) <= n else sorted(examples, key=lambda e: e.key)[:n]


def run_pipeline(target, out_dir: str | Path, pc: PipelineConfig, tc: TrainConfig, *, resume: bool = False,
                 publish: str | Path | None = None,
                 progress: bool = True, log=None) -> dict:
    log = log or (lambda m: print(m, file=sys.stderr))
    pc.validate()
    tc.validate()
    slug = target_slug(target)
    store = ResponseStore(pc.data_dir or default_data_dir(slug))
    guard = benchmark_guard(pc)
    if pc.generate:
        prompts = collect_prompts(pc)
        check_prompts(guard, prompts, target.tokenizer)
        log(f"{len(prompts)} prompts; responses stored in {store.dir}")
        added = generate_responses(target, prompts, store, max_new_tokens=pc.gen_max_new_tokens,
                                   batch_size=pc.gen_batch_size, progress=progress)
        if pc.self_instruct:
            added += generate_self_instruct(target, store, pc, guard, progress=progress, log=log)
        log(f"generated {added} new responses")
    check_store(guard, store, target.tokenizer)
    examples = store.examples()
    examples = sample_examples(examples, pc.max_examples)
    log(f"self-distillation: {len(examples)} responses, "
        f"{sum(len(e.ids) - e.start for e in examples)} response tokens")
    if pc.generate_only:
        return {"responses": len(examples)}
    if pc.text_tokens:
        text = text_examples(target.tokenizer, offline_texts(), pc.text_tokens,
                             min(pc.text_window or tc.max_len, tc.max_len), progress=progress)
        log(f"teacher-forced offline text: {len(text)} windows, {sum(len(e.ids) for e in text)} tokens")
        examples = examples + text
    if not examples:
        raise RespecError(f"no training data: no responses in {store.dir} and --text-tokens is 0")
    return train_eagle(target, examples, out_dir, tc, resume=resume, progress=progress, log=log, publish=publish)
