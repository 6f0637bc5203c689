"""respec/accel/heap.py: a built Runner's objects are frozen out of the garbage collector's full passes
(a pass over a compiled model's objects stalled a request by over a second), and the app's model
switch unfreezes them so the old model's cycles stay collectable."""
import gc

from app.session.hub import ModelHub
from respec.accel import heap
from respec.runner import Runner
from tests.conftest import make_target, run


def _traversed(obj) -> bool:
    """Whether the collector's passes still traverse `obj` (frozen objects are not listed)."""
    return any(o is obj for o in gc.get_objects())


def test_a_built_runner_is_frozen_out_of_full_collections():
    heap.release()
    assert gc.get_freeze_count() == 0
    runner = Runner(make_target("llama", seed=0))
    assert gc.is_tracked(runner.target) and gc.get_freeze_count() > 0
    assert not _traversed(runner.target) and not _traversed(runner.head)
    before = gc.get_freeze_count()
    result = run(runner.target, "eagle2", [5, 6, 7, 8], head=runner.head, max_new_tokens=4)
    assert result.tokens and gc.get_freeze_count() <= before        # a request freezes nothing
    heap.release()
    assert gc.get_freeze_count() == 0 and _traversed(runner.target)


def test_the_hubs_model_switch_unfreezes_before_dropping_the_old_runner(monkeypatch):
    built = {spec: Runner(make_target("llama", seed=0)) for spec in ("a", "b")}
    hub = ModelHub("a", factory=built.__getitem__, choices=["a", "b"])
    first = hub.runner("a")
    assert gc.get_freeze_count() > 0 and not _traversed(first.target)
    frozen_during = []
    real_release = heap.release

    def release():
        frozen_during.append(gc.get_freeze_count())
        real_release()

    monkeypatch.setattr(heap, "release", release)
    assert hub.runner("b") is built["b"]
    assert frozen_during and frozen_during[0] > 0 and gc.get_freeze_count() == 0
