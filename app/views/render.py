"""Traces -> what the page shows: token spans, metrics, diffs, tables and narration. No Gradio.

Contract: every function takes a `GenerationResult` (finished, replayed from a file, or assembled
from the steps streamed so far) and a decoder (`TokenizerDecoder` or `TableDecoder`, app/views/decoders.py),
and returns plain Python values (lists of `(text, label)` spans for HighlightedText, rows for
tables, HTML / Markdown strings, JSON-ready dicts). Nothing here needs a model: a `TableDecoder`
built from a trace's embedded text table renders exactly what the live tokenizer rendered.

Token accounting (respec/trace.py): generated tokens = [first token (prefill)] + new_tokens of each
step. Step s's root is generated token r_s (r_0 = 0, r_{s+1} = r_s + len(new_tokens_s)); its
accepted draft tokens are r_s + 1 .. r_s + a_s, and its bonus token is r_s + a_s + 1.
Worked example: new_tokens per step [(7,), (3, 4, 9), (5,)] -> roots r = [0, 1, 4]; tokens 2, 3
are step 1's accepted drafts, token 4 is step 1's bonus and step 2's root.
"""
from __future__ import annotations

import difflib
import html
import math
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from app.views import anatomy_view
from app.views.text import COLORS, LEGEND, METRICS
from respec.tokens import first_divergence as first_difference  # one rule for engine, bench and app

if TYPE_CHECKING:
    from respec.trace import GenerationResult, StepTrace


# ------------------------------------------------------------------------------- token text
def visible(text: str) -> str:
    """Make line breaks and tabs visible in token strips (the line break itself is kept)."""
    return text.replace("\n", "↵\n").replace("\t", "→\t")


def short(text: str, width: int = 10) -> str:
    """One-line token label for plots: spaces as ·, line breaks as ↵."""
    t = text.replace(" ", "·").replace("\n", "↵").replace("\t", "→")
    return t if len(t) <= width else t[:width - 1] + "…"


# ------------------------------------------------------------------------------- step geometry
def step_roots(result: GenerationResult) -> list[int]:
    """r_s: index (in generated tokens) of each step's root; see the module docstring."""
    roots, r = [], 0
    for s in result.steps:
        roots.append(r)
        r += len(s.new_tokens)
    return roots


def token_steps(result: GenerationResult) -> list[int]:
    """The step that committed each generated token (the first token, from the prefill, maps to 0)."""
    out = [0]
    for s in result.steps:
        out.extend([s.step] * len(s.new_tokens))
    return out[:len(result.tokens)]


def token_labels(result: GenerationResult) -> list[str]:
    """Who produced each generated token, and how it was verified (a LEGEND key)."""
    labels = ["target"]
    for s in result.steps:
        for node in s.verdict.path[1:]:
            if s.verdict.node_status[node] == "relaxed":
                labels.append("relaxed")
            else:
                labels.append("retrieval" if s.tree.sources[node] == "retrieval" else "eagle")
        labels.append("target")
    return labels[:len(result.tokens)]


def rejected_branch(step: StepTrace, limit: int = 6) -> list[int]:
    """Node indices of the best rejected draft below the last accepted node (highest-scored
    rejected child, then its first children), for the on-demand "rejected" spans."""
    tree, status = step.tree, step.verdict.node_status
    children = tree.children()
    kids = [c for c in children[step.verdict.path[-1]] if status[c] == "rejected"]
    if not kids:
        return []
    if tree.scores is not None:
        kids.sort(key=lambda c: -tree.scores[c])
    out = [kids[0]]
    while len(out) < limit and children[out[-1]]:
        out.append(children[out[-1]][0])
    return out


# ------------------------------------------------------------------------------- output strips
def output_spans(result: GenerationResult, decoder, show_rejected: bool = False) -> list[tuple[str, str]]:
    """HighlightedText spans of the generated text, one per token, labelled by LEGEND key. With
    `show_rejected`, each step's best rejected draft is inserted (label "rejected") before the
    target's own token, as ✗[...]."""
    pieces = decoder.pieces(result.tokens)
    labels = token_labels(result)
    spans = [(visible(p), lab) for p, lab in zip(pieces, labels)]
    if not show_rejected or not result.steps:
        return spans
    out: list[tuple[str, str]] = [spans[0]]
    roots = step_roots(result)
    for s, r in zip(result.steps, roots):
        a = s.num_accepted
        out.extend(spans[r + 1:r + 1 + a])
        branch = rejected_branch(s)
        if branch and r + a + 1 < len(spans) + 1:
            text = "".join(decoder.piece(s.tree.tokens[n]) for n in branch)
            out.append((visible(f"✗[{text}]"), "rejected"))
        out.extend(spans[r + 1 + a:r + 2 + a])
    return out


