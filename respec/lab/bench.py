"""Spec-Bench runner: question JSONL in, per-question records and a per-category summary out.

Contract (ALGORITHMS.md §6): greedy, batch 1, chat template of the target, multi-turn questions
run turn by turn (turn 2 follows the method's own turn-1 answer). MT-bench's eight subcategories are
grouped as `mt_bench`. Per question, method and repeat (`repeats` runs of everything, repeat 0
first; the record's `repeat` field, 0-based, absent in older files and read as 0) one record goes to
`DIR/results.jsonl` (appended and flushed as it completes, so an interrupted run keeps every
finished record); the reports (`respec.lab.report.write_reports`: summary.csv, summary.md, speedup.html,
acceptance.html) are written at the end, each through a temporary file and an atomic rename.
Questions are read by `respec.lab.questions`; both modules' public names are re-exported here.

Metrics per record (`compare_to_vanilla`): speed = new tokens / wall seconds; `matches_vanilla`;
`first_divergence`; `lossless` = equal to vanilla or first diverging where vanilla's top-1/top-2
logit gap is within the rounding tolerance of the model's dtype (0.5 in bf16/fp16, 1e-3 in
fp32/fp64): see README "Lossless"; ROUGE-L and NLL ratio against vanilla. The per-category summary
(speedup as a ratio of means, per-repeat spread, mean accepted length, exact-match and lossless
rates) is `respec.lab.report.summarize`.

Timer edges (respec/engine.py): a run's wall time is `Engine.generate`'s, from before the prefill to
the assembled result; `prefill_ms` is the prompt's forward and the drafter's reset (its index of the
prompt; an EAGLE head's catch-up on the prompt runs in the first step's drafting); each step's
`draft_ms` is the drafter's `propose`, and `verify_ms` the target's `forward_tree` (the upload, the
forward, the output layer; on a GPU, CUDA events). The summary's `loop_ms_per_step` is what is left
per step: (wall - prefill - drafting - forwards) / steps, i.e. reading the step's numbers back,
verifying, keeping the accepted path in the cache, the drafter's feedback and the step's trace
(`respec.anatomy.anatomy`). A peer (`hf-greedy`, `hf-pld`) is timed around `model.generate` alone.
"""
from __future__ import annotations

import contextlib
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from respec._io import atomic_write_text
from respec.anatomy import DepthAcceptance, Totals, acceptance_by_depth, token_times, totals_of
from respec.config import METHODS, EngineConfig, is_lossless
from respec.drafters.suffix import suffix_library
from respec.errors import ConfigError, RespecError
from respec.lab.questions import CATEGORIES, MT_BENCH, Question, bench_category, load_questions
from respec.lab.report import (SUMMARY_COLUMNS, add_hist, bench_figures, repeat_speedups, speedup_matrix_markdown,
                               spread_text, summarize, summary_table_markdown, write_reports)
from respec.memory import RunnerMemory
from respec.models.devices import machine_summary
from respec.runner import parse_methods
from respec.tokens import first_divergence
from respec.transfer import barrier

__all__ = ["CATEGORIES", "MT_BENCH", "PEERS", "Question", "RecordSink", "SUMMARY_COLUMNS", "bench_category",
           "bench_figures", "compare_to_vanilla", "first_divergence", "gap_tolerance", "hf_generate",
           "load_questions", "parse_bench_methods", "repeat_speedups", "rouge_l", "run_bench", "run_peer_question",
           "run_question", "speedup_matrix_markdown", "spread_text", "summarize", "summary_table_markdown",
           "write_reports"]


def gap_tolerance(dtype: str) -> float:
    """Largest vanilla top-1/top-2 logit gap at which a strict method may still diverge by rounding."""
    return 0.5 if ("bfloat16" in dtype or "float16" in dtype) else 1e-3


