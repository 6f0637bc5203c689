"""Record the traces shipped in assets/traces/ (the page opens the first one on start).

Usage: python -m app.events.record_traces [--model default] [--max-new-tokens 64] [--only NAME]

Each prompt below is run with ReSpec and with EAGLE-2, through the same code path as the page
(app.events.runs.stream_run), and written as `<name>__respec.json` and `<name>__eagle.json` with the text
table embedded, so replay needs neither the model nor its tokenizer. Re-run it after the engine or
the EAGLE head changes.
"""
from __future__ import annotations

import argparse
import os
import sys

from app.events.runs import finish_run, plan_methods, stream_run
from app.session.hub import ModelHub
from app.session.settings import Caps, build_config, method_label
from app.session.traces import TRACES_DIR
from app.views.decoders import TokenizerDecoder
from respec.trace import write_trace

PROMPTS = {
    "days-of-the-week": "List the days of the week, one per line. Then list them again, each followed by the word \"again\".",
    "eiffel-tower-rag": ("Context: The Eiffel Tower is a wrought-iron lattice tower in Paris. It was built from 1887 "
                         "to 1889 as the entrance arch of the 1889 World's Fair. Question: When and why was the Eiffel "
                         "Tower built? Quote the context in your answer."),
    "palindrome-code": ("Write a Python function is_palindrome(s) that ignores case and spaces, then write three "
                        "assert tests that call is_palindrome."),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--only", default=None, help="record only this prompt name")
    args = ap.parse_args(argv)
    hub = ModelHub(args.model)
    runner = hub.runner()
    caps = Caps.from_env()
    os.makedirs(TRACES_DIR, exist_ok=True)
    for name, prompt in PROMPTS.items():
        if args.only and name != args.only:
            continue
        for key, method in plan_methods(False):
            config = build_config({"max_new_tokens": args.max_new_tokens}, method, hub.device(), caps)
            decoder = TokenizerDecoder(runner.tokenizer)
            for result, done in stream_run(runner, prompt, config):
                if done:
                    run = finish_run(result, decoder)
                    path = TRACES_DIR / f"{name}__{key}.json"
                    write_trace(run.result, path)
                    st = run.result.stats
                    print(f"{path.relative_to(TRACES_DIR.parent.parent)}: {method_label(method)}, {st.new_tokens} tokens, "
                          f"{st.steps} steps, MAT {st.mean_accepted_length:.2f}, {st.steps_by_source}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
