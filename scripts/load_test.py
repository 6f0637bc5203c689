"""Bounded load test of the app's `/compare` API (loopback only, fixed request count, hard time limit).

    .venv/bin/python scripts/load_test.py [--clients 8] [--requests-per-client 3] [--max-new-tokens 16]
                                          [--timeout 1200] [--out load-test.json]

1. Starts `python app.py` as a server process on 127.0.0.1 (a free port; the default model unless
   RESPEC_MODEL says otherwise) and waits until it answers.
2. Warms it up: one request (the model loads), then the warm-up rounds; then records the server's
   resident memory: the baseline.
3. `--clients` gradio_client clients run at once, each sending `--requests-per-client` `/compare`
   requests one after another, every request with its own prompt and settings (seed, θ_H,
   max_new_tokens, include_vanilla), while a sampler records the server's memory. The same load
   runs `--warmup-rounds` times first, unmeasured: the baseline is the memory of a server that
   has already seen this load, so growth in the measured round is what a leak would add. Gradio
   keeps state per session (every gradio_client client is one); the server's RESPEC_MAX_SESSIONS
   is set to --max-sessions (default: the number of clients), so the warm-up fills that budget
   and the measured round shows whether memory stays bounded once sessions are evicted.
4. Checks, and prints one line per request plus a summary:
   - every request completed, without an error;
   - every response belongs to its own request (no crossed traces): both traces record that
     request's prompt and settings, their prompt tokens are the same, and no response exceeds its
     own max_new_tokens;
   - the queue is fair: the server runs one /compare at a time (concurrency 1), so a request never
     finishes after a request that was submitted more than `--fifo-slack` seconds later;
   - memory returns to its baseline: the server's memory after the load (once idle) is within
     `--memory-slack-mb` of the baseline.
   Exit status 0 when every check holds, 1 otherwise. The JSON report goes to --out.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))           # `python scripts/load_test.py` from anywhere imports respec

TOPICS = ["the planets of the solar system", "the days of the week", "three primary colors", "the seasons",
          "the continents", "five fruits", "the first ten prime numbers", "the months of the year",
          "four musical instruments", "the noble gases", "six programming languages", "the oceans"]


@dataclass
class Request:
    client: int
    index: int
    prompt: str
    settings: dict
    submitted: float = 0.0
    finished: float = 0.0
    error: str | None = None
    respec_tokens: int = 0
    eagle_tokens: int = 0
    problems: list[str] = field(default_factory=list)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss_mb(pid: int) -> float:
    import psutil
    return psutil.Process(pid).memory_info().rss / 2**20


def make_requests(clients: int, per_client: int, max_new_tokens: int) -> list[list[Request]]:
    out = []
    for c in range(clients):
        row = []
        for i in range(per_client):
            n = c * per_client + i
            prompt = f"Request {n}: list {TOPICS[n % len(TOPICS)]}, then list them again."
            settings = {"seed": 1000 + n, "theta_H": round(1.0 + 0.1 * n, 2),
                        "max_new_tokens": max_new_tokens - (n % 4), "include_vanilla": n % 3 == 0}
            row.append(Request(client=c, index=i, prompt=prompt, settings=settings))
        out.append(row)
    return out


def check_response(req: Request, response) -> None:
    from respec.trace import result_from_json
    a_text, b_text, a_json, b_json, metrics = response
    ra, rb = result_from_json(a_json), result_from_json(b_json)
    req.respec_tokens, req.eagle_tokens = len(ra.tokens), len(rb.tokens)
    for name, r, text in (("respec", ra, a_text), ("eagle", rb, b_text)):
        if r.meta.get("prompt") != req.prompt:
            req.problems.append(f"{name} trace records another prompt: {r.meta.get('prompt')!r}")
        if r.config.sampling.seed != req.settings["seed"]:
            req.problems.append(f"{name} trace has seed {r.config.sampling.seed}")
        if r.config.trigger.theta_entropy != req.settings["theta_H"]:
            req.problems.append(f"{name} trace has theta_H {r.config.trigger.theta_entropy}")
        if r.config.max_new_tokens != req.settings["max_new_tokens"] or len(r.tokens) > req.settings["max_new_tokens"]:
            req.problems.append(f"{name} trace has max_new_tokens {r.config.max_new_tokens}, {len(r.tokens)} tokens")
        if r.text != text:
            req.problems.append(f"{name} text differs from its trace's text")
    if ra.prompt_tokens != rb.prompt_tokens:
        req.problems.append("the two traces encode different prompts")
    m = json.loads(metrics)
    if ("vanilla" in m) != bool(req.settings["include_vanilla"]):
        req.problems.append("vanilla column does not match include_vanilla")


def run_client(url: str, rows: list[Request], timeout: float) -> None:
    from gradio_client import Client
    client = Client(url, verbose=False)
    for req in rows:
        req.submitted = time.perf_counter()
        try:
            job = client.submit(req.prompt, json.dumps(req.settings), api_name="/compare")
            response = job.result(timeout=timeout)
            req.finished = time.perf_counter()
            check_response(req, response)
        except Exception as exc:  # noqa: BLE001 - every failure is a finding, reported per request
            req.finished = time.perf_counter()
            req.error = f"{type(exc).__name__}: {exc}"[:300]


def run_round(url: str, rows: list[list[Request]], deadline: float) -> list[threading.Thread]:
    """One client thread per row, all at once, joined by the deadline; returns those still running."""
    remaining = max(10.0, deadline - time.monotonic())
    threads = [threading.Thread(target=run_client, args=(url, row, remaining), daemon=True) for row in rows]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=max(1.0, deadline - time.monotonic()))
    return [t for t in threads if t.is_alive()]


def fifo_violations(reqs: list[Request], slack: float) -> list[str]:
    """Pairs where a request finished after one submitted more than `slack` seconds later."""
    bad = []
    for a in reqs:
        for b in reqs:
            if b.submitted - a.submitted > slack and a.finished > b.finished:
                bad.append(f"c{a.client}r{a.index} (submitted {a.submitted:.2f}) finished after "
                           f"c{b.client}r{b.index} (submitted {b.submitted:.2f})")
    return bad


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--requests-per-client", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=16)
    ap.add_argument("--timeout", type=float, default=1200, help="seconds for the whole load (hard limit)")
    ap.add_argument("--fifo-slack", type=float, default=1.0)
    ap.add_argument("--memory-slack-mb", type=float, default=25.0)
    ap.add_argument("--warmup-rounds", type=int, default=2, help="unmeasured rounds of the same load first")
    ap.add_argument("--max-sessions", type=int, default=None,
                    help="the server's RESPEC_MAX_SESSIONS (default: --clients, so the warm-up fills it)")
    ap.add_argument("--out", default="load-test.json")
    return ap


def start_server(args: argparse.Namespace, port: int, log) -> subprocess.Popen:
    """Step 1: `python app.py` on 127.0.0.1:`port`, its output into `log`."""
    env = dict(os.environ, GRADIO_SERVER_NAME="127.0.0.1", GRADIO_SERVER_PORT=str(port),
               GRADIO_ANALYTICS_ENABLED="False", RESPEC_QUEUE_SIZE=str(max(16, 2 * args.clients)),
               RESPEC_TIME_LIMIT=str(int(args.timeout)), RESPEC_MAX_SESSIONS=str(args.max_sessions))
    return subprocess.Popen([sys.executable, str(ROOT / "app.py")], cwd=ROOT, env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def wait_until_up(server: subprocess.Popen, url: str, deadline: float, log_name: str) -> None:
    """Poll `url` until it answers 200; SystemExit when the server exits or the deadline passes."""
    import httpx
    while True:
        if server.poll() is not None:
            raise SystemExit(f"the server exited with status {server.returncode}; see {log_name}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit("the server did not start in time")
        time.sleep(0.5)


def warm_up(url: str, server: subprocess.Popen, args: argparse.Namespace, deadline: float, report: dict) -> float:
    """Step 2: the model loads, then (--warmup-rounds) the same load pattern runs unmeasured, so allocator pools
    and per-size caches are filled before the baseline. Returns the baseline memory (MB)."""
    from gradio_client import Client
    t0 = time.perf_counter()
    Client(url, verbose=False).predict("Warm up: say hello.", json.dumps({"max_new_tokens": 4}), api_name="/compare")
    report["model_load_s"] = round(time.perf_counter() - t0, 2)
    report["memory_after_model_load_mb"] = round(rss_mb(server.pid), 1)
    for _ in range(args.warmup_rounds):
        warm = make_requests(args.clients, args.requests_per_client, args.max_new_tokens)
        run_round(url, warm, deadline)
        report.setdefault("memory_after_warmup_rounds_mb", []).append(round(rss_mb(server.pid), 1))
        if any(r.error for row in warm for r in row):
            raise SystemExit("the warm-up round had errors: " + "; ".join(
                r.error for row in warm for r in row if r.error))
    report["warmup_rounds"] = args.warmup_rounds
    time.sleep(2)
    return rss_mb(server.pid)


@dataclass
class Round:
    """What the measured round left: its requests (times relative to its start), the clients still running,
    its wall time and the server's memory (peak during, after once idle)."""
    requests: list[Request]
    alive: list
    wall_s: float
    peak_mb: float
    after_mb: float