def rouge_l(ref: Sequence[int], out: Sequence[int]) -> float:
    """ROUGE-L F1 over token ids: longest common subsequence against the reference (vanilla)."""
    if not ref or not out:
        return float(len(ref) == len(out))
    prev = [0] * (len(out) + 1)
    for a in ref:
        cur = [0]
        for j, b in enumerate(out):
            cur.append(prev[j] + 1 if a == b else max(prev[j + 1], cur[j]))
        prev = cur
    lcs = prev[-1]
    if lcs == 0:
        return 0.0
    p, r = lcs / len(out), lcs / len(ref)
    return 2 * p * r / (p + r)


#: Peers measured in the same run: transformers' own greedy `generate` and prompt-lookup decoding.
PEERS: tuple[str, ...] = ("hf-greedy", "hf-pld")
PLD_TOKENS = 10                          # transformers' prompt_lookup_num_tokens for `hf-pld`


def parse_bench_methods(text: str | Sequence[str]) -> list[str]:
    """Engine methods and peers, in order, without duplicates. Raises ConfigError."""
    methods = parse_methods(text, METHODS + PEERS)
    if "suffix" in methods:
        if suffix_library()[0] is None:
            raise ConfigError(suffix_library()[1])
    return methods


def _record(q: Question, method: str, *, new_tokens: int, wall: float, steps: int, committed: int,
            tokens: list[int], texts: list[str], hist: list[int], relaxed: int = 0, retrieval_steps: int = 0,
            fired: int = 0, nll: float | None = None, margins: list[float] | None = None,
            multi_chosen: int = 0, branching: int = 0, depth: dict | None = None,
            totals: dict | None = None, token_ms: list[float] | None = None) -> dict[str, Any]:
    rec = {"question_id": q.question_id, "category": q.category, "method": method,
           "new_tokens": new_tokens, "wall_s": wall, "tokens_per_s": new_tokens / wall if wall > 0 else 0.0,
           "steps": steps, "mean_accepted": committed / steps if steps else 1.0,
           "committed": committed, "relaxed_tokens": relaxed, "retrieval_steps": retrieval_steps,
           "trigger_fired": fired, "nll_per_token": nll, "accept_hist": hist,
           "multi_chosen_steps": multi_chosen, "branching_steps": branching,
           "text": "\n\n".join(texts), "tokens": tokens}
    if depth is not None:                # respec/anatomy.py: acceptance by draft position, the speedup's factors
        rec["depth"], rec["totals"] = depth, totals
    if token_ms is not None:             # when each token was there, turns end to end (same_length_speedup)
        rec["token_ms"] = [round(t, 1) for t in token_ms]
    if margins is not None:
        rec["margins"] = [round(float(m), 4) for m in margins]
    return rec


def run_question(runner, q: Question, config: EngineConfig, score_nll: bool = False,
                 keep_margins: bool = False) -> dict[str, Any]:
    """All turns of one question with one engine method; returns a record (generated token ids
    kept for comparison; vanilla's logit margins with `keep_margins`). With `score_nll`, the
    output's negative log-likelihood under the target is measured per turn."""
    messages: list[dict] = []
    nll_sum, nll_n = 0.0, 0
    relaxed = retrieval_steps = fired = multi_chosen = branching = 0
    tokens: list[int] = []
    margins: list[float] = []
    texts: list[str] = []
    hist: list[int] = []
    token_ms: list[float] = []
    new_tokens = steps = committed = 0
    wall = 0.0
    depth, totals = DepthAcceptance(), Totals()
    for turn in q.turns:
        messages.append({"role": "user", "content": turn})
        result = runner.generate(list(messages), config)
        depth, totals = depth.merge(acceptance_by_depth(result.steps)), totals + totals_of(result)
        messages.append({"role": "assistant", "content": result.text})
        texts.append(result.text)
        tokens.extend(result.tokens)
        token_ms.extend(wall * 1000 + t for t in token_times(result))     # after the earlier turns' walls
        margins.extend(result.token_margins())
        new_tokens += len(result.tokens)
        steps += len(result.steps)
        relaxed += sum(s.verdict.num_relaxed for s in result.steps)
        retrieval_steps += sum(1 for s in result.steps if s.source == "retrieval")
        fired += sum(1 for s in result.steps if s.decision is not None and s.decision.fired)
        for s in result.steps:          # retrieval steps that chose >= 2 candidates: did >= 2 reach the trie?
            chosen = [c for c in s.candidates if "draft" in c] if s.source == "retrieval" else []
            if len(chosen) >= 2:
                multi_chosen += 1
                branching += sum(1 for c in chosen if c.get("proposed", 0) > 0) >= 2
        add_hist(hist, result.stats.accept_length_hist)
        if score_nll:
            total, n = runner.target.nll(result.prompt_tokens, result.tokens)
            nll_sum, nll_n = nll_sum + total, nll_n + n
        committed += sum(len(s.new_tokens) for s in result.steps)
        wall += result.wall_time_s
    return _record(q, config.method, new_tokens=new_tokens, wall=wall, steps=steps, committed=committed,
                   multi_chosen=multi_chosen, branching=branching, depth=depth.to_dict(), totals=totals.to_dict(),
                   token_ms=token_ms, tokens=tokens, texts=texts, hist=hist, relaxed=relaxed, retrieval_steps=retrieval_steps,
                   fired=fired, nll=nll_sum / nll_n if nll_n else None, margins=margins if keep_margins else None)


