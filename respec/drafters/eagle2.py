"""EAGLE-2 model drafter: the EAGLE head, its checkpoint loader, the dynamic tree search, and the
drafter that keeps the head's KV cache in sync with the committed text (catch-up).

Contract (ALGORITHMS.md §4):
- `EagleHead` = fc(cat[embed(x_{t+1}), f_t]) -> one decoder layer without input norm -> f̂_{t+1}.
  Logits are the TARGET's lm_head(f̂); embeddings are the TARGET's (shared, never stored twice).
  The decoder layer is transformers' own LlamaDecoderLayer (Qwen2DecoderLayer when the checkpoint
  has q/k/v biases), with `input_layernorm` replaced by Identity. Nothing is forked.
- Inputs are shifted by one: the head sees pairs (f_t, x_{t+1}), f_t the target's final-norm feature
  at committed position t. The pair (f_t, x_{t+1}) sits at head position t.
- `expand_tree(step_fn, ...)` is the pure EAGLE-2 search (top-k expansion by cumulative log-prob to
  depth D, global re-rank to total_tokens), testable with a fake `step_fn`.
- Checkpoints: a directory with `config.json` and `pytorch_model.bin` or `model.safetensors`, keys as
  published (`fc.weight`, `fc.bias`, `layers.0.self_attn.q_proj.weight`, ...; `embed_tokens.weight`
  is accepted and ignored). qkv bias and fc bias are inferred from the keys. `load_eagle_head` also
  takes a Hugging Face Hub id (downloaded with huggingface_hub where the Hub is reachable; one
  ModelLoadError where it is not). EAGLE-3 checkpoints (fused low/mid/high-layer features through
  a 3 x hidden `fc`, a `midlayer`, their own lm_head) are recognised and refused with one
  ModelLoadError; any other shape mismatch is a ModelLoadError too, never a raw RuntimeError.
- Several GPUs: the head sits on the target's embedding device; the target's features arrive on
  its final norm's device and are moved to the head's in `catch_up` (and `step_fn`).
- Optional reduced draft vocabulary (EAGLE-3's convention): a `d2t` tensor in the weights maps draft
  index i to target id i + d2t[i] (`t2d` is accepted and ignored). Such a head drafts only those
  ids, through the matching rows of the target's lm_head (a 6x smaller matmul on the default model);
  verification is unchanged, so output stays lossless. Published EAGLE-1/2 heads have no `d2t` and
  draft over the full vocabulary.
- Auto budget (`TreeConfig.auto`): the tree is cut to the size that maximises expected tokens per
  millisecond by the one cost model every drafter uses (respec/cost.py), with node probabilities
  = the head's cumulative confidence x its calibration κ; a head that does not pay is switched off
  and probed cheaply (see `Eagle2Drafter`).
"""
from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import torch
from torch import nn
from transformers import DynamicCache, LlamaConfig, Qwen2Config
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding
from transformers.models.qwen2.modeling_qwen2 import Qwen2DecoderLayer

from respec.config import TreeConfig
from respec.cost import MIN_GAIN, CostModel, SizePlan, ancestor_closed_order
from respec.drafters.base import Decision, DraftContext, Proposal, StepOutcome
from respec.errors import ModelLoadError
from respec.models.base import TargetModel
from respec.models.compat import pass_cache_as
from respec.models.kv import slab_cache
from respec.tree import DraftTree

_HEAD_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads", "num_key_value_heads",
              "rms_norm_eps", "rope_theta", "rope_parameters", "max_position_embeddings", "hidden_act",
              "vocab_size", "head_dim")


@dataclass(frozen=True)
class LMHead:
    """A target's output layer as plain tensors (weight [V, H], bias [V] or None), softcap applied
    as the target applies it. `of(target, dtype)` takes the target's own (frozen) weights;
    `subset(ids)` keeps the rows of `ids` only (a reduced vocabulary: index i is token ids[i])."""
    weight: torch.Tensor
    bias: torch.Tensor | None
    softcap: float | None

    @classmethod
    def of(cls, target: TargetModel, dtype: torch.dtype) -> "LMHead":
        head = target.model.get_output_embeddings()
        bias = getattr(head, "bias", None)
        return cls(head.weight.detach().to(dtype), None if bias is None else bias.detach().to(dtype),
                   getattr(target, "softcap", None))

    def subset(self, ids: torch.Tensor) -> "LMHead":
        ids = ids.to(self.weight.device)
        return LMHead(self.weight[ids].contiguous(), None if self.bias is None else self.bias[ids].contiguous(),
                      self.softcap)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        """h [..., H] -> logits [..., V] (or [..., len(ids)] for a subset)."""
        logits = torch.nn.functional.linear(h.to(self.weight.device, self.weight.dtype), self.weight, self.bias)
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits


