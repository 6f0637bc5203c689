"""The EAGLE probe's cheap first count: an upper bound of a head's top-1 hits from a few hundred
rows of the output layer (pure functions; the drafter that probes is respec/drafters/eagle2.py).

Contract: `check_vocab` picks the target ids to compare (the tokens to be matched, the committed
text's last CHECK_CONTEXT tokens and about CHECK_SPREAD ids spread over the vocabulary, kept
inside the head's draft vocabulary when it has one). `bound_hits` counts the rows whose token is
the arg-max over those ids only. A token that is the arg-max over the whole vocabulary is also
the arg-max over any subset holding it, and a head never drafts a token outside its draft
vocabulary, so the count is never below the exact one; ties count as hits.
"""
from __future__ import annotations

from typing import Sequence

import torch

from respec.transfer import read, to_host, upload

CHECK_CONTEXT = 256  # the committed text's last this many tokens are candidates ...
CHECK_SPREAD = 512   # ... and about this many ids spread over the vocabulary


def check_vocab(vocab_size: int, truth: Sequence[int], context: Sequence[int],
                draft_vocab: torch.Tensor | None = None) -> torch.Tensor:
    """The target ids the bound compares: sorted, unique, in range; [S]."""
    spread = range(0, vocab_size, max(1, vocab_size // CHECK_SPREAD))
    ids = torch.tensor(sorted({int(t) for t in truth} | {int(t) for t in context[-CHECK_CONTEXT:]}
                              | set(spread)), dtype=torch.long)
    ids = ids[(ids >= 0) & (ids < vocab_size)]
    if draft_vocab is not None:
        ids = ids[torch.isin(ids, to_host(draft_vocab, "probe"))]
    return ids


def bound_hits(logits: torch.Tensor, truth: Sequence[int], ids: torch.Tensor) -> int:
    """logits [r, S]: the head's logits of r predicted features over the ids [S] from
    `check_vocab` only (`EagleHead.logits_over`), truth [r] (the token that followed each) -> how
    many rows' `truth` is the arg-max over `ids` (an upper bound of the exact top-1 hits)."""
    if ids.numel() == 0:
        return 0
    logits = logits.float()                                                        # [r, S]
    want = torch.tensor([int(t) for t in truth], dtype=torch.long)                 # [r] (host)
    where = torch.searchsorted(ids, want).clamp(max=ids.numel() - 1)               # [r] (host)
    present = (ids[where] == want).tolist()  # host
    own = logits.gather(1, upload(where.tolist(), logits.device, label="probe")[:, None])[:, 0]   # host: [r]
    wins, = read(own >= logits.max(dim=-1).values, label="probe")                 # ONE read: [r]
    return sum(int(p and w) for p, w in zip(present, wins))
