"""Shared hypothesis strategies for the retrieval tests."""
from __future__ import annotations

from hypothesis import strategies as st


@st.composite
def token_texts(draw: st.DrawFn, max_len: int = 200) -> tuple[list[int], list[int]]:
    """(alphabet, text): 2..6 arbitrary token ids, and a text of up to max_len tokens over them
    built from random runs and copies of earlier spans (so long repeats are common)."""
    alpha = draw(st.lists(st.integers(min_value=0, max_value=50_000), min_size=2, max_size=6,
                          unique=True))
    target = draw(st.integers(0, max_len))
    rnd = draw(st.randoms(use_true_random=False))
    text: list[int] = []
    while len(text) < target:
        if text and rnd.random() < 0.4:
            start = rnd.randrange(len(text))
            text.extend(text[start : start + rnd.randint(1, 40)])
        else:
            text.extend(rnd.choice(alpha) for _ in range(rnd.randint(1, 20)))
    return alpha, text[:target]