def _to_target(head: "EagleHead", target: TargetModel, dtype: torch.dtype | None = None) -> "EagleHead":
    """Cast the head to the target's device and dtype (or `dtype`), keeping RoPE's inverse
    frequencies in float32 (as in training; a bf16 inv_freq would shift the angles at long
    positions)."""
    head = head.to(device=target.device, dtype=dtype or target.dtype)
    head.rotary = LlamaRotaryEmbedding(head.config).to(target.device)
    pass_cache_as(head.layers[0])     # the head passes cache=; older transformers name it past_key_values
    return head.eval()


def _rope_theta(config: LlamaConfig) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta", getattr(config, "rope_theta", 10000.0) or 10000.0))


class EagleHead(nn.Module):
    """The EAGLE-1/2 draft head (one decoder layer). Forward works on one sequence."""

    def __init__(self, config: LlamaConfig, *, qkv_bias: bool = False, fc_bias: bool = True) -> None:
        super().__init__()
        config = LlamaConfig(**{**config.to_dict(), "num_hidden_layers": 1})
        config._attn_implementation = "sdpa"
        self.config = config
        self.qkv_bias = qkv_bias
        h = config.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=fc_bias)
        if qkv_bias:
            qcfg = Qwen2Config(**{k: v for k, v in config.to_dict().items() if k != "model_type"})
            qcfg._attn_implementation = "sdpa"
            layer = Qwen2DecoderLayer(qcfg, layer_idx=0)
        else:
            layer = LlamaDecoderLayer(config, layer_idx=0)
        layer.input_layernorm = nn.Identity()        # EAGLE omits layer 0's input norm
        self.layers = nn.ModuleList([layer])
        self.rotary = LlamaRotaryEmbedding(config)
        self.draft_vocab: torch.Tensor | None = None  # [Vd] target ids the head drafts (None = all)
        self._draft_lm: tuple[TargetModel, LMHead] | None = None    # the rows for draft_vocab, cached

    def draft_logits(self, target: TargetModel, out: torch.Tensor) -> torch.Tensor:
        """Logits of predicted features out [q, H] over the draft vocabulary: [q, V] (all target
        ids) or [q, Vd] (index i is target id draft_vocab[i]); the target's own lm_head rows."""
        if self.draft_vocab is None:
            return target.lm_head(out)
        if self._draft_lm is None or self._draft_lm[0] is not target:
            self._draft_lm = (target, LMHead.of(target, target.dtype).subset(self.draft_vocab))
        return self._draft_lm[1](out)

    def forward(self, emb: torch.Tensor, feat: torch.Tensor, positions: torch.Tensor,
                cache: DynamicCache, mask: torch.Tensor | None) -> torch.Tensor:
        """emb, feat: [q, H]; positions: [q]; mask: [1, 1, q, kv_len + q] additive or None (causal).
        Appends q rows to `cache`; returns predicted features f̂: [q, H]."""
        x = self.fc(torch.cat([emb, feat.to(emb.dtype)], dim=-1))[None]           # [1, q, H]
        pos = positions[None]
        cos_sin = self.rotary(x, pos)
        if mask is None and x.shape[1] > 1:
            past = cache.get_seq_length()
            q = x.shape[1]
            allowed = torch.ones(q, past + q, dtype=torch.bool, device=x.device).tril(past)
            mask = torch.zeros(1, 1, q, past + q, dtype=x.dtype, device=x.device)
            mask = mask.masked_fill(~allowed, torch.finfo(x.dtype).min)
        out = self.layers[0](x, attention_mask=mask, position_ids=pos, cache=cache, use_cache=True,
                             position_embeddings=cos_sin)
        if isinstance(out, tuple):
            out = out[0]
        return out[0]


