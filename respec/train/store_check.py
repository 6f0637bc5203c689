"""The benchmark guard over the response store, shard by shard, remembering shards found clean.

Contract: `check_store(guard, store, tokenizer)` raises RespecError when a stored record's decoded
prompt overlaps a benchmark question (`BenchmarkGuard.check_prompts`), as a check of every record
would. A shard found clean is remembered in a small JSON file (`verdicts`, default
`$RESPEC_CACHE/train/clean-shards.json`: outside the repository) under a key that hashes the
shard's bytes, the guard's fingerprints and the tokenizer (class and vocabulary); a later check
skips a shard only when all three are unchanged, so a new or edited shard, a grown guard or another
tokenizer is checked again. Only clean verdicts are kept: a contaminated shard is refused every
time. A tokenizer without `get_vocab` is never cached. Each shard is read once, and the bytes hashed
are the bytes checked. The verdict file is written atomically; a missing or unreadable one means
"nothing known", and failing to write it only costs the next run a full check.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from respec._io import atomic_write_text
from respec.models.default_model import cache_root
from respec.train.data import ResponseStore
from respec.train.exclusion import BenchmarkGuard

VERDICTS_FILE = "clean-shards.json"
MAX_VERDICTS = 10_000                  # oldest verdicts are dropped beyond this


def default_verdicts_file() -> Path:
    return cache_root() / "train" / VERDICTS_FILE


def tokenizer_digest(tokenizer) -> str | None:
    """sha256 of the tokenizer's class and vocabulary; None when it has no `get_vocab` (no caching)."""
    get_vocab = getattr(tokenizer, "get_vocab", None)
    if get_vocab is None:
        return None
    vocab = sorted(get_vocab().items())
    return hashlib.sha256(json.dumps([type(tokenizer).__name__, vocab]).encode("utf-8")).hexdigest()


def _load_verdicts(path: Path) -> list[str]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return [k for k in data["clean"] if isinstance(k, str)]
    except (OSError, ValueError, KeyError, TypeError):
        return []


def _save_verdicts(path: Path, keys: list[str]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({"version": 1, "clean": keys[-MAX_VERDICTS:]}))
    except OSError:
        pass                             # an unwritable cache only means the next run checks everything


def check_store(guard: BenchmarkGuard, store: ResponseStore, tokenizer, verdicts: Path | None = None) -> None:
    """Refuse to train on stored responses whose prompt overlaps a benchmark question."""
    tok = tokenizer_digest(tokenizer)
    context = None if tok is None else hashlib.sha256(f"{guard.digest()}\0{tok}".encode()).hexdigest()
    path = verdicts or default_verdicts_file()
    known = _load_verdicts(path) if context else []
    seen = set(known)
    records, new = [], []
    for shard in store.chunk_files():
        data = shard.read_bytes()
        key = None if context is None else hashlib.sha256(context.encode() + b"\0" + data).hexdigest()
        if key is not None and key in seen:
            continue
        records += ResponseStore.parse(data.decode("utf-8"))
        if key is not None:
            new.append(key)
    guard.check_prompts(((f"{r['key']} ({r.get('source', '?')})", tokenizer.decode(r["prompt_ids"]))
                         for r in records), what=f"stored responses in {store.dir}")
    if new:
        _save_verdicts(path, known + new)
