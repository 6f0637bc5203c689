"""Training data for EAGLE heads: token-id sequences with a loss mask. Features are NOT stored; the
trainer recomputes them with the target (cheap next to the generation that produced the ids).

(a) Self-distillation: the target's own greedy answers to prompts. `generate_responses` runs
    batched greedy `model.generate` with left padding and appends new answers, as token ids, to
    chunk files `responses-NNNNN.jsonl` in a `ResponseStore` directory. A record's key hashes the
    prompt ids and the generation settings, so a rerun skips every prompt already answered and a
    run interrupted at any point resumes where it stopped (each chunk is written atomically).
(b) Teacher-forced text available offline: `offline_texts` yields documentation text shipped with
    the installed Python (docstrings of the standard library and site-packages, package READMEs from
    `*.dist-info/METADATA`), deterministically ordered; `text_examples` tokenizes and packs it into
    fixed-length windows.

An `Example` is (key, ids, start): the loss covers features at positions >= start (the response
for (a), everything for (b)). Validation membership is a hash of the key, so it is stable when the
data grows between runs.
"""
from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Sequence

import torch

from respec._io import atomic_write_text
from respec.errors import ConfigError, RespecError
from respec.prompting import encode_prompt


@dataclass(frozen=True)
class Prompt:
    """A prompt to answer: text (encoded with the target's chat template) or raw token ids."""
    key: str
    category: str
    text: str | None = None
    ids: tuple[int, ...] | None = None


@dataclass(frozen=True)
class Example:
    key: str
    ids: tuple[int, ...]
    start: int          # loss on positions >= start


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "model"


def target_slug(target) -> str:
    loaded = getattr(target, "loaded", None)
    return slug(getattr(loaded, "name", None) or getattr(target, "name", "model"))


def is_validation(key: str, fraction: float) -> bool:
    h = int(hashlib.sha1(key.encode("utf-8")).hexdigest()[:8], 16)
    return h < fraction * 0x100000000


# ------------------------------------------------------------------------------------ prompts
def text_prompts(items: Iterable[tuple[str, str]], source: str) -> list[Prompt]:
    out, seen = [], set()
    for category, text in items:
        text = text.strip()
        if not text or text in seen:
            continue
        seen.add(text)
        key = hashlib.sha1(f"{source}\0{text}".encode("utf-8")).hexdigest()[:16]
        out.append(Prompt(key=f"{source}:{key}", category=category, text=text))
    return out


def load_prompt_file(path: str | Path) -> list[tuple[str, str]]:
    """(category, text) from a prompts file: JSONL rows with "turns" (Spec-Bench: the first turn),
    "prompt" or "text", and an optional "category"; or plain text, one prompt per line."""
    path = Path(path)
    if not path.is_file():
        raise RespecError(f"prompts file not found: {path}")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise RespecError(f"cannot read prompts file {path}: {exc}") from None
    out = []
    jsonl = path.suffix in (".jsonl", ".json")
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        if not jsonl:
            out.append(("file", line))
            continue
        try:
            row = json.loads(line)
            if "turns" in row:
                text = str(row["turns"][0])
            else:
                text = str(row.get("prompt", row.get("text")))
                if text == "None":
                    raise KeyError("turns/prompt/text")
            out.append((str(row.get("category", "file")), text))
        except (json.JSONDecodeError, KeyError, TypeError, IndexError, AttributeError) as exc:
            raise RespecError(f"{path}:{n}: expected a JSON object with 'turns', 'prompt' or 'text' ({exc})") from None
    if not out:
        raise RespecError(f"prompts file {path} holds no prompts")
    return out


