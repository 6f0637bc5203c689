"""A response store carried over to another target's tokenizer: the same conversations, re-encoded.

Contract: `convert_records(records, source_tokenizer, target_tokenizer)` turns each stored record
(respec/train/data.py `ResponseStore`: prompt and response token ids of one model) into a record for
another model: the prompt's turns are read back from the source's ChatML text (`<|im_start|>role\\n
content<|im_end|>`, the format of SmolLM2 and Qwen2.5), the source's own system turn is dropped, and
the turns are rendered again with the target's chat template (respec/prompting.py `encode_prompt`,
which adds the target's own system turn); the response's text is re-encoded plainly and, when the
source's answer ended (an end-of-turn id), closed with the target's end-of-turn id. Keys are the
target's (`response_key` of the new prompt ids and the same max_new_tokens), `source` keeps the
record's provenance, and `converted_from` names the source record's key. A record whose prompt is
not ChatML, or whose response is empty, is skipped and counted; nothing else is dropped or reordered.

What it is for: training a head for a large target on conversations already answered (and already
checked by the benchmark guard) without paying for the target's own generation; the target's
features and next-token distribution, which the head learns, come from the target itself at
training time. The result is checked by the same guard before training (respec/train/pipeline.py).

`save_store_tokenizer(tokenizer, store_dir)` / `load_store_tokenizer(store_dir)` write and read the
tokenizer shipped beside such a store (`tokenizer/`, its tokenizer.json gzipped: a Hugging Face
Space takes no file over 10 MiB, and Qwen2.5's is 11.4 MB), so the store is decoded, e.g. by the
benchmark guard's test, without the model's weights. Otherwise pure: no model is loaded here.
"""
from __future__ import annotations

import gzip
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

from respec.prompting import encode_prompt
from respec.train.data import response_key

TURN = re.compile(r"<\|im_start\|>(system|user|assistant)\n(.*?)<\|im_end\|>", re.DOTALL)
END_OF_TURN = "<|im_end|>"


@dataclass(frozen=True)
class Converted:
    """The converted records and how many were skipped, by reason."""
    records: tuple[dict, ...]
    skipped_not_chatml: int
    skipped_empty: int


def prompt_turns(text: str) -> list[dict[str, str]]:
    """The user and assistant turns of a ChatML prompt text (its system turn dropped); [] if none."""
    return [{"role": role, "content": content} for role, content in TURN.findall(text) if role != "system"]


def convert_records(records: Iterable[dict], source_tokenizer, target_tokenizer) -> Converted:
    """Each record re-encoded for `target_tokenizer` (see the module contract)."""
    source_eot = source_tokenizer.convert_tokens_to_ids(END_OF_TURN)
    target_eot = target_tokenizer.convert_tokens_to_ids(END_OF_TURN)
    out: list[dict] = []
    not_chatml = empty = 0
    for r in records:
        turns = prompt_turns(source_tokenizer.decode(r["prompt_ids"], skip_special_tokens=False))
        if not turns or turns[-1]["role"] != "user":
            not_chatml += 1
            continue
        response: Sequence[int] = r["response_ids"]
        closed = bool(response) and response[-1] == source_eot
        text = source_tokenizer.decode(response[:-1] if closed else response, skip_special_tokens=True)
        ids = target_tokenizer(text, add_special_tokens=False)["input_ids"] if text.strip() else []
        if not ids:
            empty += 1
            continue
        prompt_ids = encode_prompt(target_tokenizer, turns, chat=True)
        out.append({"key": response_key(prompt_ids, r["max_new_tokens"]), "category": r["category"],
                    "source": r["source"], "prompt_ids": prompt_ids,
                    "response_ids": list(ids) + ([target_eot] if closed else []),
                    "max_new_tokens": r["max_new_tokens"], "chat": True, "converted_from": r["key"]})
    return Converted(tuple(out), not_chatml, empty)


TOKENIZER_DIR = "tokenizer"


def save_store_tokenizer(tokenizer, store_dir: Path) -> Path:
    """`tokenizer` saved into `store_dir/tokenizer/`, with tokenizer.json as tokenizer.json.gz."""
    folder = Path(store_dir) / TOKENIZER_DIR
    tokenizer.save_pretrained(str(folder))
    plain = folder / "tokenizer.json"
    with open(plain, "rb") as src, gzip.GzipFile(folder / "tokenizer.json.gz", "wb", mtime=0) as dst:
        shutil.copyfileobj(src, dst)
    plain.unlink()
    return folder


def load_store_tokenizer(store_dir: Path) -> Any:
    """The tokenizer `save_store_tokenizer` shipped beside a store (unpacked into a temporary folder)."""
    from transformers import AutoTokenizer

    folder = Path(store_dir) / TOKENIZER_DIR
    with tempfile.TemporaryDirectory() as tmp:
        for file in folder.iterdir():
            if file.name == "tokenizer.json.gz":
                with gzip.open(file, "rb") as src, open(Path(tmp) / "tokenizer.json", "wb") as dst:
                    shutil.copyfileobj(src, dst)
            else:
                shutil.copy(file, tmp)
        return AutoTokenizer.from_pretrained(tmp)
