"""Integration on the real default model (SmolLM2-135M-Instruct, bf16 on CPU, from the local cache
that scripts/setup.sh fills): eagle2 and sam are lossless against vanilla as README "Lossless"
defines it: identical, or first diverging where vanilla's top-1/top-2 logit gap is within bf16
rounding (<= 0.5). A divergence at a larger gap is an engine bug."""
import pytest

from respec.bench import first_divergence, gap_tolerance
from respec.config import EngineConfig

pytestmark = pytest.mark.slow

ARTICLE = ("Summarize: The city council met on Tuesday to discuss the new riverside park. The park will have a "
           "playground, a pond with ducks, a walking trail and a small outdoor stage for summer concerts. "
           "Council members said the riverside park will open next spring if the weather allows construction "
           "to continue through the winter. Residents asked whether the riverside park will have parking; the "
           "council said the riverside park will have a small parking lot near the north entrance, and that "
           "bicycle racks will be placed at every entrance.")
PROMPTS = {
    "summarization": ARTICLE,
    "qa": "What is the capital of France? Answer in one sentence.",
    "code": "Write a Python function that returns the factorial of n.",
}


@pytest.fixture(scope="module")
def runner():
    from respec.models import load_target
    from respec.runner import Runner
    return Runner(load_target("default"))


@pytest.fixture(scope="module")
def vanilla(runner):
    return {k: runner.generate(p, EngineConfig(method="vanilla", max_new_tokens=64)) for k, p in PROMPTS.items()}


def test_default_model_answers_sensibly(vanilla):
    assert "Paris" in vanilla["qa"].text, vanilla["qa"].text
    assert "def " in vanilla["code"].text


@pytest.mark.parametrize("method", ["eagle2", "sam"])
@pytest.mark.parametrize("name", list(PROMPTS))
def test_strict_methods_are_lossless_on_the_default_model(runner, vanilla, method, name):
    cfg = EngineConfig().with_overrides({"method": method, "max_new_tokens": 64, "tree.total_tokens": 12,
                                         "tree.depth": 3, "tree.top_k": 4, "sam.n_predicts": 16})
    out = runner.generate(PROMPTS[name], cfg)
    ref = vanilla[name]
    div = first_divergence(ref.tokens, out.tokens)
    if div is not None:
        gap = ref.token_margins()[div]
        assert gap <= gap_tolerance(str(runner.target.dtype)), \
            f"{method} diverged from vanilla at token {div} where vanilla's top-2 gap is {gap:.3f}: an engine bug."
    if method == "sam" and name == "summarization":
        assert out.stats.steps_by_source.get("retrieval", 0) > 0, "SAM must retrieve on a summarization prompt."
        assert out.stats.accepted_tokens > 0
