"""Publishing a head while it trains: the best one so far, where a restart finds it.

Contract: `publish_head(head, dir, info)` writes the head in bfloat16 in the published layout
(`save_eagle_head`: EAGLE-1/2 or EAGLE-3) and `training.json` (`PUBLISHED`: `info` plus the time),
so the directory (e.g. the shipped head's in the repository) always holds the best head of the run
with its figures. `published_top1(dir, fingerprint)` reads back the validation top-1 recorded there
when it was measured on the same validation examples (`val_fingerprint`), so a run resumed on
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
from respec.train.data import Example

PUBLISHED = "training.json"


def val_fingerprint(val: Sequence[Example], max_len: int) -> str:
    """A short hash of the validation examples (keys and the token ids within max_len): two runs'
    validation top-1 are comparable only when these agree."""
    h = hashlib.sha256()
    for e in val:
        h.update(e.key.encode("utf-8"))
        h.update(json.dumps(list(e.ids[:max_len])).encode("ascii"))
    return h.hexdigest()[:16]


def published_top1(publish: Path, fingerprint: str) -> float:
    """The validation top-1 of the head already published in `publish` on the same validation set
    (`fingerprint`), or -1 when there is none or it was measured on other examples."""
    try:
        rec = json.loads((publish / PUBLISHED).read_text())
    except (OSError, ValueError):
        return -1.0
    if rec.get("val_fingerprint") != fingerprint or not isinstance(rec.get("val_top1"), (int, float)):
        return -1.0
    return float(rec["val_top1"])


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
    from respec.drafters.eagle2 import save_eagle_head

    copied = copy.deepcopy(head).to(torch.bfloat16)
    copied.draft_vocab = head.draft_vocab
    save_eagle_head(copied, publish)
    info = {**info, "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    atomic_write_text(Path(publish) / PUBLISHED, json.dumps(info, indent=2) + "\n")
