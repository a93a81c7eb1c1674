"""`make bench-check` (benchmarks/bench_check.py): a ratio more than the tolerance below the committed
baseline fails, but only when a second run confirms it; a ratio within it passes."""

import importlib.util
import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def check(monkeypatch, tmp_path):
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    spec = importlib.util.spec_from_file_location("bench_check", ROOT / "benchmarks" / "bench_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    names = list(mod.CHECKS)
    base = tmp_path / "baseline.json"
    base.write_text(json.dumps({"ratios": {n: 20.0 for n in names}}))
    monkeypatch.setattr(mod, "BASELINE", base)
    return mod, names


def test_the_committed_baseline_covers_every_check():
    spec = importlib.util.spec_from_file_location("bench_check", ROOT / "benchmarks" / "bench_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ratios = json.loads((ROOT / "benchmarks" / "baseline.json").read_text())["ratios"]
    assert set(ratios) == set(mod.CHECKS) and all(v > 1 for v in ratios.values())


@pytest.mark.parametrize("first, second, code", [
    (17.5, None, 0),   # 12.5 % below: within the tolerance
    (16.0, 16.5, 1),   # 20 % below twice in a row: a regression
    (16.0, 19.0, 0),   # 20 % below once, then within: a busy moment, not a regression
])
def test_a_ratio_that_falls_past_the_tolerance_twice_fails(check, monkeypatch, capsys, first, second, code):
    mod, names = check
    runs = iter([{n: first for n in names}, {n: second for n in names}])
    monkeypatch.setattr(mod, "measure", lambda modules=None: next(runs))
    assert mod.main([]) == code
    out = capsys.readouterr()
    assert ("FELL" in out.out) == (code == 1)
    if second is not None:
        assert f"again {second:.1f}x" in out.out