# ------------------------------------------------------------------------------- metrics
def run_metrics(result: GenerationResult, vanilla: GenerationResult | None = None) -> dict[str, Any]:
    """JSON-ready metrics of one run (UX.md §3); speedup measured against `vanilla` if given."""
    st = result.stats
    steps = st.steps
    retrieval_steps = [s for s in result.steps if s.source == "retrieval"]
    decisions = [s.decision for s in result.steps if s.decision is not None and s.decision.fired is not None]
    out: dict[str, Any] = {
        "method": result.config.method,
        "new_tokens": st.new_tokens,
        "engine_time_s": result.wall_time_s,
        "tokens_per_s": st.tokens_per_s,
        "steps": steps,
        "target_forwards": steps + 1,
        "mean_accepted_length": st.mean_accepted_length,
        "accepted_per_step": st.accepted_tokens / steps if steps else 0.0,
        "acceptance_rate": st.acceptance_rate,
        "draft_tokens": st.draft_tokens,
        "accepted_tokens": st.accepted_tokens,
        "relaxed_tokens": st.relaxed_tokens,
        "accept_length_hist": list(st.accept_length_hist),
        "steps_by_source": dict(st.steps_by_source),
        "retrieval_hit_rate": (sum(1 for s in retrieval_steps if s.num_accepted > 0) / len(retrieval_steps)
                               if retrieval_steps else None),
        "trigger_rate": (sum(1 for d in decisions if d.fired) / steps if decisions and steps else None),
        "draft_ms_per_step": st.draft_ms / steps if steps else 0.0,
        "verify_ms_per_step": st.verify_ms / steps if steps else 0.0,
        "prefill_ms": result.prefill_ms,
        "decode_tokens_per_s": anatomy_view.decode_tokens_per_s(result),
        "stop_reason": result.stop_reason,
        "seed": result.config.sampling.seed,
        **anatomy_view.depth_metrics(result),
        "anatomy": anatomy_view.anatomy_metrics(result, vanilla),
    }
    if vanilla is not None and vanilla.stats.tokens_per_s > 0:
        out["speedup"] = st.tokens_per_s / vanilla.stats.tokens_per_s
        out["speedup_kind"] = "measured"
    else:
        out["speedup"] = estimated_speedup(result)
        out["speedup_kind"] = "estimated"
    van_decode = anatomy_view.decode_tokens_per_s(vanilla) if vanilla is not None else None
    out["decode_speedup"] = (out["decode_tokens_per_s"] / van_decode
                             if van_decode and out["decode_tokens_per_s"] is not None else None)
    return out


def estimated_speedup(result: GenerationResult) -> float | None:
    """Speedup without a vanilla run: new tokens × t_1 / engine time, where t_1, the cost of one
    plain decode step, is the smaller of the target's measured one-token forward (meta
    "verify_cost_ms", when recorded) and the run's 10th-percentile verify time (a verify forward
    covers at least one token, so it bounds t_1 from above; the minimum guards against a cost curve
    measured while the machine was busy)."""
    times = sorted(s.verify_ms for s in result.steps)
    if result.wall_time_s <= 0 or not result.tokens or not times:
        return None
    t1 = times[int(0.1 * (len(times) - 1))]
    curve = (result.meta or {}).get("verify_cost_ms") or {}
    measured = curve.get("1") if isinstance(curve, Mapping) else None
    if isinstance(measured, (int, float)) and 0 < measured < t1:
        t1 = measured
    return len(result.tokens) * t1 / 1000.0 / result.wall_time_s


def _fmt(value: Any, digits: int = 2) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return "–" if math.isnan(value) else f"{value:.{digits}f}"
    return str(value)


