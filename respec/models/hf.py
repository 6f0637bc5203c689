"""HF causal-LM adapter implementing TargetModel through public arguments only.

Contract: works with any transformers decoder whose base model returns `last_hidden_state` after
the final norm and whose output layer is `get_output_embeddings()` (Llama, Qwen2, Mistral, Gemma...).
Tree verification passes an additive 4D float mask of shape (1, 1, n, kv_len + n) and explicit
position ids kv_len + depth; chains and single tokens use the model's own causal mask (identical
logits, fewer allocations). The KV cache is transformers' own DynamicCache with its full-attention
layers stored in growing slabs (respec/models/kv.py: no whole-cache copy per forward); on every
device, masked tree forwards and one-token forwards fold the query heads of each KV head into its rows
(respec/models/attention.py). A tree goes to the device in one upload (tokens, depths, parents, ancestor
mask; respec/transfer.py), and forward_tree hands the uploaded tokens and parents on. Compaction after a non-prefix path gathers the kept rows of every
layer along the sequence axis, then crops
(`DynamicCache.crop` takes a NEGATIVE count in transformers 5; see shared/models/README.md §3.2).
Eager CPU forwards (and a tree's output layer) run the linears that `linear_layouts`
measured faster that way as W @ x^T (one-row ones as two rows) (respec/accel/linear_layout.py; a function
mode around the call, the model untouched). No modeling file is forked or patched.

Installed-version and placement guards (respec/models/compat.py): the cache goes in under the
keyword the installed transformers names (`cache` in 5.24, `past_key_values` in older 5.x; an
unnamed keyword would be silently dropped), and a model with meta or CPU/disk-offloaded weights is
refused with one ModelLoadError. Several GPUs (device_map="auto"): input ids go to the embedding's
device, `hidden` comes back on the final norm's device (drafters move it to their head), and the
verify-cost curve synchronises every CUDA device holding weights.
"""
from __future__ import annotations

import contextlib
import time
from typing import TYPE_CHECKING, Iterator, Sequence

import torch
from transformers import DynamicCache

from respec.errors import ConfigError
from respec.models.attention import additive_mask, use_tree_attention
from respec.models.base import ForwardInfo, LoadedModel, TargetOutput
from respec.models.compat import cache_kwarg, check_placement, check_transformers, cuda_devices
from respec.models.kv import slab_cache
from respec.models.timing import fastest_of_rounds
from respec.transfer import barrier, upload, upload_parts
from respec.tree import DraftTree

try:     # the speed machinery is optional: without respec.accel every forward runs eagerly, unplanned
    from respec.accel.head_compile import prepare_head
    from respec.accel.linear_layout import linear_layouts
    from respec.accel.target_compile import CompiledForward
except ImportError:
    prepare_head = linear_layouts = CompiledForward = None

if TYPE_CHECKING:
    from respec.accel.linear_layout import LinearLayouts