def random_head(target: TargetModel, *, seed: int = 0, qkv_bias: bool = False) -> EagleHead:
    """A randomly initialised head shaped for `target` (lossless, accepts little: for tests)."""
    cfg = LlamaConfig(**{k: v for k, v in target.model.config.to_dict().items() if k in _HEAD_KEYS})
    from respec.models.seeded import built_without_global_rng, seeded_init_

    # a local generator: the caller's global RNG is neither reseeded nor advanced
    head = seeded_init_(built_without_global_rng(lambda: EagleHead(cfg, qkv_bias=qkv_bias)), seed)
    return _to_target(head, target)


HEAD_FILES = ("config.json", "model.safetensors", "pytorch_model.bin")


def resolve_head_dir(spec: str | Path) -> Path:
    """An EAGLE head spec -> a local checkpoint directory: an existing directory as is; otherwise a
    Hugging Face Hub id, fetched (config + weights only) with huggingface_hub into its cache.
    Raises ModelLoadError when it is neither, or the Hub cannot provide it (e.g. offline)."""
    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    text = str(spec).strip()
    from respec.models.loading import _HUB_ID
    if text.startswith((".", "/", "~")) or path.suffix in (".bin", ".safetensors", ".json") or not _HUB_ID.match(text):
        raise ModelLoadError(f"EAGLE head {text!r} not found: {path.resolve()} is not a directory, and it is not "
                             "a Hugging Face Hub id either. Pass a checkpoint directory (config.json + weights) or a "
                             "Hub id such as yuhuili/EAGLE-Vicuna-7B-v1.3.")
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(repo_id=text, allow_patterns=list(HEAD_FILES)))
    except Exception as exc:  # noqa: BLE001 - offline, unknown repo, gated, rate limited: one message
        reason = " ".join(str(exc).split())[:300]
        raise ModelLoadError(
            f"EAGLE head {text!r}: no local directory of that name, and the Hugging Face Hub could not provide it "
            f"({type(exc).__name__}: {reason}). Where the Hub is unreachable, download the head elsewhere and "
            "pass its directory.") from None


def _eagle3_reason(raw: dict, state: dict, hidden: int) -> str | None:
    """Why this checkpoint is an EAGLE-3 head (None if it is not): EAGLE-3 fuses three target
    layers' features (fc: 3H -> H), names its layer `midlayer` and brings its own lm_head."""
    if any(k.startswith("midlayer.") for k in state):
        return "its decoder layer is named `midlayer`"
    if any("eagle3" in str(a).lower() for a in raw.get("architectures") or []):
        return f"its config names the architecture {raw['architectures'][0]}"
    fc = state.get("fc.weight")
    if fc is not None and fc.ndim == 2 and fc.shape[1] == 3 * hidden:
        return f"its fc takes {fc.shape[1]} = 3 x {hidden} inputs (fused low/mid/high-layer features)"
    return None


