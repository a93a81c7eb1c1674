"""The collector benchmark's floor (benchmarks/bench_collect.py) replays the engine's forward passes
with the same shapes: every forward's batch, new slots and cache width, compactions included."""

import sys
from pathlib import Path

import pytest

import svt.collect.engine as engine
from svt.collect.engine import _Cache

ROOT = Path(__file__).resolve().parents[2]


def _record_shapes(monkeypatch):
    shapes = []
    original = _Cache.forward

    def recorded(self, ids, new_mask, hidden=False):
        shapes.append((self.model.config.num_hidden_layers, tuple(ids.shape), self.mask.shape[1],
                       int(new_mask.sum())))
        return original(self, ids, new_mask, hidden)

    monkeypatch.setattr(_Cache, "forward", recorded)
    return shapes


@pytest.mark.parametrize("batch_size", [3])
def test_floor_replays_the_collections_forward_shapes(tmp_path, monkeypatch, models_dir, batch_size):
    from svt.collect import collect
    from svt.config import load_collect_config
    from svt.models import load_pair

    monkeypatch.setattr(engine, "COMPACT_MIN_HOLES", 8)  # compactions within a short collection
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    sys.modules.pop("bench_collect", None)
    import bench_collect

    base = {"target": str(models_dir / "target"), "draft": str(models_dir / "draft-large"),
            "workloads": [str(ROOT / "data" / "workloads" / f"{w}.jsonl") for w in ("code", "prose")],
            "requests": 7, "batch_size": batch_size, "max_new_tokens": 40, "k": 4, "device": "cpu",
            "max_prompt_tokens": 128}
    compactions = []
    original = _Cache.compact

    def counted(self):
        compactions.append(original(self))
        return compactions[-1]

    import svt.collect.runner as runner

    with monkeypatch.context() as mp:
        mp.setattr(_Cache, "compact", counted)
        mp.setattr(runner, "_warm_up", lambda *a: 0.0)  # the floor replays the timed forwards, not the warm-up
        collected = _record_shapes(mp)
        collect(load_collect_config(None, base=base), tmp_path / "run", progress=False)
    assert sum(compactions) > 0  # the replay below must follow compactions, not only appends
    with monkeypatch.context() as mp:
        floor = _record_shapes(mp)
        pair = load_pair(models_dir / "target", models_dir / "draft-large", device="cpu", dtype="float32")
        bench_collect.bare_forward_seconds(pair, tmp_path / "run", 4, batch_size)
    assert len(floor) > 100
    assert floor == collected
