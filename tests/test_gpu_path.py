"""The GPU path, checked on the CPU: model=head pairs (Hub ids and local paths), the transformers
version and cache-keyword guard, the refusal of meta/offloaded weights, features moved to the EAGLE
head's device, every GPU synchronised around timed forwards, an incomplete EAGLE-3 checkpoint, dtypes for GPUs
without native bf16, the Vicuna conversation format, and ZeroGPU's start-up fallback to replay mode."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from respec.config import EngineConfig, TreeConfig
from respec.drafters import make_drafter
from respec.drafters.eagle2 import Eagle2Drafter
from respec.drafters.heads.eagle import random_head
from respec.drafters.heads.checkpoint import load_eagle_head, save_eagle_head
from respec.engine import Engine
from respec.errors import ConfigError, ModelLoadError, RespecError
from respec import prompting
from respec.models import compat, devices
from respec.models.hf import HFTarget
from respec.models.tiny import tiny_llama
from respec.runner import ModelChoice, Runner, parse_model_choices
from tests.conftest import EOS, make_target

ROOT = Path(__file__).resolve().parent.parent
PROMPT = [5, 17, 33, 9, 71, 4, 88, 12, 5, 17, 33]


# ------------------------------------------------------------------------------- model=head pairs
@pytest.mark.parametrize("text,model,head", [
    ("default", "default", None),
    ("default=assets/eagle/smollm2-135m-instruct", "default", "assets/eagle/smollm2-135m-instruct"),
    (" lmsys/vicuna-7b-v1.3 = yuhuili/EAGLE-Vicuna-7B-v1.3 ", "lmsys/vicuna-7b-v1.3", "yuhuili/EAGLE-Vicuna-7B-v1.3"),
    ("/models/qwen2-7b=/heads/eagle-qwen2", "/models/qwen2-7b", "/heads/eagle-qwen2"),
])
def test_model_head_pairs_parse_hub_ids_and_local_paths(text, model, head):
    choice = ModelChoice.parse(text)
    assert (choice.model, choice.head) == (model, head)
    assert ModelChoice.parse(str(choice)) == choice, "str() must round-trip (it is the picker's value)"


@pytest.mark.parametrize("bad", ["", "  ", "=heads/x", "default=", "default= "])
def test_malformed_model_entries_are_one_config_error(bad):
    with pytest.raises(ConfigError, match="MODEL=HEAD"):
        ModelChoice.parse(bad)


def test_respec_models_list_keeps_order_and_drops_duplicates():
    got = parse_model_choices("default=assets/eagle/smollm2-135m-instruct, org/m=org/h ,org/m=org/h, ")
    assert [str(c) for c in got] == ["default=assets/eagle/smollm2-135m-instruct", "org/m=org/h"]
    assert got[0].head_label() == "EAGLE head assets/eagle/smollm2-135m-instruct"
    assert ModelChoice("default").head_label() == "shipped EAGLE head"
    assert ModelChoice("org/m").head_label().startswith("random")


@pytest.fixture(scope="module")
def llama():
    return make_target("llama")


@pytest.fixture
def head_dir(tmp_path, llama):
    path = tmp_path / "head"
    save_eagle_head(random_head(llama, seed=3), path)
    return path


def test_a_hub_id_head_is_fetched_with_huggingface_hub(monkeypatch, llama, head_dir):
    import huggingface_hub
    calls = []

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(head_dir)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    runner = Runner(llama, head="someone/eagle-head")
    assert calls and calls[0][0] == "someone/eagle-head", "A Hub id must be fetched by huggingface_hub"
    assert set(calls[0][1]["allow_patterns"]) >= {"config.json", "model.safetensors"}
    assert runner.head_info == "checkpoint someone/eagle-head"
    local = load_eagle_head(head_dir, llama)
    assert all(torch.equal(a, b) for a, b in zip(runner.head.state_dict().values(), local.state_dict().values()))


def test_a_local_head_directory_is_never_looked_up_on_the_hub(monkeypatch, llama, head_dir):
    import huggingface_hub
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda *a, **k: pytest.fail("Hub was asked"))
    assert Runner(llama, head=str(head_dir)).head_info == f"checkpoint {head_dir}"


def test_an_unreachable_hub_head_is_one_clear_error(monkeypatch, llama):
    import huggingface_hub

    def offline(repo_id, **kwargs):
        raise OSError("Name or service not known")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(ModelLoadError, match="Hub could not provide it") as error:
        Runner(llama, head="some/missing-id")
    assert "some/missing-id" in str(error.value) and "download the head elsewhere" in str(error.value)
    with pytest.raises(ModelLoadError, match="not a directory"):
        Runner(llama, head="./no/such/head")


def test_cli_head_that_cannot_be_found_exits_nonzero_with_one_error_line():
    """Offline (this machine) the Hub lookup fails; online the id does not exist: one error either way,
    before any model is loaded."""
    p = subprocess.run([sys.executable, "-m", "respec", "generate", "--prompt", "hi", "--head", "some/missing-id"],
                       capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert p.returncode == 2, p.stderr[-2000:]
    lines = [line for line in p.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: EAGLE head 'some/missing-id'"), p.stderr
    assert "Traceback" not in p.stderr


def test_the_app_factory_loads_the_head_of_a_model_head_pair(monkeypatch, llama, head_dir):
    import respec.models
    from app.events import handlers
    monkeypatch.setattr(respec.models, "load_target", lambda spec, **kw: llama)
    runner = handlers._default_factory(f"tiny={head_dir}")
    assert runner.head_info == f"checkpoint {head_dir}"
    assert handlers.choice_label(f"tiny={head_dir}") == f"tiny · EAGLE head {head_dir}"
    hub = handlers.ModelHub(choices=[f"tiny={head_dir}", "default"], factory=lambda s: None)
    assert hub.spec == f"tiny={head_dir}" and hub.choices[0] == f"tiny={head_dir}"


# ------------------------------------------------------------------------------- version guard
def test_transformers_older_than_5_is_refused_with_the_fix():
    assert compat.check_transformers("5.24.0") == "5.24.0"
    assert compat.check_transformers("5.17.0") == "5.17.0"        # runs: the cache keyword is read, not assumed
    with pytest.raises(ModelLoadError, match=r"transformers 4\.57\.1 is too old.*transformers==5\.24\.0"):
        compat.check_transformers("4.57.1")


def test_the_cache_keyword_is_read_from_the_signature():
    def new(input_ids=None, cache=None, **kwargs): ...
    def old(input_ids=None, past_key_values=None, **kwargs): ...
    def neither(input_ids=None, **kwargs): ...
    assert compat.cache_kwarg(new) == "cache" and compat.cache_kwarg(old) == "past_key_values"
    with pytest.raises(ModelLoadError, match="neither `cache` nor `past_key_values`"):
        compat.cache_kwarg(neither)


class _OldBase(nn.Module):
    """A base model as transformers 5.17 has it: the cache keyword is `past_key_values`, and any
    other keyword (`cache=`) would fall into **kwargs and be ignored."""

    def __init__(self, real: nn.Module) -> None:
        super().__init__()
        self.real = real

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, past_key_values=None,
                use_cache=None, **kwargs):
        kwargs.pop("cache", None)                        # what 5.17 effectively does with cache=
        return self.real(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         cache=past_key_values, use_cache=use_cache, **kwargs)


def test_a_base_model_that_takes_past_key_values_keeps_its_kv_cache():
    ref_target = make_target("llama")
    model = tiny_llama(seed=0, dtype=torch.float64)
    old = _OldBase(model.get_decoder())
    model.get_decoder = lambda: old
    target = HFTarget(model, eos_token_ids=frozenset({EOS}), context_length=256, name="tiny-old-api")
    assert target._cache_kw == "past_key_values"
    for method in ("vanilla", "eagle2"):
        cfg = EngineConfig().with_overrides({"method": method, "max_new_tokens": 20})
        got = Engine(target, make_drafter(method, target, cfg), cfg).generate(PROMPT).tokens
        want = Engine(ref_target, make_drafter(method, ref_target, cfg), cfg).generate(PROMPT).tokens
        assert got == want, f"{method}: the KV cache must reach a past_key_values-style forward"
    assert target.kv_len > len(PROMPT)


def test_the_eagle_head_layer_gets_its_cache_under_past_key_values_too():
    target = make_target("llama")
    head = random_head(target, seed=0)
    layer = head.layers[0]

    class OldLayer(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = layer

        def forward(self, hidden_states, attention_mask=None, position_ids=None, past_key_values=None,
                    use_cache=False, position_embeddings=None, **kwargs):
            assert "cache" not in kwargs, "cache= must be renamed before it reaches this forward"
            return self.inner(hidden_states, attention_mask=attention_mask, position_ids=position_ids,
                              cache=past_key_values, use_cache=use_cache, position_embeddings=position_embeddings)

    old = OldLayer()
    assert compat.pass_cache_as(old) == "past_key_values"
    head.layers[0] = old
    from respec.models.kv import slab_cache
    cache = slab_cache(head.config)
    emb = target.embed(torch.tensor([3, 4, 5]))
    head(emb, torch.zeros(3, target.hidden_size, dtype=target.dtype), torch.arange(3), cache, None)
    assert cache.get_seq_length() == 3, "the head's cache must be filled through the renamed keyword"


# ------------------------------------------------------------------------------- placement
def test_meta_weights_are_refused_with_one_clear_error():
    with torch.device("meta"):
        model = tiny_llama(seed=0, dtype=torch.float64)
    with pytest.raises(ModelLoadError, match="meta device.*every weight on a GPU"):
        HFTarget(model, eos_token_ids=frozenset({EOS}), context_length=256, name="tiny-meta")


def test_offload_next_to_gpus_is_refused_but_a_cpu_model_is_fine():
    model = tiny_llama(seed=0, dtype=torch.float64)
    model.hf_device_map = {"model.embed_tokens": 0, "model.layers.0": 0, "model.layers.1": "cpu", "lm_head": "disk"}
    with pytest.raises(ModelLoadError, match="offloaded to cpu and disk"):
        compat.check_placement(model, "tiny")
    model.hf_device_map = {"": "cpu"}
    compat.check_placement(model, "tiny")


def test_a_model_too_big_for_all_gpus_is_refused_before_loading(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 * 2**30, 16 * 2**30))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(devices, "estimated_bytes", lambda config, dtype: 20 * 2**30)
    with pytest.raises(ModelLoadError, match="2 visible GPU.*offloading to the CPU is refused"):
        devices.needs_device_map(None, torch.bfloat16, torch.device("cuda", 0), "big/model")
    monkeypatch.setattr(devices, "estimated_bytes", lambda config, dtype: 12 * 2**30)
    assert devices.needs_device_map(None, torch.bfloat16, torch.device("cuda", 0)), "fits on two: spread"


# ------------------------------------------------------------------------------- several GPUs
class _FeaturesElsewhere:
    """Stand-in for a feature block on another GPU (the final norm's): unusable until moved with
    .to(); records where it was moved."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor, self.moved_to = tensor, None

    def to(self, device, *args, **kwargs):
        self.moved_to = torch.device(device)
        return self.tensor.to(device, *args, **kwargs)


def test_catch_up_moves_the_targets_features_to_the_heads_device(llama):
    head = random_head(llama, seed=1)
    cfg = TreeConfig(total_tokens=8, depth=3, top_k=3)
    out = llama.prefill(PROMPT)
    root = int(out.logits[-1].argmax())
    plain = Eagle2Drafter(llama, head, cfg)
    plain.reset(PROMPT, out.hidden)
    want = plain.draft_tree(list(PROMPT), root).tree
    moved = Eagle2Drafter(llama, head, cfg)
    moved.reset(PROMPT, None)
    elsewhere = _FeaturesElsewhere(out.hidden)
    moved._pending = [elsewhere]
    got = moved.draft_tree(list(PROMPT), root).tree
    assert elsewhere.moved_to == head.fc.weight.device, "features must be moved to the head's device"
    assert got.tokens == want.tokens and got.parents == want.parents


def test_the_cost_curve_synchronises_every_gpu_holding_weights(monkeypatch):
    target = make_target("llama")
    target._cuda_devices = (torch.device("cuda", 0), torch.device("cuda", 1))   # as under device_map="auto"
    synced = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: synced.append(device))
    curve = target.verify_cost_curve(max_size=2, context=8, reps=0)
    assert set(curve) == {1, 2}
    # 2 sizes x (1 warm-up + 1 timed round) x (before + after each forward)
    assert synced.count(torch.device("cuda", 1)) == synced.count(torch.device("cuda", 0)) == 8, synced


