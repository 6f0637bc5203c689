"""Recall of the best retrieval continuation under the position-examination cap (issue: tries that branch).

ReSpec's candidate search (respec/retrieval/position_index.py `positions`) examines at most
`candidates.max_positions` (64) of the most recent occurrences of the last `L_min`-gram. This script
measures what that cap loses. For every question it generates the vanilla (greedy) answer of every
turn, then replays each answer token by token: at output position t the history is the turn's prompt
plus the answer so far, the root is answer[t], and each earlier occurrence e that matches at least
`L_min` tokens proposes hist[e+1 : e+1+L_max]. Its *agreement* is how many leading tokens equal the
answer's next tokens (what a draft from it would get accepted under greedy strict verification).

Printed per category and overall:
- `prompt_len`: mean prompt length (tokens, per turn);
- `retrievable`: share of answer positions where some earlier occurrence agrees on >= 1 token (what
  retrieval could draft at all), `from_prompt`: the same counting only occurrences inside the prompt
  (the answer copying its prompt), `mean_best`: the best agreement's mean where retrievable;
- `positions`: output positions where some occurrence (uncapped search) agrees on >= 1 token;
- `over_cap`: share of those positions with more matching occurrences than the cap;
- `recall`: share of those positions where the capped search still contains an occurrence with the
  best agreement; `tokens_kept`: sum of the capped best agreements / sum of the uncapped ones.

    .venv/bin/python scripts/position_cap_recall.py [--questions ../shared/spec_bench/question_dev.jsonl]
        [--limit-per-category 3] [--max-new-tokens 96] [--min-match 2] [--l-max 32] [--cap 64]
        [--model default] [--dtype auto]

Needs no EAGLE head and no timing: the figures do not depend on the machine.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # `python scripts/...` imports respec

from tqdm import tqdm

from respec.tokens import common_prefix_len  # noqa: E402  (after the sys.path line above)

UNCAPPED = 10 ** 9


@dataclass
class Tally:
    answer: int = 0          # answer positions with a next token
    from_prompt: int = 0     # ... where an occurrence inside the prompt agrees on >= 1 token
    prompt_tokens: int = 0   # sum of prompt lengths (one per turn)
    positions: int = 0
    over_cap: int = 0
    recalled: int = 0
    best_all: int = 0
    best_cap: int = 0

    def add(self, other: "Tally") -> None:
        for k in vars(self):
            setattr(self, k, getattr(self, k) + getattr(other, k))


def agreement(hist: list[int], e: int, future: list[int], l_max: int) -> int:
    """Leading tokens of hist[e+1 : e+1+l_max] equal to `future`."""
    return common_prefix_len(hist[e + 1:e + 1 + l_max], future[:l_max])


def replay(prompt: list[int], answer: list[int], min_match: int, l_max: int, cap: int) -> Tally:
    """Walk one answer; see the module docstring."""
    from respec.retrieval import NgramPositionIndex

    index = NgramPositionIndex()
    index.extend(prompt)
    hist = list(prompt)
    t_out = Tally(prompt_tokens=len(prompt))
    for t, root in enumerate(answer):
        future = answer[t + 1:]
        if future:
            query = hist[-40:] + [root]
            every = index.positions(query, min_match=min_match, max_n=UNCAPPED, max_examined=UNCAPPED)
            capped = index.positions(query, min_match=min_match, max_n=UNCAPPED, max_examined=cap)
            best_all = max((agreement(hist, m.end, future, l_max) for m in every), default=0)
            t_out.answer += 1
            t_out.from_prompt += any(m.end < len(prompt) and agreement(hist, m.end, future, l_max) >= 1
                                     for m in every)
            if best_all >= 1:
                best_cap = max((agreement(hist, m.end, future, l_max) for m in capped), default=0)
                t_out.positions += 1
                t_out.over_cap += len(every) > cap
                t_out.recalled += best_cap == best_all
                t_out.best_all += best_all
                t_out.best_cap += best_cap
        index.append(root)
        hist.append(root)
    return t_out


def generate_answers(questions, args) -> list[tuple[str, list[int], list[int]]]:
    """(category, prompt ids, greedy answer ids) for every turn of every question."""
    from respec.lab.bench import bench_category
    from respec.models import load_target
    from respec.runner import Runner

    runner = Runner(load_target(args.model, dtype=args.dtype))
    out = []
    for q in tqdm(questions, desc="vanilla answers", unit="question"):
        messages: list[dict] = []
        for turn in q.turns:
            messages.append({"role": "user", "content": turn})
            res = runner.generate(list(messages), method="vanilla", max_new_tokens=args.max_new_tokens)
            messages.append({"role": "assistant", "content": res.text})
            out.append((bench_category(q.category), list(res.prompt_tokens), list(res.tokens)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", default="../shared/spec_bench/question_dev.jsonl")
    ap.add_argument("--limit-per-category", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--min-match", type=int, default=2, help="L_min (device default 2)")
    ap.add_argument("--l-max", type=int, default=32, help="L_max (device default 32)")
    ap.add_argument("--cap", type=int, default=64, help="candidates.max_positions")
    ap.add_argument("--model", default="default")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--answers", default=None, metavar="FILE",
                    help="JSON cache of the generated (prompt, answer) token ids: reused when present, "
                         "written otherwise (so other L_min / L_max / cap values skip generation)")
    args = ap.parse_args()

    from respec.lab.bench import load_questions

    questions = load_questions(args.questions, limit_per_category=args.limit_per_category)
    cache = Path(args.answers) if args.answers else None
    if cache is not None and cache.is_file():
        answers = json.loads(cache.read_text(encoding="utf-8"))
    else:
        answers = generate_answers(questions, args)
        if cache is not None:
            cache.write_text(json.dumps(answers), encoding="utf-8")
    per_cat: dict[str, Tally] = defaultdict(Tally)
    turns: dict[str, int] = defaultdict(int)
    for cat, prompt, answer in answers:
        turns[cat] += 1
        turns["overall"] += 1
        per_cat[cat].add(replay(prompt, answer, args.min_match, args.l_max, args.cap))
    total = Tally()
    print(f"L_min {args.min_match}, L_max {args.l_max}, cap {args.cap}, {len(questions)} questions, "
          f"{args.max_new_tokens} tokens per turn")
    print(f"{'category':<16}{'prompt_len':>11}{'retrievable':>12}{'from_prompt':>12}{'mean_best':>10}"
          f"{'positions':>10}{'over_cap':>10}{'recall':>9}{'tokens_kept':>13}")
    for cat, t in sorted(per_cat.items()) + [("overall", total)]:
        if cat != "overall":
            total.add(t)
        p, a = max(t.positions, 1), max(t.answer, 1)
        print(f"{cat:<16}{t.prompt_tokens / max(turns[cat], 1):>11.0f}{t.positions / a:>12.3f}"
              f"{t.from_prompt / a:>12.3f}{t.best_all / p:>10.2f}{t.positions:>10}{t.over_cap / p:>10.3f}"
              f"{t.recalled / p:>9.3f}{t.best_cap / max(t.best_all, 1):>13.3f}")


if __name__ == "__main__":
    main()
