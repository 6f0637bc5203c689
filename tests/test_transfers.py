"""Host <-> device round trips of a decoding step (issue 30 §5) and the timing barriers (§8), on the CPU.

Every crossing of the engine goes through respec/transfer.py, which counts them; the CPU makes the
same calls a GPU would, so the counts here are the counts there. An EAGLE step at the CUDA device
defaults (60-node trees, depth 5, top-k 10, tree.auto with the depth cut) must make at most 12;
the search reads its layers back once per depth-cut question, never once per value. A static check
keeps direct reads (.tolist(), .item(), .cpu(), synchronize) and device uploads out of the step's
modules, so nothing bypasses the counter. Timing uses CUDA events on every device holding weights
(faked here), never a barrier."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import torch

from respec.config import EngineConfig, device_defaults
from respec.drafters.eagle2 import Eagle2Drafter
from respec.drafters.heads.eagle import random_head
from respec.engine import Engine
from respec.transfer import Stopwatch, counting
from tests.conftest import inject_costs, make_target

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [5, 17, 33, 9, 71, 4, 88, 12, 5, 17, 33, 9, 40, 41, 42, 43]
FLAT = {n: 1000.0 for n in (1, 2, 4, 8, 12, 16, 24, 32, 48, 60, 64)}   # any tree costs a plain step


def _counted_steps(engine: Engine, prompt) -> list:
    """(StepTrace, Transfers) of every step: the drafting, forward, verify and keep of each."""
    stream, out = engine.stream(prompt), []
    while True:
        with counting() as rec:
            try:
                trace = next(stream)
            except StopIteration:
                return out
        out.append((trace, rec))


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_an_eagle_step_at_cuda_defaults_makes_at_most_12_round_trips(arch, monkeypatch):
    target = make_target(arch, dtype=torch.float32)
    inject_costs(monkeypatch, target, FLAT, row_ms=0.01)        # decisions from given costs: the head drafts
    monkeypatch.setattr(Eagle2Drafter, "_probe_refusal", lambda self, cost: None)
    cfg = EngineConfig().with_overrides({**device_defaults("cuda"), "method": "eagle2", "max_new_tokens": 40})
    assert (cfg.tree.total_tokens, cfg.tree.depth, cfg.tree.top_k, cfg.tree.auto) == (60, 5, 10, True)
    engine = Engine(target, Eagle2Drafter(target, random_head(target, seed=3), cfg.tree), cfg)
    steps = _counted_steps(engine, PROMPT)
    eagle = [(t, r) for t, r in steps if t.source == "eagle"]
    assert len(eagle) >= 3 and max(t.tree.size for t, _ in eagle) > 20, "real EAGLE trees were verified"
    worst = max(eagle, key=lambda tr: tr[1].round_trips)[1]
    assert worst.round_trips <= 12, worst.where
    for trace, rec in steps:
        assert rec.where.count("upload:tree") == 1, rec.where          # tokens, depths, parents, mask at once
        assert rec.where.count("read:verify") == 1, rec.where          # argmax, stats, entropies, margins at once
        prefix = list(trace.verdict.path) == list(range(len(trace.verdict.path)))
        assert rec.where.count("upload:path") == (0 if prefix else 1), rec.where
    for trace, rec in eagle:
        depth = max(trace.tree.depths())
        assert rec.where.count("read:draft") <= cfg.tree.depth + 1, rec.where
        assert rec.where.count("upload:catch-up") == 1 and depth >= 1


def test_a_plain_step_makes_two_round_trips(monkeypatch):
    """Vanilla's one-token step: the token goes up once, the numbers come back once."""
    target = make_target("llama", dtype=torch.float32)
    cfg = EngineConfig().with_overrides({"method": "vanilla", "max_new_tokens": 6})
    from respec.drafters.vanilla import VanillaDrafter
    steps = _counted_steps(Engine(target, VanillaDrafter(), cfg), PROMPT)
    assert steps[0][1].where == ["read:prefill", "upload:tree", "read:verify"], "the prefill's numbers: one read"
    assert all(rec.where == ["upload:tree", "read:verify"] for _, rec in steps[1:]), steps[1][1].where


