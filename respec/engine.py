"""The decoding loop: one generator for every method (vanilla, EAGLE-2, SAM-Decoding, ReSpec).

Contract: `Engine.stream(prompt_ids)` yields one `StepTrace` per target forward after the prefill;
`Engine.generate(prompt_ids)` consumes it and returns a `GenerationResult`. The engine works on
token ids; it knows no text except through the optional tokenizer used to decode the result.
Greedy (temperature 0) uses strict verification, so every method's output equals vanilla's token
for token (up to batched-vs-single-token rounding in low precision; see README "Lossless").
Sampling (temperature > 0) uses lossless speculative sampling with one torch.Generator per run.

Per run: a fresh KV cache and fresh drafter state (reset), so requests never leak into each other.
"""
from __future__ import annotations

import time
from typing import Iterator, Sequence

import torch

from respec.config import RELAXED_METHODS, EngineConfig
from respec.cost import CostModel, cost_max_size
from respec.drafters.base import DraftContext, Drafter, StepOutcome
from respec.errors import PromptError
from respec.models.base import TargetModel
from respec.sampling import entropy, probs_from_logits, sample
from respec.trace import GenerationResult, StepTrace
from respec.verify import NodeStats, node_target_stats, verify_greedy, verify_sampling


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _margins(logits: torch.Tensor) -> list[float]:
    """logits: [n, V] -> top-1 minus top-2 logit per row."""
    top2 = torch.topk(logits, 2, dim=-1).values
    return (top2[:, 0] - top2[:, 1]).tolist()


