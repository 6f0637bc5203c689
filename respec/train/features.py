"""What a batch of training examples becomes: token ids and loss mask, target features, draft vocabulary.

Contract:
- `collate(examples, max_len)`: ids [B, T] right-padded and the loss mask [B, T-1] over predicted
  features (entry t covers f̂_{t+1}: a real position with t+1 >= the example's start).
- `target_features(target, ids, layers=None)`: the frozen target's final-norm hidden states
  [B, T, H]; with `layers` (an EAGLE-3 head's), those followed by the inputs of those decoder
  layers: [B, T, (1 + len(layers)) x H].
- `FeatureCache`: those features computed once per example (the target is frozen, so they never
  change), kept on the CPU in the target's dtype: tokens x hidden x 2 bytes (about 0.5 GB for 450k
  tokens of a 576-wide model); optionally read from and written back (atomically) to a
  safetensors store keyed by example key and token ids, so a later run computes only what is new;
  while computing, shards beside the store keep what is done, so a stopped run resumes; above
  `merge_bytes` the shards stay and are the store.
- `frequent_next_tokens(examples, n, max_len)`: the reduced cross-entropy and draft vocabulary.
Nothing is computed or read at import.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Iterable, Sequence

import torch

from respec._io import atomic_path
from respec.train.data import Example


def collate(examples: Sequence[Example], max_len: int, pad: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [B, T] right-padded, and the loss mask over predicted features [B, T-1] (entry t covers
    f̂_{t+1}: real, and t+1 >= start)."""
    seqs = [list(e.ids[:max_len]) for e in examples]
    T = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), T), pad, dtype=torch.long)
    mask = torch.zeros((len(seqs), T - 1), dtype=torch.bool)
    for i, (s, e) in enumerate(zip(seqs, examples)):
        ids[i, :len(s)] = torch.tensor(s)
        lo = max(e.start, 1)
        if lo < len(s):
            mask[i, lo - 1:len(s) - 1] = True
    return ids, mask


@torch.inference_mode()
def target_features(target, ids: torch.Tensor, layers: Sequence[int] | None = None) -> torch.Tensor:
    """Final-norm hidden states [B, T, H] of a right-padded batch (padding only follows real tokens,
    so the causal mask alone keeps real positions exact); with `layers`, followed by those decoder
    layers' inputs (HFTarget.use_features): [B, T, (1 + len(layers)) x H]."""
    if layers is None:
        return target._base(input_ids=ids.to(target.device), use_cache=False).last_hidden_state
    before = target.feature_layers
    target.use_features(layers)
    try:
        out = target._base(input_ids=ids.to(target.device), use_cache=False)
        return torch.cat([out.last_hidden_state, target.batch_features(out)], dim=-1)
    finally:
        target.use_features(before)