def metrics_rows(runs: Sequence[tuple[str, GenerationResult]], vanilla: GenerationResult | None = None,
                 metrics: Sequence[dict[str, Any]] | None = None) -> tuple[list[str], list[list[str]]]:
    """(headers, rows) of the side-by-side metrics table; one column per run. `metrics[k]`, when
    given, is runs[k]'s `run_metrics` against `vanilla` (computed by the caller, once per update)."""
    ms = list(metrics) if metrics is not None else [run_metrics(r, vanilla) for _, r in runs]
    headers = ["metric"] + [label for label, _ in runs]

    def speed(m):
        if m["speedup"] is None:
            return "–"
        return f"{m['speedup']:.2f}×" if m["speedup_kind"] == "measured" else f"≈{m['speedup']:.2f}× (est.)"

    def by_source(m):
        return ", ".join(f"{k} {v}" for k, v in sorted(m["steps_by_source"].items())) or "–"

    table = [
        ("tokens/s", lambda m: _fmt(m["tokens_per_s"], 1)),
        ("speedup vs vanilla", speed),
        ("decode-only tokens/s", lambda m: _fmt(m["decode_tokens_per_s"], 1)),
        ("decode-only speedup", lambda m: "–" if m["decode_speedup"] is None else f"{m['decode_speedup']:.2f}×"),
        ("target forwards", lambda m: f"{m['target_forwards']} for {m['new_tokens']} tokens"),
        ("mean accepted length", lambda m: _fmt(m["mean_accepted_length"])),
        ("accepted per step", lambda m: _fmt(m["accepted_per_step"])),
        ("acceptance rate", lambda m: _fmt(m["acceptance_rate"])),
        ("relaxed tokens", lambda m: str(m["relaxed_tokens"])),
        ("steps by source", by_source),
        ("retrieval hit rate", lambda m: _fmt(m["retrieval_hit_rate"])),
        ("trigger rate", lambda m: _fmt(m["trigger_rate"])),
        ("draft ms / step", lambda m: _fmt(m["draft_ms_per_step"], 1)),
        ("verify ms / step", lambda m: _fmt(m["verify_ms_per_step"], 1)),
        ("prefill ms", lambda m: _fmt(m["prefill_ms"], 0)),
        ("accepted by draft depth", lambda m: " · ".join(f"{d}: {_fmt(r)}" for d, r in
                                                          enumerate(m["accept_at_depth"][:4], 1)) or "–"),
        ("speedup anatomy", lambda m: "–" if not m["anatomy"] else
         f"{m['anatomy']['tokens_per_forward']:.2f} tokens/forward ÷ {m['anatomy']['step_cost']:.2f} "
         f"step cost = {m['anatomy']['speedup']:.2f}×"),
    ]
    rows = [[name] + [fn(m) for m in ms] for name, fn in table]
    return headers, rows


def metrics_html(runs: Sequence[tuple[str, GenerationResult]], vanilla: GenerationResult | None = None,
                 note: str = "", metrics: Sequence[dict[str, Any]] | None = None) -> str:
    """The metrics table as HTML; hovering a metric name shows its definition. `metrics` as in
    `metrics_rows`."""
    if not runs:
        return "<div class='respec-metrics'><em>No run yet.</em></div>"
    headers, rows = metrics_rows(runs, vanilla, metrics)
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        name = row[0]
        tip = html.escape(METRICS.get(name, ""), quote=True)
        cells = "".join(f"<td>{html.escape(c)}</td>" for c in row[1:])
        body.append(f"<tr><th title=\"{tip}\">{html.escape(name)} <span class='tip'>ⓘ</span></th>{cells}</tr>")
    foot = f"<div class='note'>{html.escape(note)}</div>" if note else ""
    return (f"<div class='respec-metrics'><table><thead><tr>{head}</tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>{foot}</div>")


def live_line(result: GenerationResult) -> str:
    """One-line running summary under an output while it streams."""
    st = result.stats
    return (f"{st.new_tokens} tokens · {st.steps} steps · {st.tokens_per_s:.1f} tok/s · "
            f"mean accepted length {st.mean_accepted_length:.2f}")


