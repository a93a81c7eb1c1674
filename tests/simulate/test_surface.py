"""Verify time over (rows, tokens a row), as a fitted profile writes it: read exactly at the grid,
linearly between, monotone everywhere, in proportion to the rows past the largest measured; the
table file round-trips it and its bootstrap refits, and refuses what is not one."""

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from svt.errors import ConfigError
from svt.simulate.cost_files import load_costs, write_costs
from svt.simulate.costs import CostTable
from svt.simulate.surface import VerifySurface

GRID = {1: {1: 2.0, 2: 2.2, 4: 2.6}, 4: {1: 3.0, 2: 4.0, 4: 5.5}, 16: {1: 7.0, 2: 9.0, 4: 14.0}}


def test_the_grid_is_read_exactly_and_linearly_between():
    s = VerifySurface(GRID)
    for b, row in GRID.items():
        for m, ms in row.items():
            assert float(s(b * m, b)) == pytest.approx(ms, rel=1e-12)
    assert float(s(3, 1)) == pytest.approx(2.4)  # 3 tokens a row, between widths 2 and 4
    assert float(s(10, 10)) == pytest.approx(5.0)  # 10 rows of 1: halfway between rows 4 and 16
    assert float(s(64, 32)) == pytest.approx(9.0 * 2)  # past the largest rows: in proportion
    assert float(s(6, 1)) == pytest.approx(2.6 + 0.2 * 2)  # past the widest: the last slope
    assert float(s(1, 1)) == float(s(np.array([1.0]), 1)[0])  # scalar and vector reads agree


def test_rows_cost_on_their_own():
    """The same tokens over more rows take longer: what a model in total tokens alone missed."""
    s = VerifySurface(GRID)
    assert float(s(16, 16)) > float(s(16, 4))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 10**6))
def test_every_read_is_monotone_in_rows_and_tokens(seed):
    rng = np.random.default_rng(seed)
    grid = {b: {m: float(rng.uniform(1, 10)) for m in (1, 2, 3, 5)} for b in (1, 2, 8)}  # noisy: dips too
    s = VerifySurface(grid)
    rows = np.arange(1, 20)
    for n in rows:
        t = np.linspace(0, 8 * n, 50)
        v = s(t, n)
        assert np.all(np.diff(v) >= -1e-12)
    for m in (1.0, 2.5, 4.0):
        per_rows = np.array([float(s(m * n, n)) for n in rows])
        assert np.all(np.diff(per_rows) >= -1e-12)


def test_a_table_needs_rows_to_read_its_surface():
    c = CostTable("measured", draft_ms={1: {1: 1.0}, 16: {1: 2.0}}, verify_rows_ms=GRID)
    with pytest.raises(ValueError, match="rows"):
        c.verify(4)
    assert float(c.verify(8, rows=4)) == pytest.approx(4.0)
    assert c.beyond(4, (1, 64), requests=100)  # 64 rows and 5 tokens a row: past the table
    assert any("16 rows" in x for x in c.beyond(4, (1, 64), requests=100))
    assert any("4 tokens a row" in x for x in c.beyond(4, (1, 2), requests=100))
    assert c.beyond(3, (1, 16), requests=100) == []


def _table(tmp_path, **extra):
    c = CostTable("measured", draft_ms={1: {1: 1.0, 2: 1.5}, 4: {1: 1.2, 2: 1.9}}, verify_rows_ms=GRID)
    def rep():
        return {"draft_ms": {1: {1: 1.1, 2: 1.6}, 4: {1: 1.3, 2: 2.0}},
                "verify_rows_ms": {b: dict(row) for b, row in GRID.items()}}
    c.measurement = {"warnings": [], "fit": {"replicates": [rep(), rep()]}, **extra}
    return write_costs(c, tmp_path / "c.yaml")


def test_the_surface_and_its_refits_round_trip(tmp_path):
    loaded = load_costs(_table(tmp_path))
    assert loaded.verify_rows_ms == GRID and loaded.verify_ms == {}
    reps = loaded.replicates()
    assert len(reps) == 2 and reps[0].draft(1, 2) == pytest.approx(1.6)
    assert float(reps[0].verify(8, rows=4)) == pytest.approx(4.0)
    assert loaded.fingerprint() != CostTable("measured", draft_ms=loaded.draft_ms, verify_ms={1: 2.0}).fingerprint()


@pytest.mark.parametrize("damage, words", [
    (lambda d: d.__setitem__("verify_ms", {1: 2.0}), "exactly one of"),
    (lambda d: d.pop("verify_rows_ms"), "exactly one of"),
    (lambda d: d["verify_rows_ms"][4].__setitem__(2, -1.0), "verify_rows_ms[4][2]"),
    (lambda d: d["verify_rows_ms"].__setitem__(0, {1: 1.0}), "must be >= 1"),
    (lambda d: d["verify_rows_ms"].__setitem__(8, {}), "must not be empty"),
    (lambda d: d["measurement"]["fit"].__setitem__("replicates", {"a": 1}), "list of tables"),
    (lambda d: d["measurement"]["fit"]["replicates"][1].pop("draft_ms"), "replicates[1]"),
    (lambda d: d["measurement"]["fit"]["replicates"][0]["verify_rows_ms"][1].__setitem__(2, "x"), "verify_rows_ms[1][2]"),
])
def test_a_damaged_surface_is_refused_by_name(tmp_path, damage, words):
    path = _table(tmp_path)
    data = yaml.safe_load(path.read_text())
    damage(data)
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]")):
        load_costs(path)
