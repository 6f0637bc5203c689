"""Shared fixtures: tiny random-init targets built from configs (fp64, exact on CPU), oracle
drafters that know the vanilla continuation, helpers to run a method end to end, and one compiled
float32 tiny Llama for the whole session (`compiled_llama`: compiling costs minutes on two cores,
so the compile tests share it rather than each compiling its own)."""
from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import dataclass
from typing import Sequence

import pytest
import torch

from respec.config import EngineConfig
from respec.drafters import make_drafter
from respec.drafters.base import DraftContext, Proposal, StepOutcome
from respec.engine import Engine
from respec.models.hf import HFTarget
from respec.models.tiny import tiny_llama, tiny_qwen2
from respec.tree import DraftTree

EOS = 2


#: Where the xdist workers write which tests their `xdist_group` marks put together (set by the
#: controller for the run; see `pytest_xdist_make_scheduler`).
GROUPS_FILE = "RESPEC_TEST_GROUPS_FILE"


def pytest_configure(config) -> None:
    """README's test command runs one pytest-xdist worker per core with `--dist loadgroup`. Each
    worker's torch takes its share of the cores, so workers never oversubscribe them; the
    controller names a file where the workers record the `xdist_group` marks (below)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0") or 0)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        if workers > 1:
            cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
            torch.set_num_threads(max(1, cores // workers))
    elif getattr(config.option, "dist", "no") == "loadgroup":
        folder = tempfile.mkdtemp(prefix="respec-test-groups-")
        config.add_cleanup(lambda: shutil.rmtree(folder, ignore_errors=True))
        os.environ[GROUPS_FILE] = os.path.join(folder, "groups.json")     # the workers inherit it


def pytest_collection_modifyitems(config, items) -> None:
    """In an xdist worker: write {test id: group} for the tests with an `xdist_group` mark."""
    path = os.environ.get(GROUPS_FILE)
    if not (path and os.environ.get("PYTEST_XDIST_WORKER")):
        return
    groups = {item.nodeid: "_".join(sorted({str(m.args[0] if m.args else m.kwargs.get("name", ""))    # xdist's rule
                                            for m in item.iter_markers("xdist_group")}))
              for item in items if item.get_closest_marker("xdist_group") is not None}
    tmp = f"{path}.{os.environ['PYTEST_XDIST_WORKER']}"
    with open(tmp, "w") as f:
        json.dump(groups, f)
    os.replace(tmp, path)                          # every worker collects the same tests: any copy serves


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """`--dist loadgroup` keeping the tests of one `xdist_group` on one worker. pytest-xdist 3.8
    marks a group by appending it to the test's id, which pytest 9 ignores (its ids are built
    elsewhere), so each test went wherever there was room: the session's compiled tiny Llama was
    compiled once per worker. Here the groups come from the marks the workers recorded (the
    controller collects nothing itself), read when the scheduler first splits the ids, after every
    worker's collection; the largest groups go out first (xdist's default order)."""
    path = os.environ.get(GROUPS_FILE)
    if getattr(config.option, "dist", "no") != "loadgroup" or not path:
        return None
    from xdist.scheduler import LoadScopeScheduling

    class MarkGroupScheduling(LoadScopeScheduling):
        groups: dict | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.groups is None:
                with open(path) as f:
                    self.groups = json.load(f)
            group = self.groups.get(nodeid)
            return f"group:{group}" if group else nodeid

    return MarkGroupScheduling(config, log)


def make_target(arch: str, seed: int = 0, dtype=torch.float64) -> HFTarget:
    model = (tiny_llama if arch == "llama" else tiny_qwen2)(seed=seed, dtype=dtype)
    return HFTarget(model, eos_token_ids=frozenset({EOS}), context_length=256, name=f"tiny-{arch}")


@pytest.fixture(scope="session", params=["llama", "qwen2"])
def tiny_target(request) -> HFTarget:
    return make_target(request.param)


def run(target, method: str, prompt: Sequence[int], drafter=None, head=None, **overrides):
    cfg = EngineConfig().with_overrides({"method": method, **overrides})
    drafter = drafter or make_drafter(method, target, cfg, head=head)
    return Engine(target, drafter, cfg).generate(prompt)


class OracleDrafter:
    """Proposes trees around a precomputed vanilla continuation `reference` (generated tokens).

    mode "same": the right chain of `depth` tokens, hidden among wrong siblings (a real tree);
    mode "random": random tokens only; mode "partial": right for a random number of tokens, then wrong.
    """
    needs_hidden = False
    feature_layers = None

    def __init__(self, reference: Sequence[int], prompt_len: int, mode: str, vocab: int,
                 depth: int = 4, width: int = 3, seed: int = 0, source: str = "eagle") -> None:
        self.name = f"oracle-{mode}"
        self.ref, self.prompt_len, self.mode = list(reference), prompt_len, mode
        self.vocab, self.depth, self.width, self.source = vocab, depth, width, source
        self.rng = random.Random(seed)

    def reset(self, prompt, prompt_hidden) -> None:
        pass

    def observe(self, outcome: StepOutcome) -> None:
        pass

    def _wrong(self, right: int) -> int:
        t = self.rng.randrange(self.vocab)
        return t if t != right else (t + 1) % self.vocab

    def propose(self, ctx: DraftContext) -> Proposal:
        j = len(ctx.tokens) - self.prompt_len           # ctx.root == reference[j]
        right = self.ref[j + 1:j + 1 + self.depth]
        right += [self.rng.randrange(self.vocab) for _ in range(self.depth - len(right))]
        if self.mode == "random":
            chain = [self._wrong(t) for t in right]
        elif self.mode == "partial":
            cut = self.rng.randrange(self.depth + 1)
            chain = right[:cut] + [self._wrong(t) for t in right[cut:]]
        else:
            chain = right
        tokens, parents = [ctx.root], [-1]
        parent = 0
        for t in chain:                                  # wrong siblings first, so paths are non-prefix
            for _ in range(self.width - 1):
                tokens.append(self._wrong(t)); parents.append(parent)
            tokens.append(t); parents.append(parent)
            parent = len(tokens) - 1
        cap = min(len(tokens), ctx.max_nodes)
        tree = DraftTree.from_parents(tokens[:cap], parents[:cap], self.source)
        return Proposal(tree=tree, source=self.source)


def inject_costs(monkeypatch, target, curve: dict[int, float], row_ms: float) -> None:
    """Decisions from given costs, not the clock: the target's verify-cost curve is `curve`, a head
    row costs `row_ms`, and observed step times do not shift the curve. A test that reads the clock
    has a verdict that depends on the machine (the tiny models' steps cost about the same at every
    size, so a draft's rate sits near 1.0x and flips with noise)."""
    from respec.cost import CostModel
    from respec.drafters.heads.eagle import EagleHead
    monkeypatch.setattr(target, "verify_cost_curve",
                        lambda max_size=64, **_: {n: ms for n, ms in curve.items() if n <= max(max_size, 2)})
    monkeypatch.setattr(CostModel, "observe", lambda self, size, verify_ms: None)
    monkeypatch.setattr(EagleHead, "row_ms", lambda self, target, reps=3: row_ms)


@dataclass(frozen=True)
class CompiledLlama:
    """The session's compiled float32 tiny Llama (seed 0: make_target("llama")'s weights) and what
    it did right after its warm-up, before any test touched it."""
    target: HFTarget
    bucket_choice: dict              # what choose_buckets measured at its warm-up
    buckets: tuple[int, ...]         # the buckets it kept
    eager_from: int | None           # what choose_eager_from measured (restored after each test)
    eager_choice: tuple | None
    fresh_compiles: dict             # {check: compiles it took} for the checks a fresh load must pass


@contextlib.contextmanager
def frames_compiled():
    """The frames dynamo compiles inside the block, as "function file:line (thread)" (a failed
    no-recompilation check names what compiled and in which thread, not only how many)."""
    import threading

    from torch._dynamo.convert_frame import register_bytecode_hook
    frames: list[str] = []
    handle = register_bytecode_hook(lambda code, new_code: frames.append(
        f"{code.co_name} {code.co_filename}:{code.co_firstlineno} ({threading.current_thread().name})"))
    try:
        yield frames
    finally:
        handle.remove()


def random_tree(rng: random.Random, n: int, vocab: int) -> DraftTree:
    """n nodes (root included), each node's parent a random earlier node."""
    parents = [-1] + [rng.randrange(i) for i in range(1, n)]
    return DraftTree.from_parents([rng.randrange(3, vocab) for _ in range(n)], parents, "eagle")


def kept_path(tree: DraftTree, rng: random.Random) -> list[int]:
    """A root-to-node path of `tree` (ascending indices), as verification would keep."""
    node = rng.randrange(tree.size)
    path = []
    while node != -1:
        path.append(node)
        node = tree.parents[node]
    return path[::-1]


def _fresh_load_compiles(target: HFTarget) -> dict:
    """Compiles taken, right after the warm-up, by (1) twenty mixed tree sizes over a grown cache
    (one token, chains, branching trees up to 33 rows through the symbolic graph) and (2) one-token
    steps and chains that fill the first slab to its last row and step past it: the warm-up alone
    must have compiled every graph either takes."""
    from respec.accel.compiled import compile_count
    from respec.models.kv import INITIAL_CAPACITY
    rng = random.Random(1)
    saved, target.fast.eager_from = target.fast.eager_from, None        # the symbolic graph too
    counts = {}
    target.prefill([5, 17, 9, 33, 12, 8, 21, 40, 7])
    before = compile_count()
    for step in range(20):
        tree = random_tree(rng, [1, 2, 5, 9, 16, 33, 3, 12, 4, 2][step % 10], target.vocab_size)
        target.forward_tree(tree)
        target.keep(kept_path(tree, rng))
    counts["mixed tree sizes"] = compile_count() - before
    target.prefill([3 + i % 50 for i in range(INITIAL_CAPACITY - 6)])
    before = compile_count()
    for n in (1, 1, 1, 1, 1, 1, 3, 1, 2, 1):          # the slab reaches exactly its capacity on the way
        target.forward_tree(DraftTree.chain(5, [6 + i for i in range(n - 1)], "eagle"))
        target.keep(list(range(n)))
    assert target.kv_len == INITIAL_CAPACITY + 7
    counts["the first slab filled to its last row"] = compile_count() - before
    target.fast.eager_from = saved
    return counts


@pytest.fixture(scope="session")
def compiled_llama() -> CompiledLlama:
    """One compiled tiny Llama (float32, the default buckets and choices measured on this machine,
    no speed variable set), long enough (4 slabs' first capacity) for the cache-growth checks."""
    from respec.models.kv import INITIAL_CAPACITY
    with pytest.MonkeyPatch.context() as mp:
        for var in ("RESPEC_PAD_ROWS", "RESPEC_EAGER_FROM", "RESPEC_ONE_ROW_AUTOTUNE", "RESPEC_LINEAR_LAYOUT"):
            mp.delenv(var, raising=False)
        target = HFTarget(tiny_llama(seed=0, dtype=torch.float32), eos_token_ids=frozenset({EOS}),
                          context_length=4 * INITIAL_CAPACITY, name="tiny-llama")
        target.enable_compile(progress=False)
        fast = target.fast
        return CompiledLlama(target, dict(fast.bucket_choice), tuple(fast.buckets), fast.eager_from,
                             fast.eager_choice, _fresh_load_compiles(target))


@pytest.fixture
def shared_compiled(compiled_llama, monkeypatch) -> HFTarget:
    """The session's compiled Llama with its measured choices, which a test may change freely:
    they are put back after it (as is its cost-curve cache)."""
    target = compiled_llama.target
    for name in ("buckets", "bucket_choice", "eager_from", "eager_choice"):
        monkeypatch.setattr(target.fast, name, getattr(compiled_llama, name))
    monkeypatch.setattr(target, "_cost_curves", {})
    return target