def _node_ranks_probs(stats: NodeStats) -> tuple[tuple[int, ...], tuple[float, ...]]:
    """For every node i > 0: the rank (1 = top-1) and probability of its token under the target's
    distribution after its parent. The root gets rank 0 and probability 1."""
    ranks, probs = stats.ranks.tolist(), stats.logprobs.exp().tolist()
    ranks[0], probs[0] = 0, 1.0
    return tuple(int(r) for r in ranks), tuple(float(p) for p in probs)


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
        self.last_result: GenerationResult | None = None
        self._first: tuple[int, float, float, float] | None = None

    def cost_model(self) -> CostModel | None:
        """This request's cost model (respec/cost.py) when `tree.auto` is on and the target measures
        a verify-cost curve; None (fixed draft sizes) otherwise."""
        cfg = self.config
        curve = getattr(self.target, "verify_cost_curve", None)
        if not cfg.tree.auto or cfg.method == "vanilla" or curve is None:
            return None
        return CostModel(lambda n: curve(max_size=n), cost_max_size(cfg))

    def check_prompt(self, prompt: Sequence[int]) -> None:
        if len(prompt) == 0:
            raise PromptError("the prompt is empty")
        room = self.target.context_length - len(prompt)
        if room < 2:
            raise PromptError(f"the prompt has {len(prompt)} tokens; the model's context holds "
                              f"{self.target.context_length}, leaving no room to generate")

    def stream(self, prompt: Sequence[int]) -> Iterator[StepTrace]:
        """The only decoding loop. Yields one StepTrace per target forward after the prefill."""
        cfg = self.config
        self._first = None
        prompt = [int(t) for t in prompt]
        self.check_prompt(prompt)
        gen = torch.Generator(device="cpu").manual_seed(cfg.sampling.seed)
        greedy = cfg.greedy
        dev = self.target.device
        ctx_len = self.target.context_length
        max_new = min(cfg.max_new_tokens, ctx_len - len(prompt))

        # 1. Prefill the prompt; the first generated token is the target's choice after it.
        t0 = time.perf_counter()
        out = self.target.prefill(prompt)
        last = out.logits[-1]                                                   # [V]
        root = int(last.argmax()) if greedy else sample(probs_from_logits(last[None], cfg.sampling)[0], gen)
        first_entropy = float(entropy(last))
        first_margin = _margins(last[None])[0]
        # 2. Reset the drafter: index the prompt, queue prompt features for EAGLE catch-up.
        self.drafter.reset(prompt, out.hidden if self.drafter.needs_hidden else None)
        _sync(dev)
        self._first = (root, first_entropy, first_margin, (time.perf_counter() - t0) * 1000)
        committed = list(prompt)          # fed to the target (the root is not yet)
        generated = [root]
        entropies = [first_entropy]
        if root in self.stop_token_ids or len(generated) >= max_new:
            return

        # 3. Loop: draft, verify in one forward, commit, feed back, report.
        cost = self.cost_model()
        step = 0
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
            _sync(dev)
            t_verify = time.perf_counter()
            # 3.3 One target forward over the whole tree (tree mask, depth positions).
            tout = self.target.forward_tree(tree, need_hidden=self.drafter.needs_hidden)
            # 3.4 Verify: strict greedy, or lossless speculative sampling.
            stats = node_target_stats(tree, tout.logits)    # for the trace, and the relaxed rule
            if greedy:
                verdict = verify_greedy(tree, tout.logits, self.relax, self.no_relax_ids, stats)
            else:
                verdict = verify_sampling(tree, probs_from_logits(tout.logits, cfg.sampling), gen)
            # 3.5 Keep only the accepted path in the KV cache; commit root + accepted tokens.
            path = list(verdict.path)
            self.target.keep(path)
            _sync(dev)
            t_done = time.perf_counter()
            draft_ms, verify_ms = (t_verify - t_draft) * 1000, (t_done - t_verify) * 1000
            if cost is not None:
                cost.observe(tree.size, verify_ms)
            # trace statistics, outside the timed window (the cost model must see the forward only)
            path_logits = tout.logits[path]                                     # [a + 1, V]
            node_ranks, node_probs = _node_ranks_probs(stats)
            step_entropies = entropy(path_logits).tolist()
            step_margins = _margins(path_logits)
            committed.extend(tree.tokens[i] for i in path)
            new_tokens = [tree.tokens[i] for i in path[1:]] + [verdict.next_token]
            # 3.6 Feed back to the drafter (indexes, EMA, EAGLE catch-up features).
            hidden = None
            if tout.hidden is not None:
                hidden = tout.hidden[torch.tensor(path, device=tout.hidden.device)]  # [a + 1, H]
            feedback = self.drafter.observe(StepOutcome(proposal=proposal, verdict=verdict,
                                                        committed=[tree.tokens[i] for i in path],
                                                        committed_hidden=hidden, next_root=verdict.next_token,
                                                        verify_ms=verify_ms))
            candidates = proposal.candidates if feedback is None else feedback
            # 3.7 Report the step.
            yield StepTrace(step=step, source=proposal.source, tree=tree, verdict=verdict,
                            new_tokens=tuple(new_tokens), entropies=tuple(step_entropies),
                            margins=tuple(step_margins), node_ranks=node_ranks, node_probs=node_probs,
                            draft_ms=draft_ms, verify_ms=verify_ms,
                            decision=proposal.decision, candidates=tuple(candidates))
            step += 1
            # 3.8 Stop at a stop token or at max_new_tokens (the last step may overshoot: truncated).
            done = False
            for t, h in zip(new_tokens, step_entropies):
                generated.append(t)
                entropies.append(h)
                if t in self.stop_token_ids or len(generated) >= max_new:
                    done = True
                    break
            if done or len(committed) + 1 >= ctx_len:
                return
            root = verdict.next_token

    @property
    def prefill(self) -> tuple[int, float, float, float] | None:
        """(first token, its distribution's entropy, its top-1/top-2 margin, prefill ms) of the
        current run, once `stream` has done the prefill; None before."""
        return self._first

    def assemble(self, prompt: Sequence[int], steps: Sequence[StepTrace], wall_time_s: float,
                 final: bool = True) -> GenerationResult:
        """The GenerationResult of the steps streamed so far: generated = [first token] + every
        step's new tokens, cut at max_new_tokens (or the context end) and after a stop token.
        With final=False (a run still streaming) the stop reason is "running" and text is not decoded."""
        if self._first is None:
            raise RuntimeError("assemble before the prefill")
        root, first_entropy, first_margin, prefill_ms = self._first
        tokens = [root]
        for s in steps:
            tokens.extend(s.new_tokens)
        max_new = min(self.config.max_new_tokens, self.target.context_length - len(prompt))
        tokens = tokens[:max_new]
        stop_reason = "max_new_tokens" if len(tokens) == self.config.max_new_tokens else "context"
        for i, t in enumerate(tokens):
            if t in self.stop_token_ids:
                tokens, stop_reason = tokens[:i + 1], "stop_token"
                break
        if not final:
            stop_reason = "running"
        text = ""
        if final and self.tokenizer is not None:
            text = self.tokenizer.decode(tokens, skip_special_tokens=True)
        return GenerationResult(prompt_tokens=tuple(int(t) for t in prompt), tokens=tuple(tokens), text=text,
                                first_entropy=first_entropy, first_margin=first_margin, steps=tuple(steps),
                                config=self.config, wall_time_s=wall_time_s, prefill_ms=prefill_ms,
                                stop_reason=stop_reason, meta={})

    def generate(self, prompt: Sequence[int]) -> GenerationResult:
        """Run `stream` to the end and assemble the result (never re-implements the loop)."""
        t0 = time.perf_counter()
        steps = list(self.stream(prompt))
        result = self.assemble(prompt, steps, time.perf_counter() - t0)
        self.last_result = result
        return result
