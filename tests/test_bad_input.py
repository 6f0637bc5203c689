"""Bad input gets one clear error of our own type (and exit status 2 in the CLI), nothing half-written."""
import subprocess
import sys

import pytest

from respec.config import EngineConfig
from respec.errors import ConfigError, PromptError, RespecError
from tests.conftest import make_target, run


def test_empty_prompt():
    with pytest.raises(PromptError, match="empty"):
        run(make_target("llama"), "vanilla", [])


def test_prompt_longer_than_context():
    target = make_target("llama")
    with pytest.raises(PromptError, match="context"):
        run(target, "eagle2", [5] * (target.context_length + 10))


def test_generation_stops_at_the_context_end():
    target = make_target("llama")
    prompt = [5, 6] * ((target.context_length - 10) // 2)
    r = run(target, "eagle2", prompt, max_new_tokens=100)
    assert len(prompt) + len(r.tokens) <= target.context_length and r.stop_reason in ("context", "stop_token")


@pytest.mark.parametrize("overrides", [
    {"max_new_tokens": 0}, {"max_new_tokens": -3}, {"max_new_tokens": 10**9}, {"max_new_tokens": "many"},
    {"method": "medusa"}, {"tree.total_tokens": 0}, {"tree.top_k": 1000}, {"sampling.temperature": -1},
    {"sampling.temperature": float("nan")}, {"relax.tau": "x"}, {"nonsense": 1}, {"tree.nonsense": 1},
    {"candidates.alpha": 1.5}, {"tree.depth": 2.5}, {"tree.depth": [1]},
])
def test_out_of_range_settings(overrides):
    with pytest.raises(ConfigError):
        EngineConfig().with_overrides(overrides)


def test_settings_from_json_round_trip():
    cfg = EngineConfig().with_overrides({"method": "sam", "tree.total_tokens": "12", "theta_H": 2})
    assert cfg.tree.total_tokens == 12 and cfg.trigger.theta_entropy == 2
    assert EngineConfig.from_dict(cfg.to_dict()) == cfg
    with pytest.raises(ConfigError):
        EngineConfig.from_dict(["not", "a", "dict"])


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "respec", *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("args,needle", [
    (["generate", "--prompt", "   ", "--method", "vanilla"], "empty"),
    (["generate", "--prompt", "hi", "--method", "nope"], "unknown method"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "max_new_tokens"),
    (["generate", "--prompt", "hi", "--set", "tree.total_tokens=-1"], "total_tokens"),
    (["generate", "--prompt", "hi", "--model", "/nonexistent/model-dir"], "/nonexistent/model-dir"),
    (["bench", "--questions", "/nonexistent.jsonl", "--out", "OUT"], "not found"),
])
def test_cli_reports_one_clear_error(args, needle, tmp_path):
    args = [a.replace("OUT", str(tmp_path / "out")) for a in args]
    p = _cli(*args)
    assert p.returncode == 2, p.stderr
    assert needle in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not (tmp_path / "out").exists(), "A failed run must not leave output behind."


def test_cli_replay_rejects_malformed_trace(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"schema": "respec-trace", "version": 99}')
    p = _cli("replay", str(bad))
    assert p.returncode == 2 and "version" in p.stderr and "Traceback" not in p.stderr
