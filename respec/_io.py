"""Atomic file writes: a file is either its old content or its complete new content, never half-written.

Contract: every writer goes through `atomic_path(path)`, which yields a temporary sibling
`.NAME.tmp` to write to; on normal exit it is renamed onto `path` (`os.replace`, atomic on POSIX and
Windows within one filesystem); on an exception it is removed and `path` is left untouched. The
parent directory must exist. `atomic_write_text` / `atomic_write_bytes` are the one-call forms; a
library writer that wants a file name (`torch.save`, safetensors' `save_file`) writes to the
yielded path.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator


@contextlib.contextmanager
def atomic_path(path: str | Path) -> Iterator[Path]:
    """Yield `.NAME.tmp` next to `path`; rename it onto `path` when the block ends without error."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        yield tmp
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write `text` (UTF-8) to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def atomic_write_bytes(path: str | Path, data: bytes) -> None:
    """Write `data` to `path` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
