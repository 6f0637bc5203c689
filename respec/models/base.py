"""The target seam: what the engine needs from a target language model.

Contract: a TargetModel owns one request's KV cache. `prefill` feeds the prompt; `forward_tree`
feeds one DraftTree in ONE forward pass (4D tree attention mask, explicit position ids = kv_len +
depth) without committing it; `keep(path)` then commits exactly the KV rows of the accepted path
nodes (root first) and drops the rest, so the cache always equals that of the committed text.
Logits are returned as float32 on the model's device; `hidden` are the features the EAGLE head
consumes: the final-norm features (the vector fed to lm_head), or, after
`use_features(layers)`, the inputs of those decoder layers concatenated (EAGLE-3's fused
low/mid/high features, [n, len(layers) x H]). `verify_cost_curve` feeds the cost model
(respec/cost.py). `describe_forward()` says how its forwards run (a `ForwardInfo`: compiled or
eager, the eager linear plan, static buckets; for the trace's meta, the bench and the head's
back-off), and `prepare_head(head)` makes an EAGLE head run the way the target's forward does
(compiled with it, or with its own eager linear plan): the drafters never ask how. Everything the
engine, the drafters and the runner read of a target is declared here; respec/models/hf.py
`HFTarget` is the implementation (its speed machinery lives in respec/accel/).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

import torch

from respec.tree import DraftTree


@dataclass
class LoadedModel:
    """A ready-to-run target: what the engine, the app and the benchmarks receive."""

    model: Any                          # HF causal LM (PreTrainedModel), eval mode, requires_grad off
    tokenizer: Any                      # HF tokenizer, or None for tokenizer-free test models (models/tiny.py)
    name: str                           # human-readable, e.g. "SmolLM2-135M-Instruct"
    source: str                         # what was actually loaded: a local dir (the bf16 cache), or a Hub id
    device: torch.device                # where input ids go (the embedding's device under device_map="auto")
    dtype: torch.dtype                  # parameter dtype
    architecture: str                   # e.g. "LlamaForCausalLM"
    context_length: int                 # max positions (config.max_position_embeddings)
    eos_token_ids: frozenset[int]       # every id that ends a response (generation_config + tokenizer)
    origin: str = ""                    # where the weights came from before caching, e.g. the .gguf path
    spec: str = ""                      # the spec load_model was given ("default", a path, a Hub id)

    @property
    def vocab_size(self) -> int:
        """Rows of the output layer (may exceed len(tokenizer) when the vocabulary is padded)."""
        return int(self.model.get_output_embeddings().weight.shape[0])


@dataclass(frozen=True)
class TargetOutput:
    logits: torch.Tensor             # [n, vocab] float32
    hidden: torch.Tensor | None      # [n, F] features (F = hidden, or layers x hidden: use_features), model dtype
    tokens: torch.Tensor | None = None    # forward_tree: [n] the tree's tokens on the logits' device (uploaded once)
    parents: torch.Tensor | None = None   # forward_tree: [n] each node's parent (the root: 0), same device
    numbers: torch.Tensor | None = None   # forward_tree, compiled: [n, 7] respec/verify.py number_table


@dataclass(frozen=True)
class ForwardInfo:
    """How a target's forwards run: what a trace's meta and a bench's machine record say."""
    compiled: bool = False                    # steps through torch.compile graphs (respec/accel/)
    linear_layout: str = ""                   # the eager linear plan, described ("" = none)
    static_buckets: tuple[int, ...] = ()      # compiled trees of 3+ rows padded to these row counts
    eager_from_rows: int | None = None        # compiled trees of this many rows and more run eagerly
    detail: str = ""                          # one line: what was measured for the choices above

    @property
    def mode(self) -> str:
        return "compiled" if self.compiled else "eager"


class TargetModel(Protocol):
    vocab_size: int
    hidden_size: int
    eos_token_ids: frozenset[int]
    context_length: int
    device: torch.device
    dtype: torch.dtype
    name: str
    model: torch.nn.Module           # the wrapped transformers model: its config and output layer
                                     # (the EAGLE head is shaped from and drafts through them)
    softcap: float | None            # final-logit softcapping the target applies, None for none
    tokenizer: Any                   # the text tokenizer, None for a token-ids-only target
    loaded: "LoadedModel | None"     # load facts (spec, source, ...) from load_target, else None

    @property
    def kv_len(self) -> int: ...

    def reset(self) -> None: ...

    def use_features(self, layers: Sequence[int] | None) -> None:
        """What `hidden` carries from the next forward on: None = the final-norm features; decoder
        layer ids = the inputs of those layers, concatenated along the feature axis."""

    def prefill(self, tokens: Sequence[int]) -> TargetOutput:
        """Feed the prompt; logits for the LAST position only ([1, vocab]), hidden for all ([n, H])."""

    def forward_tree(self, tree: DraftTree, need_hidden: bool = True) -> TargetOutput:
        """One forward over every tree node; logits [n + 1, vocab], hidden [n + 1, H] or None."""

    def keep(self, path: Sequence[int], index: torch.Tensor | None = None) -> None:
        """Commit the KV rows of `path` (tree node indices, root first) from the last forward_tree;
        `index`, when given, is `path` already on the target's device."""

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        """[..., H] -> [..., vocab] logits through the target's output layer."""

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        """[...] token ids -> [..., H] input embeddings of the target."""

    @property
    def weight_devices(self) -> tuple[torch.device, ...]:
        """The devices holding the model's weights (every GPU under device_map="auto"): timing waits on all."""

    def describe_forward(self) -> ForwardInfo:
        """How this target's forwards run now (they change once a background compile lands)."""

    def prepare_head(self, head: Any) -> None:
        """Make an EAGLE head (respec/drafters/heads/) run as this target's forward does; idempotent."""

    def verify_cost_curve(self, max_size: int = 64, context: int = 256, reps: int = 4) -> dict[int, float]:
        """Milliseconds of one tree forward per tree size {n: ms} (n <= max_size) after `context`
        cached tokens, measured once and cached; the engine's cache is left as it was."""
