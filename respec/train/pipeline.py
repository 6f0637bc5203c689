"""`python -m respec train-eagle`: prompts -> self-distilled responses (stored, resumable) +
offline teacher-forced text -> head training -> published-format head in --out.

Data directory (default `data/eagle/<target-slug>/` in the repository): the response chunk files
of every run for that target accumulate there; rerunning generates only what is missing.
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path

from respec.errors import ConfigError, RespecError
from respec.train.data import (Prompt, ResponseStore, generate_responses, load_prompt_file, offline_texts,
                               passage_prompts, target_slug, text_examples, text_prompts)
from respec.train.prompts import builtin_prompts
from respec.train.trainer import TrainConfig, train_eagle


def default_spec_bench() -> Path:
    from respec.models.loading import project_root
    return project_root().parent / "shared" / "spec_bench" / "question_dev.jsonl"


def default_data_dir(slug: str) -> Path:
    from respec.models.loading import project_root
    return project_root() / "data" / "eagle" / slug


@dataclass
class PipelineConfig:
    spec_bench: str | None = "auto"        # "auto": the default path if present; None: skip
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

    def validate(self) -> "PipelineConfig":
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
        if self.spec_bench not in (None, "auto") and not Path(self.spec_bench).is_file():
            raise RespecError(f"Spec-Bench questions file not found: {self.spec_bench}")
        for f in self.prompts_files:
            if not Path(f).is_file():
                raise RespecError(f"prompts file not found: {f}")
        if self.generate_only and not self.generate:
            raise ConfigError("--generate-only and --no-generate exclude each other")
        return self


def collect_prompts(pc: PipelineConfig) -> list[Prompt]:
    """Spec-Bench dev first turns, extra prompt files, the built-in sets and the long-context passage
    prompts, interleaved round-robin so that a --max-prompts cap keeps a mix of every source."""
    sources: list[list[Prompt]] = []
    sb = default_spec_bench() if pc.spec_bench == "auto" else (Path(pc.spec_bench) if pc.spec_bench else None)
    if sb is not None and sb.is_file():
        sources.append(text_prompts(load_prompt_file(sb), "specbench"))
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


def run_pipeline(target, out_dir: str | Path, pc: PipelineConfig, tc: TrainConfig, *, resume: bool = False,
                 progress: bool = True, log=None) -> dict:
    log = log or (lambda m: print(m, file=sys.stderr))
    pc.validate()
    tc.validate()
    slug = target_slug(target)
    store = ResponseStore(pc.data_dir or default_data_dir(slug))
    if pc.generate:
        prompts = collect_prompts(pc)
        log(f"{len(prompts)} prompts; responses stored in {store.dir}")
        added = generate_responses(target, prompts, store, max_new_tokens=pc.gen_max_new_tokens,
                                   batch_size=pc.gen_batch_size, progress=progress)
        log(f"generated {added} new responses")
    examples = store.examples()
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
    return train_eagle(target, examples, out_dir, tc, resume=resume, progress=progress, log=log)