def test_the_cost_curve_is_kept_per_context_length(monkeypatch):
    """Sizes measured after 16 cached tokens never answer for 40 (issue 30 §7: a curve keyed by size
    alone mixed contexts); each context's curve is measured, and kept, on its own."""
    target = make_target("llama")
    contexts = []
    real = target._forward

    def spy(**kw):
        if "attention_mask" not in kw:                   # the context's prefill
            contexts.append(kw["input_ids"].shape[1])
        return real(**kw)
    monkeypatch.setattr(target, "_forward", spy)
    short = target.verify_cost_curve(max_size=2, context=16, reps=0)
    long = target.verify_cost_curve(max_size=2, context=40, reps=0)
    assert set(short) == set(long) == {1, 2} and contexts == [16, 40]
    assert target.verify_cost_curve(max_size=2, context=16, reps=0) == short and contexts == [16, 40]
    assert target.measured_curve(16) == short and target.measured_curve(40) == long


# ------------------------------------------------------------------------------- EAGLE-3
def _eagle3_checkpoint(path: Path, hidden: int, arch: bool) -> Path:
    from safetensors.torch import save_file
    path.mkdir()
    cfg = {"hidden_size": hidden, "intermediate_size": 2 * hidden, "num_attention_heads": 4,
           "num_key_value_heads": 2, "vocab_size": 128, "draft_vocab_size": 32, "rms_norm_eps": 1e-6}
    if arch:
        cfg["architectures"] = ["LlamaForCausalLMEagle3"]
    (path / "config.json").write_text(json.dumps(cfg))
    state = {"fc.weight": torch.zeros(hidden, 3 * hidden), "norm.weight": torch.ones(hidden),
             "lm_head.weight": torch.zeros(32, hidden), "d2t": torch.zeros(32, dtype=torch.long),
             "t2d": torch.zeros(128, dtype=torch.bool)}
    prefix = "midlayer" if arch else "layers.0"
    state[f"{prefix}.self_attn.q_proj.weight"] = torch.zeros(hidden, 2 * hidden)
    save_file(state, str(path / "model.safetensors"))
    return path