# ------------------------------------------------------------------------------------ responses
class ResponseStore:
    """A directory of JSONL chunk files, one record per answered prompt:
    {"key", "category", "prompt_ids", "response_ids", "max_new_tokens", "chat"}."""

    def __init__(self, directory: str | Path) -> None:
        self.dir = Path(directory)

    def chunk_files(self) -> list[Path]:
        return sorted(self.dir.glob("responses-*.jsonl")) if self.dir.is_dir() else []

    def records(self) -> list[dict]:
        return [r for f in self.chunk_files() for r in self.parse(f.read_text(encoding="utf-8"))]

    @staticmethod
    def parse(text: str) -> list[dict]:
        """The records of one chunk file's text."""
        out = []
        for line in text.splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue                # a damaged line loses one record, never the run
        return out

    def keys(self) -> set[str]:
        return {r["key"] for r in self.records()}

    def append(self, records: Sequence[dict]) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        files = self.chunk_files()
        n = int(files[-1].stem.split("-")[-1]) + 1 if files else 0
        path = self.dir / f"responses-{n:05d}.jsonl"
        atomic_write_text(path, "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in records))
        return path

    def examples(self) -> list[Example]:
        out = []
        for r in self.records():
            p, a = r["prompt_ids"], r["response_ids"]
            if a:
                out.append(Example(key=r["key"], ids=tuple(p) + tuple(a), start=len(p)))
        return out


def response_key(prompt_ids: Sequence[int], max_new_tokens: int) -> str:
    return hashlib.sha1(json.dumps([list(prompt_ids), max_new_tokens]).encode()).hexdigest()[:20]


def encode_prompts(target, prompts: Sequence[Prompt], chat: bool = True, max_prompt_tokens: int = 1024
                   ) -> list[tuple[Prompt, list[int]]]:
    out = []
    for p in prompts:
        ids = list(p.ids) if p.ids is not None else encode_prompt(target.tokenizer, p.text, chat=chat)
        if len(ids) <= max_prompt_tokens:
            out.append((p, ids))
    return out


@torch.inference_mode()
def generate_responses(target, prompts: Sequence[Prompt], store: ResponseStore, *, max_new_tokens: int = 256,
                       batch_size: int = 8, chunk_size: int = 64, chat: bool = True, progress: bool = True,
                       keep_text: bool = False) -> int:
    """Answer every prompt not yet in `store` with the target's greedy output (batched, left-padded
    `model.generate`), writing a chunk file every `chunk_size` answers. Returns the number added.
    With `keep_text`, a text prompt's text is stored too ("prompt_text"), for prompts built on it later."""
    from tqdm.auto import tqdm

    if max_new_tokens < 1 or batch_size < 1 or chunk_size < 1:
        raise ConfigError("max_new_tokens, batch_size and chunk_size must be >= 1")
    done = store.keys()
    todo = [(p, ids) for p, ids in encode_prompts(target, prompts, chat=chat)
            if response_key(ids, max_new_tokens) not in done]
    todo.sort(key=lambda x: len(x[1]))           # similar lengths per batch: little padding
    pad, eos = target.pad_token_id, sorted(target.eos_token_ids)
    model, dev = target.model, target.device
    pending: list[dict] = []
    added = 0
    bar = tqdm(total=len(todo), desc="generating responses", unit="prompt", disable=not progress)
    for i in range(0, len(todo), batch_size):
        batch = todo[i:i + batch_size]
        width = max(len(ids) for _, ids in batch)
        input_ids = torch.full((len(batch), width), pad, dtype=torch.long)
        attn = torch.zeros((len(batch), width), dtype=torch.long)
        for r, (_, ids) in enumerate(batch):
            input_ids[r, width - len(ids):] = torch.tensor(ids)
            attn[r, width - len(ids):] = 1
        out = model.generate(input_ids=input_ids.to(dev), attention_mask=attn.to(dev), max_new_tokens=max_new_tokens,
                             do_sample=False, pad_token_id=pad, eos_token_id=eos or None,
                             temperature=None, top_p=None, top_k=None)
        for r, (p, ids) in enumerate(batch):
            gen = out[r, width:].tolist()
            resp = []
            for t in gen:
                resp.append(int(t))
                if t in target.eos_token_ids:
                    break
            rec = {"key": response_key(ids, max_new_tokens), "category": p.category, "source": p.key,
                   "prompt_ids": ids, "response_ids": resp, "max_new_tokens": max_new_tokens, "chat": chat}
            if keep_text and p.text is not None:
                rec["prompt_text"] = p.text
            pending.append(rec)
        bar.update(len(batch))
        if len(pending) >= chunk_size:
            store.append(pending)
            added += len(pending)
            pending = []
    if pending:
        store.append(pending)
        added += len(pending)
    bar.close()
    return added


# ------------------------------------------------------------------------------------ offline text
def _docstrings(path: Path) -> Iterator[str]:
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (SyntaxError, ValueError, OSError, UnicodeDecodeError, RecursionError):
        return
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node)
            if doc and len(doc) >= 200:
                yield doc