def hf_generate(runner, prompt_ids: Sequence[int], method: str, max_new_tokens: int) -> tuple[list[int], float, int]:
    """One greedy `model.generate` call of a peer: (new token ids, wall seconds incl. prefill,
    target forwards). Forwards are counted with a forward hook, so `hf-pld`'s mean accepted length
    is measured the same way as ours (tokens committed per forward after the prefill)."""
    import torch


    model, target = runner.target.model, runner.target
    eos = sorted(target.eos_token_ids)
    pad = target.pad_token_id
    kwargs = {"prompt_lookup_num_tokens": PLD_TOKENS} if method == "hf-pld" else {}
    calls = [0]
    hook = model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    try:
        ids = torch.tensor([list(prompt_ids)], device=target.device)
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new_tokens,
                                 do_sample=False, temperature=None, top_p=None, top_k=None,
                                 eos_token_id=eos or None, pad_token_id=pad, **kwargs)
        barrier(target.weight_devices, "hf-generate")    # every GPU holding weights, not only the first
        wall = time.perf_counter() - t0
    finally:
        hook.remove()
    return [int(t) for t in out[0, len(prompt_ids):].tolist()], wall, calls[0]


def run_peer_question(runner, q: Question, method: str, max_new_tokens: int) -> dict[str, Any]:
    """All turns of one question with a transformers peer (same prompts, chat template, lengths)."""
    messages: list[dict] = []
    tokens: list[int] = []
    texts: list[str] = []
    new_tokens = forwards = committed = 0
    wall = 0.0
    for turn in q.turns:
        messages.append({"role": "user", "content": turn})
        ids = runner.encode(list(messages))
        room = runner.target.context_length - len(ids)
        new, seconds, calls = hf_generate(runner, ids, method, min(max_new_tokens, room))
        text = runner.tokenizer.decode(new, skip_special_tokens=True) if runner.tokenizer is not None else ""
        messages.append({"role": "assistant", "content": text})
        texts.append(text)
        tokens.extend(new)
        new_tokens += len(new)
        forwards += max(0, calls - 1)                 # the prefill's forward chose the first token
        committed += max(0, len(new) - 1)
        wall += seconds
    return _record(q, method, new_tokens=new_tokens, wall=wall, steps=forwards, committed=committed,
                   tokens=tokens, texts=texts, hist=[])


RUN_FILE = "run.json"
RESULTS_FILE = "results.jsonl"
MACHINE_FILE = "machine.json"     # what this (last) run ran on; not part of the identity a resume checks


def _machine(runner) -> dict[str, Any]:
    """The machine and the forward as this run found them: respec.models.devices.machine_summary,
    compiled or eager, and the load's linear plan (which can differ from load to load)."""
    forward = runner.target.describe_forward()
    return {**machine_summary(runner.target.device), "forward": forward.mode, "linear_layout": forward.linear_layout}