def measured_round(url: str, server: subprocess.Popen, args: argparse.Namespace, deadline: float,
                   baseline: float) -> Round:
    """Step 3: the load, while a sampler records the server's memory."""
    rows = make_requests(args.clients, args.requests_per_client, args.max_new_tokens)
    peak = [baseline]
    stop = threading.Event()

    def sample():
        while not stop.wait(0.2):
            peak.append(rss_mb(server.pid))
    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    alive = run_round(url, rows, deadline)
    wall = time.perf_counter() - start
    stop.set()
    sampler.join()
    time.sleep(3)
    after = rss_mb(server.pid)
    reqs = [r for row in rows for r in row]
    for r in reqs:
        r.submitted -= start
        r.finished -= start
    return Round(reqs, alive, wall, max(peak), after)


def check(measured: Round, baseline: float, args: argparse.Namespace) -> dict:
    """Step 4: the report fields and `ok` for the measured round."""
    reqs = measured.requests
    errors = [f"c{r.client}r{r.index}: {r.error}" for r in reqs if r.error]
    crossed = [f"c{r.client}r{r.index}: {p}" for r in reqs for p in r.problems]
    fifo = fifo_violations([r for r in reqs if not r.error], args.fifo_slack)
    latencies = sorted(r.finished - r.submitted for r in reqs if not r.error)
    wall, after = measured.wall_s, measured.after_mb
    fields = {
        "completed": sum(1 for r in reqs if not r.error and r.finished), "requests": len(reqs),
        "errors": errors, "crossed": crossed, "fifo_violations": fifo, "unfinished_clients": len(measured.alive),
        "wall_s": round(wall, 2), "requests_per_minute": round(60 * len(reqs) / wall, 2),
        "latency_s": {"min": round(latencies[0], 2), "median": round(latencies[len(latencies) // 2], 2),
                      "max": round(latencies[-1], 2)} if latencies else None,
        "memory_mb": {"baseline": round(baseline, 1), "peak": round(measured.peak_mb, 1), "after": round(after, 1),
                      "growth": round(after - baseline, 1)},
        "requests_detail": [asdict(r) for r in reqs]}
    fields["ok"] = (not errors and not crossed and not fifo and not measured.alive and fields["completed"] == len(reqs)
                    and after - baseline <= args.memory_slack_mb)
    return fields


def print_summary(report: dict, reqs: list[Request], args: argparse.Namespace) -> None:
    """One line per request (in submission order), then the totals, the checks and the memory."""
    for r in sorted(reqs, key=lambda r: r.submitted):
        print(f"c{r.client} r{r.index}  submitted {r.submitted:7.2f} s  finished {r.finished:7.2f} s  "
              f"respec {r.respec_tokens:3d} tok  eagle {r.eagle_tokens:3d} tok  "
              + ("ERROR " + r.error if r.error else "ok" if not r.problems else "CROSSED " + "; ".join(r.problems)))
    mem = report["memory_mb"]
    lat = report["latency_s"] or {}
    print(f"\n{report['completed']}/{report['requests']} requests completed by {args.clients} clients x "
          f"{args.requests_per_client} in {report['wall_s']} s ({report['requests_per_minute']} requests/min); "
          f"latency min/median/max {lat.get('min')}/{lat.get('median')}/{lat.get('max')} s")
    print(f"errors: {len(report['errors'])}; crossed responses: {len(report['crossed'])}; FIFO violations "
          f"(> {args.fifo_slack} s): {len(report['fifo_violations'])}; unfinished clients: {report['unfinished_clients']}")
    print(f"server memory: baseline {mem['baseline']} MB (after warm-up), peak {mem['peak']} MB, "
          f"after the load {mem['after']} MB (growth {mem['growth']:+.1f} MB, allowed {args.memory_slack_mb:.0f})")
    print("PASS" if report["ok"] else "FAIL", f"(report: {args.out})")


def main(argv=None) -> int:
    ap = build_parser()
    args = ap.parse_args(argv)
    args.max_sessions = args.max_sessions or args.clients
    if not (1 <= args.clients <= 64 and 1 <= args.requests_per_client <= 20 and 4 <= args.max_new_tokens <= 256):
        ap.error("bounds: 1-64 clients, 1-20 requests each, 4-256 new tokens")

    # 1. the server
    port = free_port()
    url = f"http://127.0.0.1:{port}/"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    log = open(Path(args.out).with_suffix(".server.log"), "w")
    server = start_server(args, port, log)
    deadline = time.monotonic() + args.timeout
    report: dict = {"clients": args.clients, "requests_per_client": args.requests_per_client,
                    "max_new_tokens": args.max_new_tokens, "python": sys.executable}
    try:
        wait_until_up(server, url, deadline, log.name)
        # 2. warm-up and baseline
        baseline = warm_up(url, server, args, deadline, report)
        # 3. the load
        measured = measured_round(url, server, args, deadline, baseline)
        # 4. checks
        report.update(check(measured, baseline, args))
    finally:
        server.terminate()
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()

    Path(args.out).write_text(json.dumps(report, indent=1))
    print_summary(report, measured.requests, args)
    return 0 if report["ok"] else 1

if __name__ == "__main__":
    sys.exit(main())