def _metadata_description(path: Path) -> str:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return ""
    head, sep, body = text.partition("\n\n")     # headers, blank line, long description
    return body if sep else ""


def offline_roots() -> list[Path]:
    paths = sysconfig.get_paths()
    roots = [Path(paths["stdlib"]), Path(paths["purelib"]), Path(paths["platlib"])]
    roots += [Path(p) for p in sys.path if p.endswith("site-packages")]
    seen, out = set(), []
    for r in roots:
        r = r.resolve()
        if r.is_dir() and r not in seen:
            seen.add(r)
            out.append(r)
    return out


def offline_texts(roots: Sequence[Path] | None = None) -> Iterator[tuple[str, str]]:
    """(source id, text) pairs: package READMEs, then docstrings (>= 200 chars) of every .py file
    under `roots` (default: the stdlib and site-packages of this Python), in sorted path order."""
    roots = list(roots) if roots is not None else offline_roots()
    for root in roots:
        for meta in sorted(root.glob("*.dist-info/METADATA")):
            desc = _metadata_description(meta)
            if len(desc) >= 200:
                yield f"{meta.parent.name}/METADATA", desc
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d != "__pycache__"
                                 and not d.endswith(".dist-info") and "site-packages" not in d)
            for name in sorted(filenames):
                if name.endswith(".py"):
                    path = Path(dirpath) / name
                    for i, doc in enumerate(_docstrings(path)):
                        yield f"{path.relative_to(root)}#{i}", doc


def text_examples(tokenizer, texts: Iterable[tuple[str, str]], max_tokens: int, window: int,
                  progress: bool = True) -> list[Example]:
    """Tokenize `texts` and pack them (separated by blank lines) into windows of `window` tokens,
    at most `max_tokens` tokens in all (whole windows). Keys name the window's first source."""
    from tqdm.auto import tqdm

    if tokenizer is None:
        raise RespecError("teacher-forced text needs a target with a tokenizer")
    if window < 8:
        raise ConfigError("the text window must be at least 8 tokens")
    out: list[Example] = []
    buf: list[int] = []
    first = None
    total = 0
    sep = tokenizer("\n\n", add_special_tokens=False)["input_ids"]
    bar = tqdm(total=max_tokens, desc="tokenizing offline text", unit="tok", disable=not progress)
    for source, text in texts:
        if total + window > max_tokens:
            break
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        first = first or source
        buf.extend(list(ids) + list(sep))
        while len(buf) >= window and total + window <= max_tokens:
            out.append(Example(key=f"text:{first}:{len(out)}", ids=tuple(buf[:window]), start=0))
            buf = buf[window:]
            first = source
            total += window
            bar.update(window)
    bar.close()
    return out


_PASSAGE_TASKS = (
    ("summarisation", "Summarize the following text in a few sentences.\n\n{text}"),
    ("summarisation", "{text}\n\nWrite a short summary of the text above, keeping its key points."),
    ("rag", "Answer the question using only the document below.\n\nDocument:\n{text}\n\n"
            "Question: What is described here, and how is it used?"),
    ("rag", "Context:\n{text}\n\nBased on the context, list the main points a reader should remember."),
)


def passage_prompts(n: int, *, min_chars: int = 1200, max_chars: int = 3600,
                    roots: Sequence[Path] | None = None) -> list[tuple[str, str]]:
    """`n` long-context prompts as (category, text): a passage of offline text (docstrings of the
    standard library by default, `min_chars`..`max_chars` long, about 300-900 tokens) wrapped in a
    summarise / answer-from-the-document task, so the head sees responses that copy from a long
    prompt. Deterministic for a given Python installation: passages are taken evenly spaced from
    the sorted candidates, tasks cycle."""
    if n < 0:
        raise ConfigError("the number of passage prompts must be >= 0")
    if n == 0:
        return []
    if roots is None:
        roots = [Path(sysconfig.get_paths()["stdlib"])]
    cands = [t for _, t in offline_texts(roots) if min_chars <= len(t) <= max_chars]
    if not cands:
        raise RespecError(f"no offline passages of {min_chars}-{max_chars} characters "
                          f"under {[str(r) for r in roots]}")
    out = []
    for i in range(min(n, len(cands))):
        category, template = _PASSAGE_TASKS[i % len(_PASSAGE_TASKS)]
        out.append((category, template.format(text=cands[(i * len(cands)) // n].strip())))
    return out
