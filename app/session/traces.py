"""Trace files on disk: the shipped traces and example prompts, uploads, and the session's downloads.

Contract: no Gradio, no model. `recorded_traces()` finds the shipped pairs `<name>__<column>.json`
in assets/traces (`recorded_choices()` labels them with their prompts); `read_trace(path)` reads an
uploaded file, refusing one over MAX_TRACE_BYTES; `load_trace_text(text, origin)` parses a trace
into (column, Run) with a text table frozen in (replay needs no tokenizer); both raise
`TraceFormatError`. `trace_file(state, key)` writes a run's trace into the session's own folder
(`session_dir`, created on first use and removed with the session) for the download buttons.
`example_prompts()` reads assets/prompts/*.txt.
"""
from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from app.session.state import RUN_KEYS, Run, SessionState, run_key_for
from app.views.decoders import TableDecoder, TokenizerDecoder, decoder_for, text_table
from respec.errors import TraceFormatError
from respec.trace import result_from_json, result_to_json

ROOT = Path(__file__).resolve().parents[2]
TRACES_DIR = ROOT / "assets" / "traces"
PROMPTS_DIR = ROOT / "assets" / "prompts"
MAX_TRACE_BYTES = 50 * 1024 * 1024


# ------------------------------------------------------------------------------- shipped files
def recorded_traces(folder: Path = TRACES_DIR) -> dict[str, dict[str, Path]]:
    """Shipped traces: files `<name>__<column>.json` grouped by name, in name order."""
    out: dict[str, dict[str, Path]] = {}
    for path in sorted(folder.glob("*__*.json")):
        name, _, key = path.stem.rpartition("__")
        if key in RUN_KEYS:
            out.setdefault(name, {})[key] = path
    return out


def recorded_choices(folder: Path = TRACES_DIR) -> list[tuple[str, str]]:
    """(label, name) of each shipped trace pair for the picker: its prompt, cut to 70 characters."""
    choices = []
    for name, files in recorded_traces(folder).items():
        label = name.replace("-", " ")
        try:
            head = json.loads(next(iter(files.values())).read_text(encoding="utf-8"))
            prompt = (head.get("meta") or {}).get("prompt")
            if isinstance(prompt, str):
                label = prompt if len(prompt) <= 70 else prompt[:69] + "…"
        except (OSError, ValueError):
            pass
        choices.append((label, name))
    return choices


def example_prompts(folder: Path = PROMPTS_DIR) -> list[str]:
    """Example prompts, one per file in assets/prompts (*.txt), in file-name order."""
    out = []
    for path in sorted(folder.glob("*.txt")):
        text = path.read_text(encoding="utf-8").strip()
        if text:
            out.append(text)
    return out


# ------------------------------------------------------------------------------- reading traces
def load_trace_text(text: str | bytes, origin: str, tokenizer=None) -> tuple[str, Run]:
    """Parse one trace file -> (column, Run). Raises TraceFormatError."""
    result = result_from_json(text)
    decoder = decoder_for(result, tokenizer)
    if isinstance(decoder, TokenizerDecoder):            # no embedded table: freeze one now
        decoder = TableDecoder.from_table(result.tokens, text_table(result, decoder))
    return run_key_for(result.config.method), Run(result=result, decoder=decoder, origin=origin)


def read_trace(path: Path) -> bytes:
    """An uploaded trace file's bytes. Raises TraceFormatError when it is too large, OSError when
    it cannot be read."""
    if path.stat().st_size > MAX_TRACE_BYTES:
        raise TraceFormatError(f"{path.name} is larger than {MAX_TRACE_BYTES // 2**20} MB")
    return path.read_bytes()


def origin_name(name: str) -> str:
    """A file name safe to show and to record as a run's origin (no folders, at most 80 characters)."""
    return re.sub(r"[^\w.\-]+", "_", os.path.basename(name))[:80] or "upload.json"


# ------------------------------------------------------------------------------- session downloads
def session_dir(state: SessionState) -> str:
    """The session's own folder for downloadable files (created on first use, removed with the session)."""
    if state.trace_dir is None or not os.path.isdir(state.trace_dir):
        state.trace_dir = tempfile.mkdtemp(prefix="respec-traces-")
    return state.trace_dir


def trace_file(state: SessionState, key: str) -> str:
    """Write column `key`'s trace into the session folder (only when its text changed); its path."""
    res = state.runs[key].result
    name = f"{key}-{res.config.method}-seed{res.config.sampling.seed}-{len(res.tokens)}tok.json"
    path = os.path.join(session_dir(state), name)
    text = result_to_json(res)
    if not os.path.exists(path) or Path(path).read_text(encoding="utf-8") != text:
        Path(path).write_text(text, encoding="utf-8")
    return path