# ------------------------------------------------------------------------------- diff
def aligned_diff(a: Sequence[int], b: Sequence[int], decoder_a, decoder_b=None
                 ) -> tuple[bool, int | None, list[tuple[str, str | None]]]:
    """Token-level diff of two outputs: (identical, first differing index, spans). Spans are the
    common text unlabelled, and differing runs labelled "only in A" / "only in B"."""
    decoder_b = decoder_b or decoder_a
    a, b = list(a), list(b)
    first = first_difference(a, b)
    if first is None:
        return True, None, [(visible("".join(decoder_a.pieces(a))), None)]
    pa, pb = decoder_a.pieces(a), decoder_b.pieces(b)
    spans: list[tuple[str, str | None]] = []
    for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if op == "equal":
            spans.append((visible("".join(pa[i1:i2])), None))
            continue
        if i2 > i1:
            spans.append((visible("".join(pa[i1:i2])), "only in A"))
        if j2 > j1:
            spans.append((visible("".join(pb[j1:j2])), "only in B"))
    return False, first, spans


def badge_html(identical: bool, first: int | None, label_a: str, label_b: str, n_a: int, n_b: int,
               vanilla_note: str = "") -> str:
    if identical:
        body = f"✔ identical outputs — {label_a} and {label_b} wrote the same {n_a} tokens"
        cls = "same"
    else:
        body = (f"✘ outputs differ from token {first} — A = {label_a} ({n_a} tokens), "
                f"B = {label_b} ({n_b} tokens); diff below")
        cls = "differ"
    extra = f" <span class='vanilla'>{html.escape(vanilla_note)}</span>" if vanilla_note else ""
    return f"<div class='respec-badge {cls}'>{html.escape(body)}{extra}</div>"


# ------------------------------------------------------------------------------- step explorer
def step_events(result: GenerationResult) -> dict[str, list[int]]:
    """Steps worth jumping to: full rejections (drafted, nothing accepted), retrieval steps,
    relaxed acceptances, entropy-trigger firings."""
    ev: dict[str, list[int]] = {"rejection": [], "retrieval": [], "relaxed": [], "trigger": []}
    for s in result.steps:
        if s.num_draft > 0 and s.num_accepted == 0:
            ev["rejection"].append(s.step)
        if s.source == "retrieval":
            ev["retrieval"].append(s.step)
        if s.verdict.num_relaxed > 0:
            ev["relaxed"].append(s.step)
        if s.decision is not None and s.decision.fired:
            ev["trigger"].append(s.step)
    return ev


def next_event(steps: Sequence[int], current: int) -> int | None:
    """The first listed step after `current`, wrapping around; None if there is none."""
    if not steps:
        return None
    later = [s for s in steps if s > current]
    return later[0] if later else steps[0]


def node_rows(step: StepTrace, decoder) -> tuple[list[str], list[list[Any]]]:
    """Per-node verification outcome: (headers, rows)."""
    tree, v = step.tree, step.verdict
    depths = tree.depths()
    on_path = {n: i for i, n in enumerate(v.path)}
    headers = ["node", "depth", "parent", "token", "source", "outcome", "score", "draft q", "target H (nats)"]
    rows = []
    for i in range(tree.size):
        score = tree.scores[i] if tree.scores is not None else None
        q = tree.draft_probs[i] if tree.draft_probs is not None else None
        h = step.entropies[on_path[i]] if i in on_path and on_path[i] < len(step.entropies) else None
        rows.append([i, depths[i], tree.parents[i], repr(decoder.piece(tree.tokens[i])), tree.sources[i],
                     v.node_status[i], _round(score), _round(q), _round(h)])
    rows.append(["→", depths[v.path[-1]] + 1, v.path[-1], repr(decoder.piece(v.next_token)), "target",
                 v.next_kind, None, None, None])
    return headers, rows


_CANDIDATE_ORDER = ("end_pos", "match_len", "inherited_from", "score_before", "score_after", "draft_len",
                    "proposed", "accepted", "tokens", "draft")


def candidate_rows(step: StepTrace, decoder) -> tuple[list[str], list[list[Any]]]:
    """Retrieval candidates of a step, with whatever fields the drafter recorded (ReSpec: position,
    match length, EMA score before/after, tokens drafted and accepted)."""
    if not step.candidates:
        return ["candidates"], []
    keys: list[str] = [k for k in _CANDIDATE_ORDER if any(k in c for c in step.candidates)]
    for c in step.candidates:
        keys.extend(k for k in c if k not in keys)
    rows = []
    for c in step.candidates:
        row = []
        for k in keys:
            v = c.get(k)
            if k == "origin":                  # ReSpec's cross-request memory tags its positions
                v = "an earlier answer" if v == "memory" else "this request"
            elif isinstance(v, (list, tuple)) and all(isinstance(t, int) for t in v):
                v = "".join(decoder.piece(t) for t in v) if k in ("tokens", "draft", "proposed_tokens") else str(list(v))
            elif isinstance(v, float):
                v = _round(v)
            elif isinstance(v, (dict, list, tuple)):
                v = str(v)
            row.append(v)
        rows.append(row)
    return keys, rows


