"""The page's copy: titles, intro, legend colours, metric definitions, help and the API snippet.
Nothing here computes anything (the leaderboard template's `about.py`)."""
from __future__ import annotations

TITLE = "ReSpec Explorer"

INTRO = """\
# ReSpec Explorer
**Retrieval-enhanced speculative decoding, step by step.** One prompt, two decoders on the same model:
**ReSpec** (entropy-triggered retrieval, EMA-scored candidates, relaxed verification of retrieved drafts,
EAGLE-2 fallback) and **EAGLE-2** (a learned draft head and a dynamic tree). Watch who drafted each
token, scrub through every target forward, and tune every threshold.
"""

#: Okabe–Ito colour-blind-safe palette (UX.md §4.10).
COLORS = {
    "retrieval": "#0072B2",   # blue: accepted draft copied from earlier text
    "eagle": "#E69F00",       # orange: accepted draft from the EAGLE-2 head
    "target": "#009E73",      # green: the target's own token (bonus / recovered / first)
    "relaxed": "#CC79A7",     # pink: retrieved draft accepted by the relaxed rule
    "rejected": "#D55E00",    # vermillion: a draft the target rejected (shown on demand)
    "root": "#555555",
}
#: Labels of the output strips (HighlightedText categories) and what each means.
LEGEND = {
    "retrieval": "accepted retrieval draft (strict)",
    "relaxed": "accepted retrieval draft (relaxed rule)",
    "eagle": "accepted EAGLE-2 draft",
    "target": "target's own token (bonus / recovered / first)",
    "rejected": "rejected draft (not in the output)",
}
DIFF_COLORS = {"only in A": "#D55E00", "only in B": "#0072B2"}

LEGEND_MD = ("**Colours** — " + " · ".join(
    f"<span style='color:{COLORS[k]};font-weight:600'>■ {k}</span>: {v}" for k, v in LEGEND.items()))

#: Metric definitions (UX.md §3), shown as tooltips and in the About tab.
METRICS = {
    "tokens/s": "new tokens / engine time (prefill + all steps; page rendering excluded)",
    "speedup vs vanilla": "tokens/s of the method / tokens/s of vanilla measured in the same run; "
                          "≈ marks an estimate when vanilla was not run: new tokens × t₁ / engine time, with t₁ "
                          "the smaller of the target's measured one-token forward time and the run's "
                          "10th-percentile verify time",
    "decode-only tokens/s": "new tokens / (engine time − prefill): the speed with the prompt's forward left out, "
                            "which costs every method the same (seconds for a long prompt on a large model); "
                            "a draft head's catch-up on the prompt counts as decoding",
    "decode-only speedup": "decode-only tokens/s of the method / vanilla's in the same run (– without vanilla)",
    "target forwards": "steps (one target forward each) + 1 prefill",
    "mean accepted length": "tokens committed per target forward = 1 + accepted draft tokens / steps "
                            "(counts the bonus token; vanilla = 1.00; Spec-Bench MAT)",
    "accepted per step": "accepted draft tokens / steps (bonus excluded)",
    "acceptance rate": "accepted draft tokens / drafted tokens (all tree nodes)",
    "relaxed tokens": "retrieved tokens accepted by the relaxed rule (0 when lossless)",
    "steps by source": "how each step drafted: retrieval, EAGLE-2, or none (root only)",
    "retrieval hit rate": "retrieval steps with ≥ 1 accepted token / retrieval steps",
    "trigger rate": "steps where the entropy trigger fired / steps (ReSpec only)",
    "draft ms / step": "mean time to build the draft tree (retrieval lookup, EAGLE-2 head)",
    "verify ms / step": "mean time of the target forward over the tree plus verification",
    "prefill ms": "time of the prompt's forward pass",
    "accepted by draft depth": "of the draft tokens the target reached at depth d (their parent was accepted), "
                               "the share it accepted: where in a draft the target starts rejecting",
    "speedup anatomy": "speedup = tokens per target forward (prefill counted) ÷ a forward's cost in plain "
                       "forwards (this run's ms per forward / vanilla's): more accepted tokens can still mean "
                       "less speed when each forward costs more",
}