def load_eagle_head(path: str | Path, target: TargetModel, dtype: torch.dtype | None = None) -> EagleHead:
    """Load a published-format EAGLE-1/2 checkpoint (a directory with config.json + pytorch_model.bin
    or model.safetensors, or a Hub id: see resolve_head_dir) and cast it to the target's device and
    dtype (`dtype`, e.g. float32 for fine-tuning, overrides the latter). EAGLE-3 heads and
    checkpoints of another shape raise ModelLoadError."""
    path = resolve_head_dir(path)
    cfg_file = path / "config.json"
    tried = [str(path / n) for n in ("pytorch_model.bin", "model.safetensors")]
    if not cfg_file.is_file():
        raise ModelLoadError(f"EAGLE head: no config.json in {path}")
    try:
        raw = json.loads(cfg_file.read_text())
        if (path / "pytorch_model.bin").is_file():
            state = torch.load(path / "pytorch_model.bin", map_location="cpu", weights_only=True)
        elif (path / "model.safetensors").is_file():
            from safetensors.torch import load_file
            state = load_file(str(path / "model.safetensors"))
        else:
            raise ModelLoadError(f"EAGLE head: no weights found; tried {', '.join(tried)}")
    except ModelLoadError:
        raise
    except Exception as exc:  # torch.load / safetensors raise many types on corrupt files
        raise ModelLoadError(f"EAGLE head at {path} could not be read: {type(exc).__name__}: {exc}") from None
    eagle3 = _eagle3_reason(raw, state, int(raw.get("hidden_size") or target.hidden_size))
    if eagle3:
        raise ModelLoadError(f"EAGLE head at {path} is an EAGLE-3 head ({eagle3}), which this engine does not "
                             "run: pass an EAGLE-1/2 head (one decoder layer over fc(cat[embedding, feature])) or "
                             "train one with `python -m respec train-eagle`.")
    cfg = LlamaConfig(**{k: v for k, v in raw.items() if k in _HEAD_KEYS})
    if cfg.hidden_size != target.hidden_size:
        raise ModelLoadError(f"EAGLE head at {path} has hidden size {cfg.hidden_size}, "
                             f"but the target has {target.hidden_size}")
    state = {k: v for k, v in state.items() if not k.startswith("embed_tokens") and k != "t2d"}
    d2t = state.pop("d2t", None)
    head = EagleHead(cfg, qkv_bias="layers.0.self_attn.q_proj.bias" in state,
                     fc_bias="fc.bias" in state)
    try:
        missing, unexpected = head.load_state_dict(state, strict=False)
    except RuntimeError as exc:   # size mismatches: name the first one, not torch's whole report
        detail = next((line.strip() for line in str(exc).splitlines() if "size mismatch" in line), str(exc)[:300])
        raise ModelLoadError(f"EAGLE head at {path} does not match its config.json: {detail}") from None
    missing = [k for k in missing if not k.startswith("rotary")]
    if missing or unexpected:
        raise ModelLoadError(f"EAGLE head at {path}: missing keys {missing}, unexpected keys {unexpected}")
    if d2t is not None:
        vocab = torch.arange(d2t.numel()) + d2t.reshape(-1).long()
        n = target.model.get_output_embeddings().weight.shape[0]
        if vocab.numel() == 0 or int(vocab.min()) < 0 or int(vocab.max()) >= n or vocab.unique().numel() != vocab.numel():
            raise ModelLoadError(f"EAGLE head at {path}: its d2t draft vocabulary is not a set of distinct "
                                 f"ids of the target's {n}-token vocabulary")
        head.draft_vocab = vocab
    return _to_target(head, target, dtype)


def save_eagle_head(head: EagleHead, path: str | Path) -> None:
    """Write `head` in the published layout: config.json + model.safetensors (no embed, no lm_head)."""
    from safetensors.torch import save_file
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg = {k: v for k, v in head.config.to_dict().items() if k in _HEAD_KEYS and k != "rope_parameters"}
    cfg.update({"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_hidden_layers": 1,
                "rope_theta": _rope_theta(head.config),
                "bias": head.fc.bias is not None, "qkv_bias": head.qkv_bias})
    state = {k: v.detach().to("cpu").contiguous() for k, v in head.state_dict().items()
             if not k.startswith("rotary")}
    if head.draft_vocab is not None:
        vocab = head.draft_vocab.detach().to("cpu").long()
        state["d2t"] = (vocab - torch.arange(vocab.numel())).contiguous()
        cfg["draft_vocab_size"] = int(vocab.numel())
    (path / "config.json").write_text(json.dumps(cfg, indent=2))
    save_file(state, str(path / "model.safetensors"))