STEP_MODULES = ["respec/engine.py", "respec/verify.py", "respec/drafters/eagle2.py", "respec/drafters/eagle_search.py",
                "respec/drafters/probe.py", "respec/models/hf.py"]
#: HFTarget.prefill runs once per request (and is issue 31's to change); sampling's host-side
#: generator values are host tensors already.
EXEMPT = {("respec/models/hf.py", "prefill")}
READS = re.compile(r"\.tolist\(\)|\.item\(\)|\.cpu\(\)|synchronize\(|\.to\(\"cpu\"|\.numpy\(\)")
UPLOADS = re.compile(r"torch\.tensor\([^#]*device=")


def test_the_step_modules_cross_to_the_host_only_through_the_counter():
    """A direct read or upload in the step's modules would bypass the counted helper; host-only
    lines (Python values from host tensors) carry the marker `# host`."""
    bad = []
    for rel in STEP_MODULES:
        text = (ROOT / rel).read_text(encoding="utf-8")
        lines = text.splitlines()
        skip = set()
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef) and (rel, node.name) in EXEMPT:
                skip.update(range(node.lineno, node.end_lineno + 1))
        for no, line in enumerate(lines, 1):
            code = line.split("#")[0] if "# host" not in line else ""
            if no not in skip and (READS.search(code) or UPLOADS.search(code)):
                bad.append(f"{rel}:{no}: {line.strip()}")
    assert not bad, "\n".join(bad)


# ------------------------------------------------------------------------------- §8 timing
class _FakeEvent:
    log: list = []

    def __init__(self, enable_timing=False):
        self.device = None

    def record(self, stream=None):
        self.device = _FakeEvent.current
        _FakeEvent.log.append(("record", self.device))

    def query(self):
        return True

    def elapsed_time(self, end):
        return {0: 2.0, 1: 5.0}[end.device.index]


class _FakeDeviceCtx:
    def __init__(self, device):
        self.device = device

    def __enter__(self):
        _FakeEvent.current = self.device

    def __exit__(self, *exc):
        _FakeEvent.current = None


def test_the_stopwatch_records_on_every_gpu_and_never_waits(monkeypatch):
    """Timing a forward split over two GPUs: an event pair on each, the slowest device's time, no
    synchronize (a barrier only there to time would cost a round trip per step)."""
    _FakeEvent.log = []
    monkeypatch.setattr(torch.cuda, "Event", _FakeEvent)
    monkeypatch.setattr(torch.cuda, "device", _FakeDeviceCtx)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **k: pytest.fail("a timing barrier"))
    devs = (torch.device("cuda", 0), torch.device("cuda", 1))
    watch = Stopwatch(devs).start()
    watch.stop()
    assert watch.ms() == 5.0
    assert sorted(d.index for _, d in _FakeEvent.log) == [0, 0, 1, 1]


def test_the_engine_times_on_every_device_holding_weights(monkeypatch):
    """The engine's verify timer covers every GPU holding the target's weights (not only the
    embedding's). (EAGLE's depth cut times its layers on the wall clock after each read-back,
    which waits for every device: no device timer of its own since commit 6e56d99 of 2026-12-06.)"""
    import respec.engine as engine_mod
    seen = []

    class Spy(Stopwatch):
        def __init__(self, devices=()):
            seen.append(tuple(devices))
            super().__init__(())
    monkeypatch.setattr(engine_mod, "Stopwatch", Spy)
    target = make_target("llama", dtype=torch.float32)
    two = (torch.device("cuda", 0), torch.device("cuda", 1))
    monkeypatch.setattr(type(target), "weight_devices", property(lambda self: two))
    from respec.drafters.vanilla import VanillaDrafter
    cfg = EngineConfig().with_overrides({"method": "vanilla", "max_new_tokens": 3})
    Engine(target, VanillaDrafter(), cfg).generate(PROMPT)
    assert seen == [two]