def _round(x: Any, digits: int = 3) -> Any:
    if isinstance(x, float):
        return None if math.isnan(x) else round(x, digits)
    return x


def decision_md(step: StepTrace) -> str:
    d = step.decision
    if d is None:
        return f"**Decision:** {step.source} (no decision record)"
    parts = [f"**Decision:** {html.escape(d.reason)}"]
    facts = [f"source **{d.source}**", f"match length {d.match_len}"]
    if d.fired is not None:
        facts.append(f"trigger {'fired' if d.fired else 'did not fire'}")
    if d.k_star is not None:
        facts.append(f"k* = {d.k_star}")
    if d.mean_entropy is not None:
        facts.append(f"H̄ = {d.mean_entropy:.3f}")
    if d.window:
        facts.append("window [" + ", ".join(f"{x:.2f}" for x in d.window) + "]")
    cost_line = cost_md(step)
    for k, v in (d.extra or {}).items():
        if k == "cost" and cost_line:
            continue
        if isinstance(v, (list, tuple)):
            v = "[" + ", ".join(f"{x:.2f}" if isinstance(x, float) else str(x) for x in v) + "]"
        elif isinstance(v, Mapping):
            v = "{" + ", ".join(f"{kk}: {_round(vv) if isinstance(vv, float) else vv}" for kk, vv in v.items()
                                if not (kk == "reason" and isinstance(vv, str) and vv in d.reason)) + "}"
        elif isinstance(v, float):
            v = _round(v)
        facts.append(f"{k} {v}")
    return parts[0] + "  \n" + " · ".join(facts) + (f"  \n{cost_line}" if cost_line else "")


def cost_md(step: StepTrace) -> str:
    """The cost model's prediction for this step next to what happened (respec/cost.py): why a
    draft was cut, or why the step did not draft at all. Empty when the step had no plan."""
    c = (step.decision.extra or {}).get("cost") if step.decision is not None else None
    if not isinstance(c, Mapping) or "kept" not in c:
        return ""
    got = (f"**outcome** {len(step.new_tokens)} token(s) in {step.draft_ms + step.verify_ms:.1f} ms "
           f"(draft {step.draft_ms:.1f} + verify {step.verify_ms:.1f})")
    if "expected_tokens" not in c:
        return f"**Cost model:** no draft this step ({html.escape(str(c.get('reason', '')))}) · {got}"
    offered = f" of {int(c['of']) - 1}" if "of" in c else ""
    return (f"**Cost model:** kept {int(c['kept']) - 1}{offered} draft node(s); **predicted** "
            f"{float(c['expected_tokens']):.2f} token(s) for {float(c.get('cost_ms', 0.0)):.1f} ms "
            f"({float(c.get('rate_vs_plain', 1.0)):.2f}x a plain step) · {got}")


