"""Compare two bench folders (`respec bench --out A`, then `--out B` with one setting changed, e.g.
`--compile off` then `on`): per Spec-Bench category and method, mean tokens/s in each, their ratio
B / A (Spec-Bench's ratio of means) and the ratio at equal length (each question and repeat timed
at the length both outputs reach: bf16 runs whose outputs end at different lengths otherwise spread
one prompt's prefill over different token counts; respec.lab.report.compare_runs).

    .venv/bin/python scripts/compare_runs.py bench-out/eager bench-out/compiled
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # `python scripts/...` imports respec


def main() -> None:
    import pandas as pd

    from respec.lab.bench import RESULTS_FILE
    from respec.lab.report import compare_runs

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("before", type=Path, help="bench folder A (the reference)")
    ap.add_argument("after", type=Path, help="bench folder B")
    args = ap.parse_args()
    runs = []
    for folder in (args.before, args.after):
        path = folder / RESULTS_FILE
        if not path.is_file():
            sys.exit(f"error: {path} not found (a `respec bench --out` folder holds it)")
        runs.append(pd.read_json(path, lines=True))
    table = compare_runs(*runs)
    if table.empty:
        sys.exit("error: the two runs share no category and method")
    print(f"B = {args.after}, A = {args.before}\n")
    print("| category | method | A tok/s | B tok/s | B / A | B / A at equal length |")
    print("|---|---|---|---|---|---|")
    for r in table.itertuples():
        print(f"| {r.category} | {r.method} | {r.before_tokens_per_s:.1f} | {r.after_tokens_per_s:.1f} | "
              f"{r.ratio:.2f} | {r.ratio_same_length:.2f} |")


if __name__ == "__main__":
    main()