@pytest.mark.parametrize("arch", [True, False])
def test_an_incomplete_eagle3_checkpoint_is_one_clear_sentence(tmp_path, llama, arch):
    """Recognised as EAGLE-3 by its architecture or its 3 x hidden fc (tests/test_eagle3.py loads
    complete ones); one missing its layer's weights is one ModelLoadError naming them."""
    path = _eagle3_checkpoint(tmp_path / "eagle3", llama.hidden_size, arch)
    with pytest.raises(ModelLoadError) as error:
        load_eagle_head(path, llama)
    message = str(error.value)
    assert "EAGLE-3 head" in message and "missing keys" in message and "mlp.down_proj.weight" in message
    assert "\n" not in message and "size mismatch" not in message


def test_a_head_whose_shapes_do_not_match_its_config_is_a_model_load_error(tmp_path, llama, head_dir):
    from safetensors.torch import load_file, save_file
    state = load_file(str(head_dir / "model.safetensors"))
    state["layers.0.mlp.up_proj.weight"] = torch.zeros(3, llama.hidden_size)
    save_file(state, str(head_dir / "model.safetensors"))
    with pytest.raises(ModelLoadError, match="does not match its config.json: .*up_proj"):
        load_eagle_head(head_dir, llama)


# ------------------------------------------------------------------------------- dtype
@pytest.mark.parametrize("native,emulated,model_type,want", [
    (True, True, "llama", torch.bfloat16),        # A100, H100
    (False, True, "llama", torch.float16),        # T4, V100: bf16 only emulated
    (False, True, "qwen2", torch.bfloat16),       # Qwen2 overflows fp16: emulated bf16
    (False, False, "qwen2", torch.float32),
])
def test_gpus_without_native_bf16_get_fp16_except_qwen2(monkeypatch, native, emulated, model_type, want):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported",
                        lambda including_emulation=True: emulated if including_emulation else native)
    assert devices.resolve_dtype("auto", torch.device("cuda"), model_type) == want


