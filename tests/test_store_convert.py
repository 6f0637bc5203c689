"""A response store carried over to another target's tokenizer (respec/train/store_convert.py): the same turns
rendered with the target's chat template (its own system turn instead of the source's), the same response text,
closed with the target's end-of-turn id where the source's answer was closed. Uses the default model's tokenizer
(from the cache scripts/setup.sh fills) and the 1.5B's, shipped beside its converted store, so neither model's
weights are loaded."""
from __future__ import annotations

import pytest

from respec.models.default_model import project_root
from respec.train.data import ResponseStore
from respec.train.pipeline import default_data_dir
from respec.train.store_convert import convert_records, load_store_tokenizer, prompt_turns

QWEN_STORE = project_root() / "data" / "eagle" / "qwen2-5-coder-1-5b-instruct"

pytestmark = pytest.mark.slow       # the default model's tokenizer comes from the model cache


@pytest.fixture(scope="module")
def tokenizers():
    from respec.models.loading import load_tokenizer
    return load_tokenizer("default", fetch=False), load_store_tokenizer(QWEN_STORE)


def test_prompt_turns_drop_the_system_turn_and_keep_the_rest_in_order():
    text = ("<|im_start|>system\nYou are SmolLM.<|im_end|>\n<|im_start|>user\nHi\nthere<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nAnd now?<|im_end|>\n<|im_start|>assistant\n")
    assert prompt_turns(text) == [{"role": "user", "content": "Hi\nthere"}, {"role": "assistant", "content": "Hello!"},
                                  {"role": "user", "content": "And now?"}]
    assert prompt_turns("plain text, no turns") == []


def test_records_carry_over_with_the_same_text_and_the_targets_template(tokenizers):
    smol, qwen = tokenizers
    records = ResponseStore(default_data_dir("smollm2-135m-instruct")).records()[:40]
    plain = {"key": "plain", "category": "x", "source": "s", "prompt_ids": smol("no template here")["input_ids"],
             "response_ids": [5, 6], "max_new_tokens": 8, "chat": False}
    done = convert_records(records + [plain], smol, qwen)
    assert done.skipped_not_chatml == 1 and len(done.records) + done.skipped_empty == len(records)
    eot_smol, eot_qwen = smol.convert_tokens_to_ids("<|im_end|>"), qwen.convert_tokens_to_ids("<|im_end|>")
    for before, after in zip([r for r in records if r["response_ids"]], done.records):
        assert after["converted_from"] == before["key"] and after["category"] == before["category"]
        prompt = qwen.decode(after["prompt_ids"])
        assert prompt.startswith("<|im_start|>system\nYou are Qwen") and prompt.endswith("<|im_start|>assistant\n")
        assert prompt_turns(prompt) == prompt_turns(smol.decode(before["prompt_ids"]))
        closed = before["response_ids"][-1] == eot_smol
        assert (after["response_ids"][-1] == eot_qwen) == closed
        body = after["response_ids"][:-1] if closed else after["response_ids"]
        assert qwen.decode(body) == smol.decode(before["response_ids"], skip_special_tokens=True)
    assert len({r["key"] for r in done.records}) == len(done.records)


def test_the_committed_store_of_the_1_5b_is_this_conversion_of_the_default_models(tokenizers):
    """What data/eagle/qwen2-5-coder-1-5b-instruct holds is what scripts/convert_store.py makes of the
    committed default-model store (checked on a sample: every 50th record)."""
    smol, qwen = tokenizers
    source = {r["key"]: r for r in ResponseStore(default_data_dir("smollm2-135m-instruct")).records()}
    shipped = ResponseStore(QWEN_STORE).records()
    assert len(shipped) >= 0.95 * len(source)
    sample = shipped[::50]
    again = convert_records([source[r["converted_from"]] for r in sample], smol, qwen).records
    assert list(again) == sample