# ---------------------------------------------------------------------------- the search
#: step_fn(feats [k, H], tokens [k], depth i, parent_slots [k] | None) -> (out feats [k, H],
#:     log-probs of each node's children [k, V]). parent_slots[a] is the row, in the previous
#:     call's batch, of frontier node a's parent (None at depth 0: every parent is the root).
StepFn = Callable[[torch.Tensor, torch.Tensor, int, "torch.Tensor | None"], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class _Node:
    token: int
    score: float     # cumulative log q from the root
    parent: int      # index into the node list, -1 = child of the root


def expand_tree(step_fn: StepFn, root: int, root_feat: torch.Tensor, root_logp: torch.Tensor,
                cfg: TreeConfig, vocab: torch.Tensor | None = None) -> DraftTree:
    """EAGLE-2 dynamic tree. root_feat: [H] f̂ predicted at the root's position; root_logp: [V] the
    head's log-probs for the token after the root. Returns a tree of at most cfg.total_tokens nodes.
    With `vocab` [V] (a reduced draft vocabulary), log-prob index i stands for token vocab[i].

    1. Layer 1 = top-k of root_logp (score = log q).
    2. `depth` times: feed the k frontier nodes (features = their parents' outputs), score their
       top-k children by cumulative log-prob, keep the best k of the k² as the next frontier.
    3. Global re-rank: keep the best total_tokens - 1 of all scored nodes. Scores never increase
       along a path and ties break by creation order, so the kept set is ancestor-closed.
    """
    budget = cfg.total_tokens - 1
    if budget <= 0:
        return DraftTree.root_only(root)
    k = min(cfg.top_k, budget, root_logp.shape[-1])
    ids = (lambda ix: ix.cpu()) if vocab is None else (lambda ix: vocab.cpu()[ix.cpu()])
    top = torch.topk(root_logp.float(), k)
    nodes = [_Node(int(t), float(s), -1) for s, t in zip(top.values.tolist(), ids(top.indices).tolist())]
    frontier = list(range(k))
    feats = root_feat[None].expand(k, -1)                                     # [k, H]
    parent_slots = None
    for i in range(cfg.depth):
        tokens = torch.tensor([nodes[j].token for j in frontier], dtype=torch.long)
        out, logp = step_fn(feats, tokens, i, parent_slots)                   # [k', H], [k', V]
        ct = torch.topk(logp.float(), k, dim=-1)                              # [k', k]
        base = torch.tensor([nodes[j].score for j in frontier])[:, None]
        cu = (ct.values.cpu().double() + base.double())                       # [k', k]
        first = len(nodes)
        cand_tok = ids(ct.indices).tolist()
        cu_list = cu.tolist()
        for a, parent in enumerate(frontier):
            for b in range(k):
                nodes.append(_Node(int(cand_tok[a][b]), float(cu_list[a][b]), parent))
        sel = torch.topk(cu.flatten(), min(k, cu.numel())).indices.tolist()
        sel.sort()
        frontier = [first + s for s in sel]
        parent_slots = torch.tensor([s // k for s in sel])                    # [k'']: row of each parent
        feats = out[parent_slots.to(out.device)]
    order = sorted(range(len(nodes)), key=lambda j: (-nodes[j].score, j))[:budget]
    keep = sorted(order)
    index = {j: r + 1 for r, j in enumerate(keep)}
    tokens = [root] + [nodes[j].token for j in keep]
    parents = [-1] + [0 if nodes[j].parent == -1 else index[nodes[j].parent] for j in keep]
    scores = [0.0] + [nodes[j].score for j in keep]
    probs = [1.0] + [math.exp(nodes[j].score - (0.0 if nodes[j].parent == -1 else nodes[nodes[j].parent].score))
                     for j in keep]
    return DraftTree.from_parents(tokens, parents, "eagle", scores=scores, draft_probs=probs)


def capped_tree_config(cfg: TreeConfig, max_nodes: int) -> TreeConfig:
    """`cfg` with total_tokens lowered to `max_nodes` (context room), if needed."""
    if cfg.total_tokens <= max_nodes:
        return cfg
    return dataclasses.replace(cfg, total_tokens=max(1, max_nodes))


def eagle_node_probs(tree: DraftTree, kappa: float) -> list[float]:
    """Acceptance probability of each node (root first, 1): the head's cumulative probability
    exp(score) times its calibration κ, capped at 1 (a monotone map, so children stay <= parents)."""
    if not tree.scores:
        return [1.0] + [0.0] * (tree.size - 1)
    return [1.0] + [min(1.0, kappa * math.exp(s)) for s in tree.scores[1:]]


# ---------------------------------------------------------------------------- the drafter
PROBE_ROWS = 16    # catch-up rows whose head predictions are checked against the committed text
MAX_SKIP = 64      # longest stretch of steps the head sits out before the next probe
SCRATCH_WINDOW = 64  # a probe over a longer queue checks the head on this many last positions first


class Eagle2Drafter:
    """EAGLE-2 drafter with catch-up: hidden states of every committed position are queued and fed to
    the head (with the token that follows each) the next time it drafts, so its KV cache stays in
    sync even after steps it did not draft (retrieval steps in SAM/ReSpec).

    With a cost model (`tree.auto`), each tree is cut to the size that pays (respec/cost.py), node
    probabilities being the head's cumulative confidence times its calibration κ (realised accepted
    tokens / predicted, decayed). A head that does not earn its keep is switched off: after two
    unprofitable drafts in a row it sits out 2^misses steps (at most MAX_SKIP), queueing features
    at no cost; then a cheap probe (the catch-up alone, whose predictions over the queued positions
    are checked against the committed tokens) decides whether even a one-token draft would pay
    before any tree is grown. A request starts with such a probe, so a random head never drafts;
    over a long queue (the prompt, or many steps off) the probe first runs the head on the last
    SCRATCH_WINDOW positions only, in a throwaway cache: a head that matches none of them stays
    off with the queue unfed; any other is fed the whole queue and judged with its full context."""

    name = "eagle2"
    needs_hidden = True

    def __init__(self, target: TargetModel, head: EagleHead, tree: TreeConfig) -> None:
        self.target = target
        self.head = head
        self.tree_cfg = tree
        self.cache = slab_cache(head.config)
        self._pending: list[torch.Tensor] = []   # each [m_i, H]: features of committed positions
        self._reset_auto()

    def _reset_auto(self) -> None:
        # calibration sums (decayed), miss streak, back-off and probe state for useless drafting
        self._pred_sum = self._real_sum = 0.0
        self._misses = 0
        self._skip = 0
        self._probing = True
        self._last_pred: float | None = None
        self._hits = self._rows = 0               # the last catch-up's top-1 check
        self.last_auto: dict | None = None

    @property
    def kappa(self) -> float:
        """Calibration: realised accepted tokens / predicted (Σ exp score), decayed, prior 1."""
        return (self._real_sum + 1.0) / (self._pred_sum + 1.0)

    @property
    def kv_len(self) -> int:
        return self.cache.get_seq_length()

    def reset(self, prompt: Sequence[int], prompt_hidden: torch.Tensor | None) -> None:
        self.cache = slab_cache(self.head.config)
        self._pending = [] if prompt_hidden is None else [prompt_hidden]
        self._reset_auto()

    def observe(self, outcome: StepOutcome) -> None:
        if outcome.committed_hidden is not None:
            self._pending.append(outcome.committed_hidden)
        if self._last_pred is not None and outcome.proposal.source == "eagle":
            self._pred_sum = 0.9 * self._pred_sum + self._last_pred
            self._real_sum = 0.9 * self._real_sum + outcome.verdict.num_accepted
        self._last_pred = None

    def _pending_pairs(self, committed: Sequence[int], root: int) -> tuple[torch.Tensor, list[int], int]:
        """The queued features [m, H] (on the head's device), the token that follows each (the
        last one is `root`), and the head position of the first. Leaves the queue as it is."""
        # Features come from the target's final norm, which under device_map="auto" can sit on
        # another GPU than the head (placed with the embedding): move them to the head.
        head_dev = self.head.fc.weight.device
        feats = torch.cat([p.to(head_dev) for p in self._pending], dim=0)          # [m, H] on the head's device
        start = self.kv_len
        m = feats.shape[0]
        nxt = list(committed[start + 1:start + m]) + [root]
        if len(nxt) != m:
            raise RuntimeError(f"EAGLE catch-up out of sync: {m} features, {len(nxt)} tokens")
        return feats, nxt, start

    def _feed(self, feats: torch.Tensor, nxt: Sequence[int], start: int, cache, check: bool
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the head over pairs (feats [m, H], nxt [m]) at head positions start.. into `cache`.
        Returns f̂ [H] and log-probs [V] at the last position; with `check`, sets `self._hits` of
        `self._rows`: how many of the last PROBE_ROWS positions' top-1 is the token that followed."""
        m = feats.shape[0]
        dev = self.target.device
        tok = torch.tensor(list(nxt), dtype=torch.long, device=dev)
        pos = torch.arange(start, start + m, device=dev)
        out = self.head(self.target.embed(tok), feats, pos, cache, None)           # [m, H]
        r = min(m - 1, PROBE_ROWS) if check else 0
        logits = self.head.draft_logits(self.target, out[m - 1 - r:]).float()       # [r + 1, V]
        if r > 0:
            top = logits[:-1].argmax(dim=-1).cpu()                                  # [r]
            if self.head.draft_vocab is not None:
                top = self.head.draft_vocab.cpu()[top]
            self._hits = int((top == torch.tensor(list(nxt[m - r:]))).sum())
            self._rows = r
        else:
            self._hits = self._rows = 0
        return out[-1], torch.log_softmax(logits[-1], dim=-1)                      # [H], [V]

    @torch.inference_mode()
    def catch_up(self, committed: Sequence[int], root: int, check: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Feed pending pairs (f_t, x_{t+1}), the last one pairing with `root`, into the head's
        cache. Returns the head's prediction at the root position: f̂ [H] and log-probs [V]. With
        `check`, also counts how many of the last PROBE_ROWS fed positions the head's top-1
        predicts the committed token that followed (`self._hits` of `self._rows`): its depth-1
        acceptance, teacher-forced."""
        feats, nxt, start = self._pending_pairs(committed, root)
        self._pending = []
        return self._feed(feats, nxt, start, self.cache, check)

    @torch.inference_mode()
    def scratch_check(self, committed: Sequence[int], root: int) -> None:
        """The probe's check without the catch-up: the head runs over the last SCRATCH_WINDOW
        queued pairs only, in a throwaway cache (so it sees at most that much context), and sets
        `self._hits` of `self._rows`. The queue stays, so a head that stays off never pays for
        feeding it a long prompt."""
        feats, nxt, start = self._pending_pairs(committed, root)
        w = min(SCRATCH_WINDOW, feats.shape[0])
        m = feats.shape[0]
        self._feed(feats[m - w:], nxt[m - w:], start + m - w, slab_cache(self.head.config), check=True)

    @torch.inference_mode()
    def draft_tree(self, committed: Sequence[int], root: int, cfg: TreeConfig | None = None,
                   cost: CostModel | None = None) -> DraftTree:
        """The EAGLE-2 tree after `root`; with `cost` (tree.auto), cut to the size that pays and
        possibly root-only (the head switched off). `last_auto` then records the prediction."""
        cfg = cfg or self.tree_cfg
        self.last_auto = None
        if cfg.total_tokens <= 1:
            # No draft wanted: leave the pending pairs queued; a later draft catches up in one batch.
            return DraftTree.root_only(root)
        if cost is not None and self._skip > 0:
            self._skip -= 1
            self.last_auto = {"kept": 1, "reason": f"auto: the head did not pay recently; "
                                                     f"next probe in {self._skip + 1} steps"}
            return DraftTree.root_only(root)
        t0 = time.perf_counter()
        if not self._pending and self.kv_len == 0:
            raise RuntimeError("EAGLE drafter used before reset")
        probing = cost is not None and self._probing
        if probing and sum(p.shape[0] for p in self._pending) > SCRATCH_WINDOW:
            # a long queue (a prompt, or many steps with the head off): judge the head on its tail
            # first, and feed the whole queue only if it is worth drafting with
            self.scratch_check(committed, root)
            if self._hits == 0:              # matched nothing even there: off, the queue unfed
                self._probe_pays(cost, (time.perf_counter() - t0) * 1000)
                return DraftTree.root_only(root)
            # some hits: judge it with its full context (a short window must not turn a good head off)
            f, logp = self.catch_up(committed, root, check=True)
            if not self._probe_pays(cost, (time.perf_counter() - t0) * 1000):
                return DraftTree.root_only(root)
        else:
            f, logp = self.catch_up(committed, root, check=probing)
            if probing and not self._probe_pays(cost, (time.perf_counter() - t0) * 1000):
                return DraftTree.root_only(root)
        self._probing = False
        stable = self.kv_len
        dev = self.target.device
        dtype = self.target.dtype
        # Tree-mask rows of the batch fed last, over every draft slot fed so far: a node sees its
        # parent's row plus itself (EAGLE's tmask[parent_slots] ++ I).
        # Built on the device (no [kq, kv] host mask copied each depth).
        head_dev = self.head.fc.weight.device
        last_rows = torch.zeros(0, 0, dtype=torch.bool, device=head_dev)

        def step_fn(feats: torch.Tensor, tokens: torch.Tensor, depth: int, parent_slots: torch.Tensor | None):
            nonlocal last_rows
            kq = tokens.shape[0]
            n_fed = last_rows.shape[1]
            prev = (torch.zeros(kq, n_fed, dtype=torch.bool, device=head_dev) if parent_slots is None
                    else last_rows[parent_slots.to(head_dev)])
            last_rows = torch.cat([prev, torch.eye(kq, dtype=torch.bool, device=head_dev)], dim=1)  # [kq, n_fed + kq]
            mask = torch.zeros(1, 1, kq, stable + n_fed + kq, dtype=dtype, device=head_dev)      # [1, 1, kq, kv]
            mask[0, 0, :, stable:].masked_fill_(~last_rows, torch.finfo(dtype).min)
            pos = torch.full((kq,), stable + depth, dtype=torch.long, device=dev)
            out = self.head(self.target.embed(tokens.to(dev)), feats.to(head_dev), pos, self.cache, mask)  # [kq, H]
            return out, torch.log_softmax(self.head.draft_logits(self.target, out).float(), dim=-1)  # [kq, V]

        try:
            tree = expand_tree(step_fn, root, f, logp, cfg, vocab=self.head.draft_vocab)
        finally:
            added = self.kv_len - stable
            if added > 0:
                self.cache.crop(-added)      # the draft tree's KV is scratch: keep the context only
        if cost is not None:
            tree = self._plan(tree, cost, (time.perf_counter() - t0) * 1000)
        return tree

    def _probe_pays(self, cost: CostModel, probe_ms: float = 0.0) -> bool:
        """After a catch-up with `check`: would a one-token draft at the head's observed top-1 rate
        (hits / (rows + 2): cautious, so a handful of rows cannot switch a head on by luck) beat a
        plain step, with drafting costing at least what this probe did? If not, sit out longer."""
        acc = self._hits / (self._rows + 2.0)
        draft_ms = max(cost.draft_ms("eagle"), probe_ms)
        plan = SizePlan.at([acc], 2, cost.curve(), draft_ms)
        if plan.rate_vs_plain >= 1.0 + MIN_GAIN:
            return True
        # a head that matched nothing over many rows is plainly useless: back off twice as fast
        self._misses += 2 if (self._hits == 0 and self._rows >= PROBE_ROWS // 2) else 1
        self._skip = min(MAX_SKIP, 2 ** self._misses)
        self.last_auto = {**plan.to_dict(), "kept": 1, "probe_hits": self._hits, "probe_rows": self._rows,
                          "reason": f"auto probe: the head's top-1 matched {self._hits} of the last "
                                    f"{self._rows} tokens; a 1-token draft would run at "
                                    f"{plan.rate_vs_plain:.2f}x a plain step → head off for {self._skip} steps"}
        return False

    def _plan(self, tree: DraftTree, cost: CostModel, draft_ms: float) -> DraftTree:
        probs = eagle_node_probs(tree, self.kappa)
        order = ancestor_closed_order(tree.parents, probs)
        plan = cost.plan("eagle", [probs[i] for i in order], draft_ms)
        pruned = tree.subtree(order[:plan.size - 1])
        if plan.rate_vs_plain < 1.0:
            self._misses += 1
            if self._misses >= 2:
                self._skip = min(MAX_SKIP, 2 ** self._misses)
                self._probing = True
        else:
            self._misses = 0
        self._last_pred = sum(probs[i] for i in order[:plan.size - 1])
        self.last_auto = {**plan.to_dict(), "kappa": round(self.kappa, 3),
                          "context_offset_ms": round(cost.context_offset_ms, 2),
                          "reason": f"auto: kept {plan.size - 1} of {tree.size - 1} nodes, expected "
                                    f"{plan.expected_tokens:.2f} tokens/step at {plan.rate_vs_plain:.2f}x "
                                    f"a plain step (κ={self.kappa:.2f})"}
        return pruned

    def propose(self, ctx: DraftContext) -> Proposal:
        tree = self.draft_tree(ctx.tokens, ctx.root, capped_tree_config(self.tree_cfg, ctx.max_nodes), ctx.cost)
        source = "eagle" if tree.num_draft else "none"
        decision = None
        if self.last_auto is not None:
            decision = Decision(source=source, reason=self.last_auto["reason"],
                                extra={"cost": dict(self.last_auto)})
        return Proposal(tree=tree, source=source, decision=decision)
