"""The shipped workloads: well-formed, distinct, and built only from files the models never saw."""

import json
from pathlib import Path

import pytest

from svt.collect.workloads import interleave, read_workload
from svt.models.train_tiny import is_held_out

ROOT = Path(__file__).resolve().parents[2]
NAMES = ("code", "prose", "structured", "edit", "toolcalls")


@pytest.mark.parametrize("name", NAMES)
def test_shipped_workload_is_held_out_and_well_formed(name):
    path = ROOT / "data" / "workloads" / f"{name}.jsonl"
    prompts = read_workload(path)
    assert len(prompts) >= 40
    for line in path.read_text().splitlines():
        src = json.loads(line)["source"].rsplit(":", 1)[0]
        assert is_held_out(src), f"{src} was in the training split"


def test_interleave_is_round_robin_and_cycles():
    a = read_workload(ROOT / "data" / "workloads" / "code.jsonl")[:2]
    b = read_workload(ROOT / "data" / "workloads" / "prose.jsonl")[:1]
    got = interleave([a, b], 5)
    assert [p.workload for p in got] == ["code", "prose", "code", "prose", "code"]
    assert got[4] == a[0] and got[3] == b[0]