ABOUT_MD = """\
## What you are looking at
A **step** is one forward pass of the target model over a *draft tree*: the root is the token the
target chose last; the other nodes are guesses (drafts). The target checks every node in that one
forward; the longest branch that agrees with it is **accepted**, and the target adds one token of
its own (the **bonus**). So each step commits *accepted + 1* tokens.

* **EAGLE-2** drafts a tree with a small learned head that reads the target's hidden states.
* **ReSpec** looks back at the target's recent entropy: when the target has been confident
  (mean entropy H̄ ≤ θ_H), it copies continuations of earlier occurrences of the current suffix,
  ranked by an EMA score of how well each position drafted before, and merges them into a trie.
  Retrieved tokens may be accepted by a *relaxed* rule (top-β, within τ nats, confirmed by w exact
  matches after); EAGLE-2 drafts stay strict. When nothing qualifies it falls back to EAGLE-2.
* **SAM-Decoding** copies after the earliest match once the match is long enough.

With temperature 0 and a relaxed budget of 0 every method writes exactly what vanilla decoding
writes; only the speed differs. The badge under the outputs checks that.

## Metric definitions
""" + "\n".join(f"* **{k}** — {v}" for k, v in METRICS.items())

API_MD = """\
## Use it from Python
```python
from gradio_client import Client
client = Client("http://127.0.0.1:7860/")          # or "user/space-name"
respec_text, eagle_text, respec_trace, eagle_trace, metrics = client.predict(
    "List the planets of the solar system, then list them again.",
    '{"theta_H": 1.5, "max_new_tokens": 48}',        # "{}" = defaults
    api_name="/compare")
```
Both traces are the engine's versioned JSON (prompt, settings and seed inside): save one and load it
here under *Trace files*, or with `python -m respec replay`. `metrics` is JSON with one entry per
method. Settings accept dotted keys (`"tree.total_tokens": 12`), nested objects, the short names
θ_H → `theta_H`, `l`, `lambda_e`, `alpha`, `S0`, `theta_score`, `K`, `L_max`, `L_min`, `beta`,
`tau`, `w`, `budget`, `auto` (EAGLE-2 tree auto-pruning), plus `"include_vanilla": true` and
`"column_a"`: the method of the left column (`respec` by default; a ReSpec variant, `sam` or
`suffix`), always against EAGLE-2.
Defaults are the paper's thresholds with the engine's device defaults for tree sizes.
Out-of-range values come back as an error naming the setting and its range.

`/replay` checks a saved trace and summarises it without running the model:
```python
text, metrics = client.predict(open("respec-trace.json").read(), api_name="/replay")
```
A malformed trace (truncated, from a newer version, or inconsistent) comes back as an error that
says what is wrong.
"""

STEP_HELP = ("Pick a run and a step (one target forward). The tree shows every drafted node: colour = who "
             "drafted it, ring = verification outcome, size = EMA score (retrieval) or draft probability "
             "(EAGLE-2); the thick line is the accepted path, the green node the target's bonus token. "
             "Click a point of the entropy plot to jump to its step.")

STOPPED = "■ stopped."   # the status line after Stop (the Run stream and the Stop handler both write it)
EMPTY_HINT = "Type a prompt and press **Run**, or open a recorded trace under *Trace files*."

TUNING_MD = """\
## Tuning thresholds by hand
Every **Run** on the Compare tab adds a row to the **run history** under the outputs: the settings that
differ from the device defaults, and per method tokens/s, speedup (measured when vanilla ran, else
≈ estimated), mean accepted length (MAT), trigger rate, retrieval share, relaxed tokens and whether the
output equals vanilla's. The workflow: run once, **pin this run as A**, move one threshold, run again, and read
the deltas against A (speed, MAT, identical output or the first differing token, with the token diff);
**↺ restore A's settings** puts the sliders back. tokens/s moves by about ±10% from run to run on a
shared CPU, so use **repeat ×N**: the history keeps the median and the spread, and a delta against A
says whether it is within the spread. MAT, trigger rate and retrieval share do not depend on machine
noise: they are the better guide for thresholds that change *what* is drafted. The history is kept per
browser tab (RESPEC_MAX_HISTORY rows, default 50), survives switching tabs and replaying traces, plots
speed or MAT against the run number, and exports as CSV.

Through the API, each `/compare` call is recorded in the calling client's own history:
```python
client.predict("Name three colors.", '{"theta_H": 1.5}', api_name="/compare")
rows = json.loads(client.predict(api_name="/history"))["rows"]   # settings and metrics of each call
```
"""