class HFTarget:
    def __init__(self, model, *, eos_token_ids: frozenset[int] = frozenset(), context_length: int | None = None,
                 name: str = "model", tokenizer=None, loaded: "LoadedModel | None" = None,
                 layouts: "LinearLayouts | None" = None) -> None:
        check_transformers()
        check_placement(model, name)
        self.model = model.eval()
        # eager forwards hand some linears to the BLAS as W @ x^T where this CPU runs them
        # faster that way (respec/accel/linear_layout.py; measured here unless given, as a twin is)
        if layouts is None and linear_layouts is not None:
            layouts = linear_layouts(model)
        self.linear_layouts = layouts         # None: no plan (respec.accel not importable)
        # masked multi-token forwards skip repeat_kv on the CPU (attention.py); other models get no extra kwarg
        self._tree_kwargs = {"respec_gqa": True} if use_tree_attention(model) else {}
        self.tokenizer = tokenizer
        self.name = name
        self.loaded = loaded            # load facts (spec, source, ...) when built by load_target, else None
        cfg = model.config
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.hidden_size = int(cfg.hidden_size)
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.context_length = int(context_length or getattr(cfg, "max_position_embeddings", 2048))
        self.softcap = getattr(cfg, "final_logit_softcapping", None)
        self._base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self._head = model.get_output_embeddings()
        self._embed = model.get_input_embeddings()
        self.cache: DynamicCache | None = None
        self._pending: int = 0          # tree nodes fed by the last forward_tree, not yet kept
        self._cache_kw = cache_kwarg(self._base.forward)      # "cache" (5.24) or "past_key_values"
        self._cuda_devices = cuda_devices(model)              # synchronised around timed forwards
        self._cost_curves: dict[int, dict[int, float]] = {}   # context -> {tree size: ms} (verify_cost_curve)
        self.feature_layers: tuple[int, ...] | None = None    # use_features: None = final-norm features
        self._captured: dict[int, torch.Tensor] = {}          # layer id -> its input in the last forward
        self._hooks: list = []
        self.fast: "CompiledForward | None" = None             # the compiled forward (enable_compile), else eager

    # ------------------------------------------------------------------ properties
    @property
    def device(self) -> torch.device:
        return self._embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self._embed.weight.dtype

    @property
    def weight_devices(self) -> tuple[torch.device, ...]:
        """Every CUDA device holding weights (several under device_map="auto"), else the model's device."""
        return self._cuda_devices or (self.device,)

    @property
    def pad_token_id(self) -> int:
        """The tokenizer's pad id, else the model config's, else the smallest stop token (else 0)."""
        for v in (getattr(self.tokenizer, "pad_token_id", None), getattr(self.model.config, "pad_token_id", None)):
            if isinstance(v, int):
                return v
        return min(self.eos_token_ids) if self.eos_token_ids else 0

    @property
    def base_model(self):
        """The decoder (embeddings, layers, final norm) whose forward a compile traces."""
        return self._base

    @property
    def cache_keyword(self) -> str:
        """The keyword the installed transformers takes the cache under ("cache" or "past_key_values")."""
        return self._cache_kw

    @property
    def kv_len(self) -> int:
        """Committed positions in the cache."""
        if self.cache is None:
            return 0
        return self.cache.get_seq_length() - self._pending

    # ------------------------------------------------------------------ seam
    def reset(self) -> None:
        self.cache = slab_cache(self.model.config)
        self._pending = 0

    def lm_head(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = self._head(hidden.to(self._head.weight.device))
        if self.softcap:
            logits = torch.tanh(logits / self.softcap) * self.softcap
        return logits

    def embed(self, tokens: torch.Tensor) -> torch.Tensor:
        return self._embed(tokens.to(self.device))

    def use_features(self, layers: Sequence[int] | None) -> None:
        """`hidden` from now on: None = final-norm features; layer ids = those decoder layers'
        inputs (forward pre-hooks, read back in the ids' order), concatenated: [n, len(ids) x H]."""
        layers = None if layers is None else tuple(int(i) for i in layers)
        if layers == self.feature_layers:
            return
        for h in self._hooks:
            h.remove()
        self._hooks, self._captured, self.feature_layers = [], {}, layers
        if layers is None:
            return
        blocks = self._base.layers
        bad = [i for i in layers if not 0 <= i < len(blocks)]
        if bad:
            raise ValueError(f"feature layers {bad} out of range: {self.name} has {len(blocks)} decoder layers")

        def capture(i: int):
            def hook(module, args, kwargs):
                self._captured[i] = args[0] if args else kwargs["hidden_states"]
            return hook

        self._hooks = [blocks[i].register_forward_pre_hook(capture(i), with_kwargs=True) for i in sorted(set(layers))]
        if self.fast is not None:              # the compiled steps now return layer inputs: other graphs
            self.fast.features_changed(self)

    def batch_features(self, out) -> torch.Tensor:
        """The last forward's `hidden` (see use_features) for its whole batch: [B, T, H] or
        [B, T, len(layers) x H]."""
        last = out.last_hidden_state
        if self.feature_layers is None:
            return last
        inputs = getattr(out, "hidden_states", None) or self._captured    # hidden_states[i]: layer i's input
        return torch.cat([inputs[i].to(last.device) for i in self.feature_layers], dim=-1)

    def _features(self, out) -> torch.Tensor:
        """`batch_features` of a one-sequence forward: [n, F]."""
        return self.batch_features(out)[0]

    def _layouts(self, rows: int):
        """The eager linear plan's context for a forward of `rows` rows (a no-op without a plan)."""
        return self.linear_layouts.active(rows) if self.linear_layouts is not None else contextlib.nullcontext()

    def _forward(self, *, compiled: bool = False, **kwargs):
        """The base model over the engine's cache, passed under the installed version's keyword.
        `compiled`: through the compiled forward once `enable_compile` ran (every method's steps,
        vanilla's included; prefills stay eager; respec/accel/target_compile.py)."""
        self._captured.clear()
        rows = int(kwargs["input_ids"].shape[1])
        if compiled and self.runs_compiled(rows):
            return self.fast.forward(self, kwargs)
        with self._layouts(rows):
            return self._base(**{self._cache_kw: self.cache}, use_cache=True, **kwargs)

    @property
    def compiled(self) -> bool:
        return self.fast is not None

    def runs_compiled(self, rows: int) -> bool:
        """Whether a step forward of `rows` rows runs through the compiled graphs (else eagerly:
        no compile, or a tree past the buckets where the eager forward measured faster)."""
        return self.fast is not None and self.fast.runs(rows)

    def describe_forward(self) -> ForwardInfo:
        """How this target's forwards run (the trace's meta, the bench's machine record, the
        head's back-off key)."""
        fast = self.fast
        return ForwardInfo(compiled=fast is not None,
                           linear_layout=self.linear_layouts.describe() if self.linear_layouts is not None else "",
                           static_buckets=() if fast is None else tuple(fast.buckets),
                           eager_from_rows=None if fast is None else fast.eager_from,
                           detail="" if fast is None else fast.describe())

    def prepare_head(self, head) -> None:
        """Make an EAGLE head run as this target's forward does: compiled with it once this
        target is compiled, else with its own eager linear plan (respec/accel/head_compile.py);
        nothing without respec.accel."""
        if prepare_head is not None:
            prepare_head(head, self)

    def enable_compile(self, progress: bool = True, pause=None) -> float:
        """Compile the base forward and output layer and pay their compiles now
        (respec/accel/target_compile.py); returns the warm-up's seconds (`pause`: see
        compiled.warm_up). Measured verify-cost curves are dropped (they timed the eager forward).
        ConfigError where respec.accel cannot be imported."""
        if CompiledForward is None:
            raise ConfigError("compiling needs respec.accel, which cannot be imported here; run with --compile off")
        if self.fast is not None:                        # already compiled: pay any new compiles only
            return self.fast.warm_up(self, progress=progress, pause=pause)
        self.fast = CompiledForward.build(self)
        self._cost_curves.clear()
        return self.fast.enable(self, progress=progress, pause=pause)

    def twin(self) -> "HFTarget":
        """Another target over the same weights, with its own cache and nothing compiled: a
        background compile warms it up (`enable_compile`) while this one serves, then this one
        takes its graphs (`adopt_compiled`). Final-norm features only (no layer hooks to share)."""
        if self.feature_layers is not None:
            raise ValueError("a target reading layer inputs (an EAGLE-3 head) compiles in place, not through a twin")
        return HFTarget(self.model, eos_token_ids=self.eos_token_ids, context_length=self.context_length,
                        name=self.name, tokenizer=self.tokenizer, loaded=self.loaded, layouts=self.linear_layouts)

    def adopt_compiled(self, twin: "HFTarget") -> None:
        """Run this target's steps through `twin`'s compiled forward and output layer from the next
        forward on (twin: `self.twin()` after its `enable_compile`). Cost curves measured so far
        timed the eager forward and are dropped. Call it between steps (the app holds its step lock)."""
        if twin.model is not self.model or not twin.compiled:
            raise ValueError("adopt_compiled takes a compiled twin of this target (HFTarget.twin, enable_compile)")
        self.fast = twin.fast
        self._cost_curves.clear()

    @torch.inference_mode()
    def prefill(self, tokens: Sequence[int]) -> TargetOutput:
        self.reset()
        ids = torch.tensor([list(tokens)], dtype=torch.long, device=self.device)   # [1, n]
        out = self._forward(input_ids=ids)
        hidden = out.last_hidden_state[0]                                            # [n, H]
        with self._layouts(1):
            logits = self.lm_head(hidden[-1:]).float()                               # [1, V]
        return TargetOutput(logits=logits, hidden=self._features(out))               # [n, F]

    @torch.inference_mode()
    def forward_tree(self, tree: DraftTree, need_hidden: bool = True) -> TargetOutput:
        if self.cache is None:
            raise RuntimeError("forward_tree before prefill")
        if self._pending:
            raise RuntimeError("forward_tree called twice without keep()")
        past = self.kv_len
        n = tree.size
        is_chain = all(p == i - 1 for i, p in enumerate(tree.parents))
        # ONE upload: tokens, depths, parents and (for a branching tree) the [n, n] ancestor mask; the
        # [n, past + n] additive mask is built on the device
        parts = [tree.tokens, tree.depths(), [max(p, 0) for p in tree.parents]]
        if not is_chain:
            parts.append(tree.attention_mask().flatten().to(torch.long).tolist())  # host
        got = upload_parts(parts, self.device, label="tree")
        ids, depths, parents = got[0], got[1], got[2]                                # each [n]
        mask = None      # a chain: the model's causal mask equals the chain's ancestor mask
        if not is_chain:
            blocked = got[3].view(n, n) == 0                                               # [n, n]
            mask = additive_mask(blocked, past, self.dtype)                                # [1,1,n,past+n]
        out = self._forward(compiled=True, input_ids=ids[None], attention_mask=mask, position_ids=(past + depths)[None],
                            **self._tree_kwargs)
        self._pending = n
        hidden = out.last_hidden_state[0]                                            # [n, H]
        head_device = self._head.weight.device
        tokens, parents = ids.to(head_device), parents.to(head_device)                # [n], [n]
        table = None
        if self.runs_compiled(n):                             # numbers fused: [n, V], [n, 7]
            logits, table = self.fast.logits(hidden.to(head_device), tokens, parents)
        else:
            with self._layouts(n):
                logits = self.lm_head(hidden).float()                              # [n, V] float32
        return TargetOutput(logits=logits, hidden=self._features(out) if need_hidden else None,   # [n, F]
                            tokens=tokens, parents=parents, numbers=table)

    COST_SIZES = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64)

    @torch.inference_mode()
    def verify_cost_curve(self, max_size: int = 64, context: int = 256, reps: int = 4) -> dict[int, float]:
        """Milliseconds of one tree forward of n tokens after `context` cached tokens, for the sizes
        of COST_SIZES up to `max_size` (and `max_size` itself), and, with compiled trees padded to
        static buckets, the sizes where their cost steps (compiled.bucket_edges: interpolated
        between 2 and 4, 3 rows looked cheaper than the 4 they run as). Measured once per size and
        cached on the target per context length (`measured_curve`); one untimed warm-up per size,
        then `reps` rounds that each time every size in turn, and the fastest of each size's rounds
        (other processes only ever add time; rounds interleave the sizes, so a busy spell cannot
        bend the curve's shape). The engine's own cache is left untouched."""
        context = max(1, min(context, self.context_length // 2))
        curve = self._cost_curves.setdefault(context, {})
        # buckets and the two-row graph are set only with the compiled forward: an eager curve
        # measures COST_SIZES alone
        edges = self.fast.cost_sizes() if self.fast is not None else ()
        sizes = sorted({n for n in self.COST_SIZES + edges if n <= max_size}
                       | {max(1, max_size)} | {1})
        missing = [n for n in sizes if n not in curve]
        if not missing:
            return {n: curve[n] for n in sizes}
        with self.prefilled_scratch(context):
            trees = {n: DraftTree.chain(1, [2 + (i % 50) for i in range(n - 1)], "eagle")
                     for n in missing if n + context <= self.context_length}
            sizes_timed = list(trees)
            curve.update(zip(sizes_timed, fastest_of_rounds(sizes_timed, lambda n: self.timed_tree(trees[n]),
                                                            max(1, reps))))
        return {n: curve[n] for n in sizes if n in curve}

    @contextlib.contextmanager
    def prefilled_scratch(self, context: int) -> Iterator[None]:
        """A scratch cache (`scratch_cache`) holding `context` prefilled tokens, for timing forwards."""
        with self.scratch_cache():
            self._forward(input_ids=torch.arange(context, device=self.device)[None] % min(self.vocab_size, 1000))
            yield

    def timed_tree(self, tree: DraftTree) -> float:
        """Milliseconds of one forward of `tree` on the current cache, which is then cut back to
        what it held (every GPU holding layers synchronised before and after)."""
        barrier(self._cuda_devices, "cost curve")
        t0 = time.perf_counter()
        self.forward_tree(tree, need_hidden=False)
        barrier(self._cuda_devices, "cost curve")
        ms = (time.perf_counter() - t0) * 1000
        self.keep([0])
        self.cache.crop(-1)
        return ms

    @contextlib.contextmanager
    def scratch_cache(self) -> Iterator[None]:
        """Forwards inside run on a fresh cache; the engine's cache (and its pending tree) come back after."""
        saved, saved_pending = self.cache, self._pending
        self.cache, self._pending = slab_cache(self.model.config), 0
        try:
            yield
        finally:
            self.cache, self._pending = saved, saved_pending

    def measured_curve(self, context: int = 256) -> dict[int, float]:
        """What `verify_cost_curve` has measured so far at `context` cached tokens ({} if nothing)."""
        return dict(self._cost_curves.get(max(1, min(context, self.context_length // 2)), {}))

    @torch.inference_mode()
    def nll(self, prompt: Sequence[int], output: Sequence[int]) -> tuple[float, int]:
        """Total negative log-likelihood (nats) of `output` after `prompt` under the target, and the
        number of scored tokens. Uses its own cache; resets the engine's cache (call between runs)."""
        self.reset()
        ids = upload([list(prompt) + list(output)], self.device, label="nll")          # [1, n]
        hidden = self._forward(input_ids=ids).last_hidden_state[0]
        n = len(output)
        logits = self.lm_head(hidden[len(prompt) - 1:len(prompt) - 1 + n]).float()      # [n, V]
        lp = torch.log_softmax(logits, dim=-1).gather(1, ids[0, len(prompt):, None])[:, 0]
        self.reset()
        return float(-lp.sum()), n

    @torch.inference_mode()
    def keep(self, path: Sequence[int], index: torch.Tensor | None = None) -> None:
        """Commit the rows of `path` (root first, ascending node indices) of the last tree. `index`:
        `path` already on a device ([len(path)] int64), so a non-prefix path costs no upload here."""
        n, past = self._pending, self.kv_len
        path = list(path)
        if not path or path[0] != 0:
            raise ValueError("the kept path must start at the root (node 0)")
        if path != list(range(len(path))):
            # Non-prefix path: move the kept rows to the front of the tree block, per layer.
            # e.g. past=10, path=[0, 2, 5]: rows 10,12,15 -> 10,11,12; then drop 3 trailing rows.
            # The index goes to each device once (one copy per GPU, not two per layer).
            src = (upload(path, self.device, label="keep") if index is None else index) + past   # [len(path)]
            on_device = {src.device: src}
            for layer in self.cache.layers:
                for name in ("keys", "values"):
                    t = getattr(layer, name)                                         # [B, H, S, D]
                    idx = on_device.get(t.device)
                    if idx is None:
                        idx = on_device[t.device] = src.to(t.device)
                    t[:, :, past:past + len(path)] = t.index_select(2, idx)
        drop = n - len(path)
        if drop > 0:
            self.cache.crop(-drop)
        self._pending = 0