def _run_identity(runner, base: EngineConfig) -> dict[str, Any]:
    loaded = getattr(runner.target, "loaded", None)
    identity = {"model": getattr(loaded, "name", getattr(runner.target, "name", "model")),
                "dtype": str(runner.target.dtype), "device": str(runner.target.device),
                "eagle_head": getattr(runner, "head_info", None), "config": base.to_dict()}
    if runner.target.describe_forward().compiled:      # only when on, so earlier eager folders still resume
        identity["compiled"] = True
    return identity


def _with_current_defaults(identity: Any) -> Any:
    """An earlier run.json with its config completed by settings added since (e.g. relax.mode), so a
    folder written before a new setting existed still resumes when the run is otherwise the same."""
    try:
        return {**identity, "config": EngineConfig.from_dict(identity["config"]).to_dict()}
    except (RespecError, KeyError, TypeError):
        return identity


def _resume_records(out_dir: Path, identity: dict[str, Any], fresh: bool,
                    results_name: str = RESULTS_FILE) -> list[dict]:
    """Finished records of an earlier, identical run in out_dir (none with `fresh`). Raises
    RespecError when out_dir holds results of a different run (settings, model or head)."""
    results, run_file = out_dir / results_name, out_dir / RUN_FILE
    if fresh or not results.exists():
        return []
    try:
        earlier = json.loads(run_file.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        earlier = None
    if _with_current_defaults(earlier) != json.loads(json.dumps(identity, default=str)):
        raise RespecError(f"{out_dir} holds results of another run (other settings, model or EAGLE head); "
                          f"pass --fresh to start over there, or choose another --out")
    records = []
    for line in results.read_text(encoding="utf-8").splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue                                   # a line cut by an interruption: rerun it
        if isinstance(rec, dict) and "tokens" in rec and (rec["method"] != "vanilla" or "margins" in rec):
            records.append(rec)
    return records


def compare_to_vanilla(rec: dict, ref: dict, tol: float) -> dict:
    """Add matches_vanilla, first_divergence, divergence_gap, lossless, ROUGE-L and NLL ratio."""
    div = first_divergence(ref["tokens"], rec["tokens"])
    rec["matches_vanilla"] = div is None
    rec["first_divergence"] = div
    rec["divergence_gap"] = None if div is None or div >= len(ref["margins"]) else ref["margins"][div]
    rec["lossless"] = div is None or (rec["divergence_gap"] is not None and rec["divergence_gap"] <= tol)
    rec["rouge_l_vs_vanilla"] = rouge_l(ref["tokens"], rec["tokens"])
    rec["nll_ratio"] = (rec["nll_per_token"] / ref["nll_per_token"]
                        if rec["nll_per_token"] is not None and ref["nll_per_token"] else None)
    return rec


def run_bench(runner, questions: list[Question], methods: list[str], base: EngineConfig, out_dir: str | Path,
              progress: bool = True, fresh: bool = False, on_record: Callable[[dict], None] | None = None,
              should_stop: Callable[[], bool] | None = None, guard: Callable[[], Any] | None = None,
              repeats: int = 1) -> "pandas.DataFrame":
    """Run every (question, method) `repeats` times (repeat by repeat, so slow drifts of the machine
    spread over all methods), vanilla first per question; each record carries its `repeat` and is
    compared to vanilla's record of the same repeat. Append each record to results.jsonl as it
    completes (and hand it to `on_record`). Rerunning into the same out_dir skips finished records
    (the run's model, head and settings must be the same: run.json; a larger `repeats` adds the
    missing repeats); `fresh` starts over. `should_stop()` is checked before every record: True ends the run early (the
    reports then cover what finished). Each record runs inside `guard()` (a context manager, e.g.
    a lock that keeps other users off a shared model). Writes summary.csv, summary.md, speedup.html and
    acceptance.html at the end (`write_reports`).

    What carries across requests (SuffixDecoding's global tree, ReSpec's earlier answers: the
    runner's `memory`) is kept per method and repeat: a method sees its own answers to this
    repeat's earlier questions, never another method's answer to the same question nor its own
    from an earlier repeat (a resumed run starts that memory empty)."""
    import pandas as pd
    from tqdm import tqdm


    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise ConfigError(f"repeats must be an integer >= 1, got {repeats!r}")
    out_dir = Path(out_dir)
    methods = ["vanilla"] + [m for m in methods if m != "vanilla"]
    identity = _run_identity(runner, base)
    done = _resume_records(out_dir, identity, fresh)
    out_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out_dir / RUN_FILE, json.dumps(identity, indent=1))
    atomic_write_text(out_dir / MACHINE_FILE, json.dumps(_machine(runner), indent=1, default=str))
    by_key = {(r["question_id"], r["method"], r.setdefault("repeat", 0)): r for r in done}
    tol = gap_tolerance(str(runner.target.dtype))
    engine = [m for m in methods if m not in PEERS]
    lossy = [m for m in engine if not is_lossless(base.with_overrides({"method": m}))]
    todo = [(q, m, k) for k in range(repeats) for q in questions for m in methods
            if (q.question_id, m, k) not in by_key]
    kept_memory = runner.memory
    runner.memory = RunnerMemory()                       # the warm-up's answers are forgotten
    memories: dict[tuple[int, str], RunnerMemory] = {}
    if todo:
        _warm_up(runner, methods, base)
    records: list[dict] = []
    # the kept records, rewritten atomically (drops a line cut by an interruption); new ones append
    atomic_write_text(out_dir / RESULTS_FILE, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in done))
    with (out_dir / RESULTS_FILE).open("a", encoding="utf-8") as fh, \
            tqdm(total=repeats * len(questions) * len(methods), initial=repeats * len(questions) * len(methods) - len(todo),
                 desc="bench", unit="run", disable=not progress, file=sys.stderr) as bar:
        sink = RecordSink(fh, bar, on_record)
        for k in range(repeats):
            for q in questions:
                for m in methods:
                    rec = by_key.get((q.question_id, m, k))
                    if rec is None:
                        if should_stop is not None and should_stop():
                            break
                        bar.set_postfix_str(f"q{q.question_id} {q.category} {m}" + (f" #{k + 1}" if repeats > 1 else ""))
                        runner.memory = memories.setdefault((k, m), RunnerMemory())
                        with (guard or contextlib.nullcontext)():
                            if m in PEERS:
                                rec = run_peer_question(runner, q, m, base.max_new_tokens)
                            else:
                                rec = run_question(runner, q, base.with_overrides({"method": m}),
                                                   score_nll=bool(lossy) and (m == "vanilla" or m in lossy),
                                                   keep_margins=m == "vanilla")
                        rec["repeat"] = k
                        ref = rec if m == "vanilla" else by_key[(q.question_id, "vanilla", k)]
                        rec = compare_to_vanilla(rec, ref, tol)
                        by_key[(q.question_id, m, k)] = rec
                        sink.add(rec)
                    records.append(rec)
    runner.memory = kept_memory
    df = pd.DataFrame(records)
    summary = summarize(df)
    write_reports(summary, df, out_dir)
    return summary


def _warm_up(runner, methods: Sequence[str], base: EngineConfig) -> None:
    """Spec-Bench runs the first question before timing: one short run per method."""
    for m in methods:
        if m in PEERS:
            hf_generate(runner, runner.encode("Hello!"), m, 8)
        else:
            runner.generate("Hello!", base.with_overrides({"method": m, "max_new_tokens": 8}))


@dataclass
class RecordSink:
    """Where a finished record goes: appended to the results JSONL (flushed, so an interruption
    keeps it), one step of the progress bar, and `on_record` (the Lab's live table)."""
    fh: Any
    bar: Any
    on_record: Callable[[dict], None] | None = None

    def add(self, rec: dict) -> None:
        self.fh.write(json.dumps(rec, ensure_ascii=False) + "\n")
        self.fh.flush()
        self.bar.update(1)
        if self.on_record is not None:
            self.on_record(rec)