def narrate(result: GenerationResult, index: int, decoder) -> str:
    """Teaching mode: one step in plain words (UX.md §4.10)."""
    s = result.steps[index]
    cfg = result.config
    roots = step_roots(result)
    lines = [f"**Step {s.step}** (target forward {s.step + 1} of {len(result.steps)}; "
             f"root = {decoder.piece(s.tree.tokens[0])!r}, generated token #{roots[index]})."]
    d = s.decision
    # 1. When: the entropy trigger (ReSpec) or the match rule (SAM).
    if d is not None and d.fired is not None:
        theta = cfg.trigger.theta_entropy
        if d.mean_entropy is not None:
            cmp = "≤" if d.mean_entropy <= theta else ">"
            lines.append(f"The target's recent entropy H̄ over the last {d.k_star or '?'} token(s) was "
                         f"{d.mean_entropy:.2f} {cmp} θ_H = {theta:.2f} → "
                         f"{'look for earlier text to copy' if d.fired else 'no retrieval; let EAGLE-2 draft'}.")
        else:
            lines.append(f"Entropy trigger {'fired' if d.fired else 'did not fire'}.")
    if d is not None:
        lines.append(f"Decision: {d.reason}.")
    # 2. What: candidates.
    if s.candidates:
        scores = [c.get("score_before") for c in s.candidates if isinstance(c.get("score_before"), (int, float))]
        best = f"; the best had score {max(scores):.2f}" if scores else ""
        lines.append(f"{len(s.candidates)} candidate position(s){best}.")
    # 3. Draft and verify.
    by_src: dict[str, int] = {}
    for src in s.tree.sources[1:]:
        by_src[src] = by_src.get(src, 0) + 1
    drafted = ", ".join(f"{n} {('EAGLE-2' if k == 'eagle' else k)}" for k, n in by_src.items()) or "nothing"
    lines.append(f"Drafted {s.num_draft} token(s) ({drafted}) in {s.draft_ms:.1f} ms; the target checked them "
                 f"all in one forward ({s.verify_ms:.1f} ms).")
    curve = anatomy_view.recorded_curve([("", result)])
    cost = anatomy_view.plain_steps(curve, len(s.tree.tokens)) if s.num_draft else None
    if cost is not None:
        lines.append(f"On this machine a {len(s.tree.tokens)}-token tree costs {cost:.2f} plain steps (the "
                     f"verify-cost curve measured at load), so this step pays if it commits more than {cost:.2f} "
                     "tokens.")
    acc = [decoder.piece(s.tree.tokens[n]) for n in s.verdict.path[1:]]
    if acc:
        rel = f", {s.verdict.num_relaxed} by the relaxed rule" if s.verdict.num_relaxed else ""
        lines.append(f"Accepted {len(acc)} of {s.num_draft}{rel}: " + " ".join(repr(t) for t in acc) + ".")
    elif s.num_draft:
        lines.append(f"Accepted none of the {s.num_draft} drafts.")
    lines.append(f"Then the target added its own token {decoder.piece(s.verdict.next_token)!r} "
                 f"({s.verdict.next_kind}) → this step committed {len(s.new_tokens)} token(s).")
    hold = anatomy_view.holds_sentence(result)
    if hold:
        lines.append(f"Over the whole run, {hold}.")
    return "  \n".join(html.escape(x, quote=False) if "**" not in x else x for x in lines)


def step_summary(result: GenerationResult, index: int, decoder) -> str:
    """Compact one-line description of a step (when teaching mode is off)."""
    s = result.steps[index]
    rel = f" ({s.verdict.num_relaxed} relaxed)" if s.verdict.num_relaxed else ""
    src = {"eagle": "EAGLE-2 tree", "retrieval": "retrieval", "none": "no draft"}.get(s.source, s.source)
    return (f"**Step {s.step} / {len(result.steps) - 1}** · {src} · drafted {s.num_draft} · accepted "
            f"{s.num_accepted}{rel} · {s.verdict.next_kind} {html.escape(repr(decoder.piece(s.verdict.next_token)))} · "
            f"draft {s.draft_ms:.1f} ms · verify {s.verify_ms:.1f} ms")


def step_spans(result: GenerationResult, index: int, decoder) -> list[tuple[str, str | None]]:
    """The output with the chosen step's committed tokens labelled and the rest plain."""
    pieces = decoder.pieces(result.tokens)
    labels = token_labels(result)
    roots = step_roots(result)
    if not result.steps:
        return [(visible("".join(pieces)), None)]
    r = roots[index]
    lo, hi = r + 1, r + len(result.steps[index].new_tokens)
    out: list[tuple[str, str | None]] = [(visible("".join(pieces[:lo])), None)] if lo > 0 else []
    out.extend((visible(p), labels[i]) for i, p in enumerate(pieces[lo:hi + 1], start=lo))
    if hi + 1 < len(pieces):
        out.append((visible("".join(pieces[hi + 1:])), None))
    return out


def trace_header(result: GenerationResult) -> dict:
    """What a trace file records besides the steps (for the Trace tab's JSON view)."""
    meta = {k: v for k, v in (result.meta or {}).items() if k != "display"}
    return {"meta": meta, "config": result.config.to_dict(), "stats": result.stats.to_dict(),
            "prompt_tokens": len(result.prompt_tokens), "tokens": len(result.tokens),
            "stop_reason": result.stop_reason, "text": result.text}


def colors() -> dict[str, str]:
    return {k: COLORS[k] for k in LEGEND}