class FeatureCache:
    """Target features of each example, computed once: key -> [min(len, max_len), H] in the target's
    dtype on the CPU. Examples go in key order, runs of about a shard's tokens each batched by
    similar length so little padding is computed (`_order`)."""

    def __init__(self, target, examples: Sequence[Example], max_len: int, batch_tokens: int = 4096,
                 progress: bool = True, store: Path | None = None, layers: Sequence[int] | None = None,
                 shard_tokens: int = 100_000, merge_bytes: int = 1 << 30) -> None:
        """With `store` (a safetensors file), features found there for the same example (its key
        and token ids) and at least the needed length are reused, and the file is rewritten with
        every example's features after computing the rest: a later run skips the target forwards.
        While computing, every `shard_tokens` new tokens go to a shard beside the store
        (`<store stem>.shard-NNNNN.safetensors`, written atomically, read like the store), so a run
        stopped at any minute loses at most one shard's forwards; the final rewrite removes them. Above
        `merge_bytes` of features in all (a 1.5B target's 1.2M tokens are 3.5 GB) the store is not
        rewritten, which would hold every feature twice in memory and on disk: the last features go
        to one more shard, and the shards (with the store, where one exists) are the store; so too
        when the files hold features of examples this run does not want (`--max-examples`), which a
        rewrite with this run's examples only would lose.
        `layers`: an EAGLE-3 head's feature layers (`target_features`), stored under their own names."""
        from tqdm.auto import tqdm
        self.feats: dict[str, torch.Tensor] = {}
        self.layers = None if layers is None else tuple(layers)
        wanted = {e.key: e for e in examples}
        files = self._files(Path(store)) if store is not None else []
        saved = self._load(files, wanted, max_len)
        self.feats.update(saved)
        fresh: list[Example] = []                      # computed since the last shard was written
        todo = self._order([e for k, e in wanted.items() if k not in saved], max_len, shard_tokens)
        bar = tqdm(total=sum(min(len(e.ids), max_len) for e in todo), desc="target features", unit="tok",
                   disable=not progress)
        i = 0
        while i < len(todo):
            j = i + 1
            while j < len(todo) and min(len(todo[j].ids), max_len) * (j - i + 1) <= batch_tokens:
                j += 1
            group = todo[i:j]
            ids, _ = collate(group, max_len)
            f = target_features(target, ids, self.layers).cpu()
            for k, e in enumerate(group):
                n = min(len(e.ids), max_len)
                self.feats[e.key] = f[k, :n].clone()
                bar.update(n)
            fresh += group
            if store is not None and sum(min(len(e.ids), max_len) for e in fresh) >= shard_tokens:
                self._write(self._shard(Path(store)), fresh)
                fresh = []
            i = j
        bar.close()
        if store is not None and todo:
            total = sum(self.feats[k].numel() * self.feats[k].element_size() for k in wanted)
            if total <= merge_bytes and not self.others:   # one file: the store, the shards removed
                self._write(Path(store), wanted.values())
                for shard in self._files(Path(store))[1:]:
                    shard.unlink(missing_ok=True)
            elif fresh:        # too big to hold twice, or other examples' features there: the shards stay the store
                self._write(self._shard(Path(store)), fresh)

    @staticmethod
    def _order(todo: Sequence[Example], max_len: int, shard_tokens: int) -> list[Example]:
        """The examples in key order cut into runs of about `shard_tokens` tokens, each run sorted by
        length (little padding). Keys are hashes and `--max-examples N` trains on the first N by key
        (pipeline.sample_examples), so a stopped extraction has done a fixed random sample, which a
        smaller run trains on at once, rather than the shortest answers."""
        out: list[Example] = []
        run: list[Example] = []
        tokens = 0
        for e in sorted(todo, key=lambda e: e.key):
            run.append(e)
            tokens += min(len(e.ids), max_len)
            if tokens >= shard_tokens:
                out += sorted(run, key=lambda e: len(e.ids))
                run, tokens = [], 0
        return out + sorted(run, key=lambda e: len(e.ids))

    def _name(self, e: Example) -> str:
        ids = hashlib.sha1(",".join(map(str, e.ids)).encode()).hexdigest()[:16]
        return f"{e.key}|{ids}" + ("" if self.layers is None else "|layers=" + ",".join(map(str, self.layers)))

    @staticmethod
    def _files(store: Path) -> list[Path]:
        """The store (first, where it exists) and its shards, in order."""
        shards = sorted(store.parent.glob(f"{store.stem}.shard-*.safetensors")) if store.parent.is_dir() else []
        return ([store] if store.is_file() else []) + shards

    @staticmethod
    def _shard(store: Path) -> Path:
        numbers = [int(p.name.rsplit("-", 1)[1].split(".")[0]) for p in FeatureCache._files(store) if p != store]
        return store.with_name(f"{store.stem}.shard-{max(numbers, default=-1) + 1:05d}.safetensors")

    def _load(self, files: Sequence[Path], wanted: dict[str, Example], max_len: int) -> dict[str, torch.Tensor]:
        """The wanted examples' features found in `files`; counts in `self.others` the stored features
        of other examples (a run over a subset must not merge the store without them)."""
        from safetensors import safe_open
        out = {}
        mine = {k: self._name(e) for k, e in wanted.items()}        # each example's sha1 once, not per file
        known = set(mine.values())
        self.others = 0
        for file in files:
            with safe_open(str(file), framework="pt") as f:
                names = set(f.keys())
                self.others += len(names - known)
                for k, e in wanted.items():
                    name = mine[k]
                    if k not in out and name in names:
                        t = f.get_tensor(name)
                        if t.shape[0] >= min(len(e.ids), max_len):
                            out[k] = t[:min(len(e.ids), max_len)].clone()
        return out

    def _write(self, path: Path, examples: Iterable[Example]) -> None:
        from safetensors.torch import save_file
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            save_file({self._name(e): self.feats[e.key].contiguous() for e in examples}, str(tmp))

    def batch(self, examples: Sequence[Example], T: int) -> torch.Tensor:
        """[B, T, H] right-padded with zeros (padding is never covered by the loss mask)."""
        first = self.feats[examples[0].key]
        out = torch.zeros((len(examples), T, first.shape[-1]), dtype=first.dtype)
        for b, e in enumerate(examples):
            f = self.feats[e.key]
            out[b, :f.shape[0]] = f
        return out


def frequent_next_tokens(examples: Sequence[Example], n: int, max_len: int) -> torch.Tensor:
    """The `n` ids that most often are a covered next token (positions >= max(start, 1), within
    max_len) in `examples` (ties broken by the smaller id), returned in ascending id order: the
    reduced cross-entropy and draft vocabulary."""
    from collections import Counter
    counts: Counter = Counter()
    for e in examples:
        counts.update(e.ids[max(e.start, 1):max_len])
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
    return torch.tensor(sorted(i for i, _ in ranked), dtype=torch.long)