# ------------------------------------------------------------------------------- Vicuna
def test_a_vicuna_tokenizer_without_a_template_gets_the_vicuna_conversation_format():
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    raw = Tokenizer(models.WordLevel({"[UNK]": 0, "<s>": 1, "</s>": 2, "USER": 3, "ASSISTANT": 4, ":": 5, "hi": 6},
                                     unk_token="[UNK]"))
    raw.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")
    assert prompting.conversation_format(tok) is None, "no template and no vicuna name: plain text"
    plain = prompting.encode_prompt(tok, "hi")
    tok.respec_model_name = "lmsys/vicuna-7b-v1.3"
    assert prompting.conversation_format(tok) == "vicuna"
    text = prompting.vicuna_prompt([{"role": "user", "content": "hi"}])
    assert text == (prompting.VICUNA_SYSTEM + " USER: hi ASSISTANT:")
    assert prompting.vicuna_prompt([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                  {"role": "user", "content": "c"}]).endswith(
        " USER: a ASSISTANT: b</s>USER: c ASSISTANT:")
    ids = prompting.encode_prompt(tok, "hi")
    assert ids != plain and ids[-2:] == [4, 5], "the Vicuna format ends in 'ASSISTANT:'"
    assert ids == tok(text, add_special_tokens=True)["input_ids"], "with the tokenizer's own BOS, as EAGLE's scripts"


