"""The decoding loop: one generator for every method (vanilla, EAGLE-2, SAM-Decoding, ReSpec).

Contract: `Engine.stream(prompt_ids)` yields one `StepTrace` per target forward after the prefill;
`Engine.generate(prompt_ids)` consumes it and returns a `GenerationResult`. The engine works on
token ids; it knows no text except through the optional tokenizer used to decode the result.
Greedy (temperature 0) uses strict verification, so every method's output equals vanilla's token
for token (up to batched-vs-single-token rounding in low precision; see README "Lossless").
Sampling (temperature > 0) uses lossless speculative sampling with one torch.Generator per run.

Per run: a fresh KV cache and fresh drafter state (reset), so requests never leak into each other.
Where generation ends (a stop token, max_new_tokens, the context) is respec/tokens.py
`cut_generated`, the one rule the loop and `assemble` share.

Host <-> device: every crossing goes through respec/transfer.py. A step uploads the tree once
(forward_tree), reads its numbers back once (argmax, node stats, entropies and margins of every
row: `read_number_table` when the compiled output layer fused them, else `read_numbers`) and
uploads the kept path once when it is not a prefix; the verify forward is timed by a `Stopwatch`
(CUDA events on every device holding weights), never by a barrier.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch

from respec.config import RELAXED_METHODS, EngineConfig
from respec.cost import CostModel, cost_max_size
from respec.drafters.base import Candidate, DraftContext, Drafter, Proposal, StepOutcome
from respec.errors import PromptError
from respec.models.base import TargetModel
from respec.sampling import entropy, probs_from_logits, sample
from respec.tokens import cut_generated
from respec.trace import GenerationResult, StepTrace
from respec.transfer import Stopwatch, read, upload
from respec.verify import StepNumbers, Verdict, read_number_table, read_numbers, verify_greedy, verify_sampling


def _node_ranks_probs(numbers: StepNumbers) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """For every node i > 0: the rank (1 = top-1) and probability of its token under the target's
    distribution after its parent. The root gets rank 0 and probability 1."""
    ranks, probs = list(numbers.ranks), list(numbers.probs)
    ranks[0], probs[0] = 0, 1.0
    return tuple(int(r) for r in ranks), tuple(float(p) for p in probs)


def _rows(hidden: torch.Tensor | None, kept: int, index: torch.Tensor | None) -> torch.Tensor | None:
    """hidden [n, F] -> the kept path's rows [kept, F]: the first `kept` for a prefix path, else
    `index` (the path, on a device)."""
    if hidden is None:
        return None
    return hidden[:kept].clone() if index is None else hidden[index.to(hidden.device)]   # never a view of an output


@dataclass(frozen=True)
class Prefill:
    """The prefill of a run: the first generated token (the target's choice after the prompt), the
    entropy and top-1/top-2 margin of the distribution that chose it, and its wall time."""
    token: int
    entropy: float
    margin: float
    ms: float


def _step_trace(step: int, proposal: Proposal, verdict: Verdict, numbers: StepNumbers,
                draft_ms: float, verify_ms: float, candidates: Sequence[Candidate], at_ms: float) -> StepTrace:
    """The step's record, with its per-step metrics, from the numbers read back after the forward."""
    path = list(verdict.path)
    tree = proposal.tree
    node_ranks, node_probs = _node_ranks_probs(numbers)
    new_tokens = [tree.tokens[i] for i in path[1:]] + [verdict.next_token]
    return StepTrace(step=step, source=proposal.source, tree=tree, verdict=verdict,
                     new_tokens=tuple(new_tokens), entropies=tuple(numbers.entropies[i] for i in path),
                     margins=tuple(numbers.margins[i] for i in path), node_ranks=node_ranks, node_probs=node_probs,
                     draft_ms=draft_ms, verify_ms=verify_ms, decision=proposal.decision,
                     candidates=tuple(c.to_dict() for c in candidates), at_ms=at_ms)


class Engine:
    def __init__(self, target: TargetModel, drafter: Drafter, config: EngineConfig,
                 stop_token_ids: Sequence[int] | None = None, tokenizer=None,
                 no_relax_ids: frozenset[int] | None = None) -> None:
        self.target = target
        self.drafter = drafter
        self.config = config
        self.tokenizer = tokenizer
        self.stop_token_ids = frozenset(target.eos_token_ids if stop_token_ids is None else stop_token_ids)
        # Relaxed verification (ReSpec's retrieval nodes, greedy only) never relaxes these tokens.
        self.no_relax_ids = frozenset(no_relax_ids or ()) | self.stop_token_ids
        self.relax = config.relax if (config.method in RELAXED_METHODS and config.greedy) else None
        self._prefill: Prefill | None = None

    def cost_model(self) -> CostModel | None:
        """This request's cost model (respec/cost.py) when `tree.auto` is on; None (fixed draft
        sizes) otherwise."""
        cfg = self.config
        if not cfg.tree.auto or cfg.method == "vanilla":
            return None
        return CostModel(lambda n: self.target.verify_cost_curve(max_size=n), cost_max_size(cfg))

    def check_prompt(self, prompt: Sequence[int]) -> None:
        if len(prompt) == 0:
            raise PromptError("the prompt is empty")
        room = self.target.context_length - len(prompt)
        if room < 2:
            raise PromptError(f"the prompt has {len(prompt)} tokens; the model's context holds "
                              f"{self.target.context_length}, leaving no room to generate")

    def _max_new(self, prompt: Sequence[int]) -> int:
        """Tokens this run may generate: max_new_tokens, or fewer where the context ends first."""
        return min(self.config.max_new_tokens, self.target.context_length - len(prompt))

    def _run_prefill(self, prompt: list[int], gen: torch.Generator) -> Prefill:
        """1. Prefill the prompt; the first generated token is the target's choice after it.
        2. Reset the drafter: index the prompt, queue prompt features for EAGLE catch-up."""
        t0 = time.perf_counter()
        self.target.use_features(self.drafter.feature_layers if self.drafter.needs_hidden else None)
        out = self.target.prefill(prompt)
        last = out.logits[-1:]                                                  # [1, V]
        cfg = self.config
        top2 = torch.topk(last, min(2, last.shape[-1]), dim=-1).values          # [1, 2]
        ((argmax, first_entropy, first_margin),) = read(torch.cat([              # ONE read: [3]
            last.argmax(-1).to(last.dtype), entropy(last), top2[:, 0] - top2[:, -1]]), label="prefill")
        root = int(argmax) if cfg.greedy else sample(probs_from_logits(last, cfg.sampling)[0], gen)
        self.drafter.reset(prompt, out.hidden if self.drafter.needs_hidden else None)
        return Prefill(root, first_entropy, first_margin, (time.perf_counter() - t0) * 1000)

    def _verify(self, tree, logits: torch.Tensor, numbers: StepNumbers, gen: torch.Generator) -> Verdict:
        """Strict greedy (relaxed for retrieval nodes where the method relaxes), or lossless
        speculative sampling. logits: [n + 1, V]."""
        if self.config.greedy:
            return verify_greedy(tree, logits, self.relax, self.no_relax_ids, numbers=numbers)
        return verify_sampling(tree, probs_from_logits(logits, self.config.sampling), gen)

    def stream(self, prompt: Sequence[int]) -> Iterator[StepTrace]:
        """The only decoding loop. Yields one StepTrace per target forward after the prefill."""
        self._prefill = None
        t_start = time.perf_counter()          # each step's at_ms counts from here
        prompt = [int(t) for t in prompt]
        self.check_prompt(prompt)
        gen = torch.Generator(device="cpu").manual_seed(self.config.sampling.seed)
        dev, ctx_len, max_new = self.target.device, self.target.context_length, self._max_new(prompt)
        # 1-2. Prefill and drafter reset.
        self._prefill = first = self._run_prefill(prompt, gen)
        committed = list(prompt)          # fed to the target (the root is not yet)
        generated, entropies = [first.token], [first.entropy]
        if cut_generated(generated, self.stop_token_ids, max_new).reason is not None:
            return
        # 3. Loop: draft, verify in one forward, commit, feed back, report.
        cost, step, root = self.cost_model(), 0, first.token
        watch = Stopwatch(getattr(self.target, "weight_devices", (dev,)))
        while True:
            # 3.1 Context for the drafter: node cap keeps the tree inside the model's context.
            max_nodes = max(1, ctx_len - len(committed))
            ctx = DraftContext(tokens=committed, root=root, entropies=entropies, max_nodes=max_nodes, cost=cost)
            # 3.2 Propose a tree rooted at the root (timed as drafting).
            t_draft = time.perf_counter()
            proposal = self.drafter.propose(ctx)
            tree = proposal.tree
            if tree.size > max_nodes:
                raise RuntimeError(f"drafter {self.drafter.name} proposed {tree.size} nodes, cap {max_nodes}")
            t_verify = time.perf_counter()
            # 3.3 One target forward over the whole tree (tree mask, depth positions), timed without
            # a barrier (events on every device holding weights); 3.4 one read-back, then verify.
            watch.start()
            tout = self.target.forward_tree(tree, need_hidden=self.drafter.needs_hidden)
            watch.stop()
            numbers = (read_number_table(tout.numbers) if tout.numbers is not None      # compiled: fused
                       else read_numbers(tree, tout.logits, tout.tokens, tout.parents))
            verdict = self._verify(tree, tout.logits, numbers, gen)
            # 3.5 Keep only the accepted path in the KV cache; commit root + accepted tokens.
            path = list(verdict.path)
            prefix = path == list(range(len(path)))
            index = None if prefix else upload(path, dev, label="path")      # [a + 1]: keep and features
            self.target.keep(path, index)
            verify_ms = watch.ms()
            draft_ms, verify_ms = (t_verify - t_draft) * 1000, (verify_ms if verify_ms is not None
                                                               else (time.perf_counter() - t_verify) * 1000)
            if cost is not None:
                cost.observe(tree.size, verify_ms)          # the forward only: metrics come after
            committed.extend(tree.tokens[i] for i in path)
            # 3.6 Feed back to the drafter (indexes, EMA, EAGLE catch-up features).
            hidden = _rows(tout.hidden, len(path), index)                                    # [a + 1, F]
            feedback = self.drafter.observe(StepOutcome(proposal=proposal, verdict=verdict,   # hidden [a + 1, H]
                                                        committed=[tree.tokens[i] for i in path],
                                                        committed_hidden=hidden, next_root=verdict.next_token,
                                                        verify_ms=verify_ms))
            # 3.7 Report the step.
            trace = _step_trace(step, proposal, verdict, numbers, draft_ms, verify_ms,
                                proposal.candidates if feedback is None else feedback,
                                (time.perf_counter() - t_start) * 1000)
            yield trace
            step += 1
            # 3.8 Stop at a stop token or at max_new_tokens (the last step may overshoot: truncated).
            cut = cut_generated(trace.new_tokens, self.stop_token_ids, max_new - len(generated))
            generated.extend(cut.tokens)
            entropies.extend(trace.entropies[:len(cut.tokens)])
            if cut.reason is not None or len(committed) + 1 >= ctx_len:
                return
            root = verdict.next_token

    @property
    def prefill(self) -> Prefill | None:
        """The current run's Prefill once `stream` has done it; None before."""
        return self._prefill

    def assemble(self, prompt: Sequence[int], steps: Sequence[StepTrace], wall_time_s: float,
                 final: bool = True) -> GenerationResult:
        """The GenerationResult of the steps streamed so far: generated = [first token] + every
        step's new tokens, cut by `cut_generated` at max_new_tokens (or the context end) and after
        a stop token. With final=False (a run still streaming) the stop reason is "running" and
        text is not decoded."""
        first = self._prefill
        if first is None:
            raise RuntimeError("assemble before the prefill")
        tokens = [first.token]
        for s in steps:
            tokens.extend(s.new_tokens)
        cut = cut_generated(tokens, self.stop_token_ids, self._max_new(prompt))
        if cut.reason == "stop_token":
            stop_reason = "stop_token"
        else:
            stop_reason = "max_new_tokens" if len(cut.tokens) == self.config.max_new_tokens else "context"
        if not final:
            stop_reason = "running"
        text = ""
        if final and self.tokenizer is not None:
            text = self.tokenizer.decode(list(cut.tokens), skip_special_tokens=True)
        return GenerationResult(prompt_tokens=tuple(int(t) for t in prompt), tokens=cut.tokens, text=text,
                                first_entropy=first.entropy, first_margin=first.margin, steps=tuple(steps),
                                config=self.config, wall_time_s=wall_time_s, prefill_ms=first.ms,
                                stop_reason=stop_reason, meta={})

    def generate(self, prompt: Sequence[int]) -> GenerationResult:
        """Run `stream` to the end and assemble the result (never re-implements the loop)."""
        t0 = time.perf_counter()
        steps = list(self.stream(prompt))
        return self.assemble(prompt, steps, time.perf_counter() - t0)
