"""Publishing a head while it trains: the best one so far, where a restart finds it.

Contract: `publish_head(head, dir, info)` writes the head in bfloat16 in the published layout
(`save_eagle_head`: EAGLE-1/2 or EAGLE-3; in shards of at most `MAX_SHARD_BYTES`) and `training.json` (`PUBLISHED`: `info` plus the time),
so the directory (e.g. the shipped head's in the repository) always holds the best head of the run
with its figures. "Best" is `chain_score`: the validation top-1 with teacher forcing, plus, under
training-time test, the expected further tokens of a top-1 chain (top-1 at depth 1 x depth 2 ...),
so a run that trades a little depth-1 accuracy for deeper drafts can still publish.
`published_score(dir, fingerprint, depth)` reads back the score recorded there when it was measured
on the same validation examples (`val_fingerprint`) at the same depth, so a run resumed on
another machine (`train-eagle --init-from DIR --publish DIR`) replaces the head only by a better
one. `data_summary` says which self-distilled responses a run saw (a key fingerprint that a test
checks against the committed store). Committing the directory is the caller's business; training
never runs git.
"""
from __future__ import annotations

import copy
import hashlib
import json
import time
from pathlib import Path
from typing import Iterable, Sequence

import torch

from respec._io import atomic_write_text
from respec.drafters.heads.checkpoint import save_eagle_head
from respec.train.data import Example

PUBLISHED = "training.json"
#: Published weights go into shards of at most this size: a Hugging Face Space refuses files over
#: 10 MiB without LFS (a tensor larger than this, e.g. a full-width 1.5B MLP's, still gets its own).
MAX_SHARD_BYTES = 9 * 2**20


def val_fingerprint(val: Sequence[Example], max_len: int) -> str:
    """A short hash of the validation examples (keys and the token ids within max_len): two runs'
    validation top-1 are comparable only when these agree."""
    h = hashlib.sha256()
    for e in val:
        h.update(e.key.encode("utf-8"))
        h.update(json.dumps(list(e.ids[:max_len])).encode("ascii"))
    return h.hexdigest()[:16]


def chain_score(val: dict, depth: int) -> float:
    """Σ_d Π_{j≤d} top1_j over depths 1..depth of a validation record (`val_top1`,
    `val_top1_depth2`, ...): the expected accepted length of a top-1 chain when depths were
    independent; with depth 1, the validation top-1 itself."""
    score, chain = 0.0, 1.0
    for d in range(1, depth + 1):
        chain *= float(val["val_top1" if d == 1 else f"val_top1_depth{d}"])
        score += chain
    return score


def published_score(publish: Path, fingerprint: str, depth: int = 1) -> float:
    """The `chain_score` of the head already published in `publish`, measured on the same validation
    set (`fingerprint`) at the same depth, or -1 when there is none or it is not comparable."""
    try:
        rec = json.loads((publish / PUBLISHED).read_text())
    except (OSError, ValueError):
        return -1.0
    if rec.get("val_fingerprint") != fingerprint or not isinstance(rec.get("val_top1"), (int, float)):
        return -1.0
    if int(rec.get("score_depth", 1)) != depth:
        return -1.0
    try:
        return chain_score(rec, depth)
    except (KeyError, TypeError, ValueError):
        return -1.0


def responses_fingerprint(keys: Iterable[str]) -> str:
    """A hash of the response records' keys (sorted): which self-distilled responses a head saw."""
    return hashlib.sha256("\n".join(sorted(keys)).encode("utf-8")).hexdigest()[:16]


def data_summary(examples: Sequence[Example]) -> dict:
    """What a run trains and validates on: the response records (count and key fingerprint, to be
    checked against the committed store) and the offline text windows (`text:` keys)."""
    responses = [e.key for e in examples if not e.key.startswith("text:")]
    return {"responses": len(responses), "responses_fingerprint": responses_fingerprint(responses),
            "text_windows": len(examples) - len(responses)}


def publish_head(head, publish: Path, info: dict) -> None:
    """Write `head` (bfloat16, published layout) and training.json (`info` + when) into `publish`."""

    copied = copy.deepcopy(head).to(torch.bfloat16)
    copied.draft_vocab = head.draft_vocab
    save_eagle_head(copied, publish, max_shard_bytes=MAX_SHARD_BYTES)
    info = {**info, "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_text(Path(publish) / PUBLISHED, json.dumps(info, indent=2) + "\n")
