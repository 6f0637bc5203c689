"""Prompt encoding: text or chat messages -> the token ids a target model continues from.

Contract:
- `prompt_messages(prompt)` checks a prompt without any model: a string becomes one user turn, a list of
  {"role", "content"} mappings is copied; PromptError for a non-text prompt, an empty one, a malformed message,
  or text with lone surrogates.
- `encode_prompt(tokenizer, prompt)` turns a string or a chat message list into token ids, applying the chat
  template when the tokenizer has one. PromptError for an empty prompt, a prompt longer than `max_tokens`, or a
  tokenizer-free (test) model.
- Vicuna-style models (Vicuna v1.1-v1.5: no chat template in the tokenizer) get the Vicuna conversation format their
  EAGLE heads were trained on (`VICUNA_SYSTEM`, "USER: ... ASSISTANT:"); `conversation_format` says which form a
  tokenizer gets.

Pure functions over a tokenizer; no model, no weights, nothing runs at import time. Lives outside `respec.models`:
the engine, the trainer and the app encode prompts without caring where weights come from.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from respec.errors import PromptError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: Vicuna v1.1 conversation format (FastChat's "vicuna_v1.1", which Vicuna v1.1-v1.5 and their EAGLE heads were
#: trained on): SYSTEM + " USER: q ASSISTANT: a</s>USER: q2 ASSISTANT:".
VICUNA_SYSTEM = ("A chat between a curious user and an artificial intelligence assistant. The assistant gives "
                 "helpful, detailed, and polite answers to the user's questions.")


def conversation_format(tokenizer: Any) -> str | None:
    """"template" when the tokenizer has a chat template; "vicuna" for a Vicuna tokenizer without one (its
    name or path says vicuna, or load_model marked it); None otherwise (plain text)."""
    if getattr(tokenizer, "chat_template", None):
        return "template"
    name = f"{getattr(tokenizer, 'respec_model_name', '')} {getattr(tokenizer, 'name_or_path', '')}".lower()
    return "vicuna" if "vicuna" in name else None


def vicuna_prompt(messages: Sequence[Mapping[str, str]]) -> str:
    """Chat messages -> Vicuna v1.1 text ending in "ASSISTANT:" (a system message replaces VICUNA_SYSTEM)."""
    system = next((m["content"] for m in messages if m["role"] == "system"), VICUNA_SYSTEM)
    text = system + " "
    for m in messages:
        if m["role"] == "system":
            continue
        if m["role"] == "assistant":
            text += f"ASSISTANT: {m['content']}</s>"
        else:
            text += f"USER: {m['content']} "
    return text + "ASSISTANT:"


def prompt_messages(prompt: str | Sequence[Mapping[str, str]]) -> list[dict]:
    """A prompt (text, or chat messages) -> chat messages, checked without a model: PromptError for
    a non-text prompt, an empty one, a malformed message, or text with lone surrogates."""
    if isinstance(prompt, str):
        messages = [{"role": "user", "content": prompt}]
    elif isinstance(prompt, Sequence) and all(isinstance(m, Mapping) for m in prompt):
        messages = [dict(m) for m in prompt]
        for m in messages:
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise PromptError(f"Each chat message needs a 'role' and a text 'content'; got {m!r}.")
    else:
        raise PromptError(f"A prompt is a string or a list of chat messages, not {type(prompt).__name__}.")
    if not any(m["content"].strip() for m in messages):
        raise PromptError("The prompt is empty: type some text first.")
    for m in messages:
        try:
            m["content"].encode("utf-8")
        except UnicodeEncodeError as exc:       # a lone surrogate, e.g. undecodable bytes from a shell
            raise PromptError(f"The prompt is not valid Unicode text: {exc.object[exc.start:exc.end]!r} at "
                              f"character {exc.start} cannot be encoded. Remove it or re-save the text "
                              f"as UTF-8.") from None
    return messages


def encode_prompt(
    tokenizer: PreTrainedTokenizerBase,
    prompt: str | Sequence[Mapping[str, str]],
    chat: bool = True,
    *,
    max_tokens: int | None = None,
) -> list[int]:
    """Prompt -> token ids the model continues from.

    With `chat` and a tokenizer that has a chat template: a plain string becomes one user turn; a message list
    ([{"role": "user", "content": ...}, ...]) is used as is; add_generation_prompt=True opens the assistant turn.
    A Vicuna tokenizer without a template (conversation_format) gets the Vicuna v1.1 format instead, with BOS.
    Otherwise the text is tokenized plainly (with the tokenizer's own special tokens, e.g. BOS); a message list
    is then joined content by content, one blank line apart.
    Raises PromptError for an empty or whitespace-only prompt, or more than `max_tokens` ids.
    """
    if tokenizer is None:
        raise PromptError("This model has no tokenizer (a test model works on token ids only); pass token ids.")
    # 1. normalise to messages, and reject empty prompts and text that is not Unicode
    messages = prompt_messages(prompt)
    # 2. render: with the template, render to text and tokenize that text without adding special tokens (the
    #    template already holds them). This sidesteps apply_chat_template's return type, which in transformers 5
    #    is a BatchEncoding (a dict) rather than a list when tokenize=True.
    form = conversation_format(tokenizer) if chat else None
    if form == "template":
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    elif form == "vicuna":
        ids = tokenizer(vicuna_prompt(messages), add_special_tokens=True)["input_ids"]
    else:
        text = prompt if isinstance(prompt, str) else "\n\n".join(m["content"] for m in messages)
        ids = tokenizer(text, add_special_tokens=True)["input_ids"]
    ids = [int(i) for i in (ids.tolist() if hasattr(ids, "tolist") else ids)]
    # 3.
    if not ids:
        raise PromptError("The prompt encodes to no tokens.")
    if max_tokens is not None and len(ids) > max_tokens:
        raise PromptError(f"The prompt is {len(ids)} tokens long; this model takes at most {max_tokens}.")
    return ids