# ------------------------------------------------------------------------------- ZeroGPU
def test_zerogpu_startup_load_failure_opens_replay_mode_instead_of_crashing(monkeypatch):
    from app.events import handlers
    from app.page import ui
    from app.session.settings import Caps

    def broken(spec):
        raise OSError(f"weights of {spec} are unreadable (simulated)")

    monkeypatch.setattr(ui, "ZERO_GPU", True)
    hub = handlers.ModelHub("default", factory=broken, choices=["default"])
    ui.build_demo(hub=hub, caps=Caps(max_new_tokens=16, default_new_tokens=8, max_tree_tokens=16, time_limit_s=30,
                                     queue_size=2))
    assert not hub.loaded and "simulated" in hub.load_error
    assert "replay mode" in hub.banner()


def test_zerogpu_preload_computes_the_per_worker_caches_in_the_main_process(llama):
    from app.events import handlers

    runner = Runner(llama)
    hub = handlers.ModelHub("tiny", factory=lambda spec: runner, choices=["tiny", "other"])
    assert hub.preload() is True
    assert "no_relax_ids" in vars(runner), "computed once here, inherited by every GPU-call worker"
    assert hub.choices == ["tiny"], "on ZeroGPU only the start-up model is offered (others reload per call)"
    assert hub.per_call_workers


@pytest.mark.parametrize("env,want", [(None, False), ("on", True), ("OFF", False), ("fast", False)])
@pytest.mark.parametrize("zero_gpu", [False, True])
def test_the_app_compiles_its_models_in_the_background_when_respec_compile_is_on(monkeypatch, llama, env, want,
                                                                                 zero_gpu):
    """RESPEC_COMPILE=on: the hub loads the model eagerly, then starts Runner.compile_later under its
    step lock (in the background; at load on ZeroGPU, whose workers keep nothing a thread builds);
    unset or malformed (with a warning) compiles nothing."""
    import respec.models
    from app.session import hub
    seen, calls = [], []
    monkeypatch.setattr(respec.models, "load_target", lambda spec, **kw: seen.append(kw) or llama)
    if env is None:
        monkeypatch.delenv("RESPEC_COMPILE", raising=False)
    else:
        monkeypatch.setenv("RESPEC_COMPILE", env)
    runner = hub._default_factory("tiny")
    assert seen == [{}], "the factory loads eagerly; the hub compiles"
    def compile_later(self, lock, progress=False, background=True, pause=None):
        calls.append((lock, background, pause))
    monkeypatch.setattr(Runner, "compile_later", compile_later)
    h = hub.ModelHub("tiny", factory=lambda spec: runner, choices=["tiny"])
    h.per_call_workers = zero_gpu
    assert h.runner() is runner
    assert [c[:2] for c in calls] == ([(h._step_lock, not zero_gpu)] if want else [])
    if want:                 # the pause waits for an idle model, and stops the compile once the model is replaced
        pause = calls[0][2]
        pause()
        h._runner = Runner(llama)
        with pytest.raises(RespecError, match="another model"):
            pause()
        h._runner = runner
    # the status line says while answers run eagerly because the compiled forward is not there (yet)
    for state, note in [("compiling", "being built in the background"), ("failed: OSError: x", "compiling failed"),
                        ("on", ""), ("off", "")]:
        runner.compile_state = state
        assert (note in h.compile_note()) if note else h.compile_note() == ""


def test_the_background_compile_waits_for_the_model_to_be_idle(llama):
    """ModelHub.wait_idle (where the background compile pauses before each shape): it returns
    at once when nothing ran, only `idle_s` after a run's last step, and never while a run holds
    the model."""
    import threading
    import time

    from app.session import hub
    h = hub.ModelHub("tiny", factory=lambda spec: Runner(llama), choices=["tiny"])
    h.wait_idle(idle_s=1.0, poll_s=60)            # nothing ever ran: no wait
    h.begin_run()
    t0 = time.monotonic()
    h.wait_idle(idle_s=0.2, poll_s=0.01)
    assert time.monotonic() - t0 >= 0.19
    released = threading.Event()

    def hold():
        with h.exclusive():
            time.sleep(0.1)
            released.set()
    holder = threading.Thread(target=hold)
    holder.start()
    while not h._step_lock.locked() and not released.is_set():
        time.sleep(0.001)
    h.wait_idle(idle_s=0.0, poll_s=0.01)
    assert released.is_set(), "wait_idle returned while a run held the model"
    holder.join()
