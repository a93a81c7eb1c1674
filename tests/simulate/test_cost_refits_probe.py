"""What a hostile probe of the fitted cost tables found (each was accepted, or misnamed, before):
refits off the table's grid, refits of another table, refits on a table in total tokens, a refit
that breaks the table's own rules, a refit's bad entry named as the table's, refits left out of the
fingerprint, draft times falling with the batch read as they are, absurd milliseconds, a draft row
not starting at k = 1, and the verify memo truncating fractional rows."""

import copy

import pytest
import yaml

from svt.errors import ConfigError
from svt.simulate.cost_files import load_costs, write_costs
from svt.simulate.costs import CostTable

GRID = {1: {1: 2.0, 2: 2.2}, 4: {1: 3.0, 2: 4.0}}
DRAFT = {1: {1: 0.5, 2: 1.0}, 4: {1: 0.8, 2: 1.5}}


def _data():
    reps = [{"draft_ms": copy.deepcopy(DRAFT), "verify_rows_ms": copy.deepcopy(GRID)} for _ in range(3)]
    return {"kind": "measured", "draft_ms": copy.deepcopy(DRAFT), "verify_rows_ms": copy.deepcopy(GRID),
            "measurement": {"warnings": [], "fit": {"replicates": reps}}}


def _load(tmp_path, data):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    return load_costs(p)


def _reps(d):
    return d["measurement"]["fit"]["replicates"]


@pytest.mark.parametrize("damage, words", [
    (lambda d: _reps(d)[1].__setitem__("draft_ms", {1: {1: 0.6, 2: 1.1}}), "replicates[1]` is not on the table's grid"),
    (lambda d: _reps(d)[2]["verify_rows_ms"][4].pop(2), "replicates[2]` is not on the table's grid"),
    (lambda d: [r["verify_rows_ms"][b].__setitem__(m, 10 * v) for r in _reps(d) for b, row in GRID.items()
                for m, v in row.items()], "outside its refits' span"),
    (lambda d: (d.pop("verify_rows_ms"), d.__setitem__("verify_ms", {1: 2.0, 8: 4.0})), "refits of a `verify_rows_ms`"),
    (lambda d: _reps(d)[0]["draft_ms"][4].__setitem__(2, 0.1), "replicates[0].draft_ms[4][2]"),
    (lambda d: _reps(d)[0]["verify_rows_ms"][4].__setitem__(2, float("nan")), "replicates[0].verify_rows_ms[4][2]"),
    (lambda d: d["verify_rows_ms"][4].__setitem__(2, 1e308), "at most"),
    (lambda d: d["draft_ms"].__setitem__(8, {3: 2.0, 4: 2.5}), "with k from 1"),
])
def test_a_refit_or_table_that_misleads_is_refused_by_name(tmp_path, damage, words):
    d = _data()
    damage(d)
    with pytest.raises(ConfigError, match=words.replace("[", r"\[").replace("]", r"\]").replace("`", "`")):
        _load(tmp_path, d)


def test_the_fingerprint_covers_the_refits(tmp_path):
    a = _load(tmp_path, _data()).fingerprint()
    d = _data()
    _reps(d)[0]["verify_rows_ms"][1][1] = 2.5
    assert _load(tmp_path, d).fingerprint() != a


def test_a_draft_time_falling_with_the_batch_is_read_flat_and_said(tmp_path):
    d = _data()
    d["measurement"]["fit"] = {}
    d["draft_ms"][8] = {1: 0.1, 2: 0.2}
    t = _load(tmp_path, d)
    assert t.draft(8, 2) == pytest.approx(1.5) and t.draft(6, 2) == pytest.approx(1.5)
    assert any("draft_ms[8][2] = 0.2 < draft_ms[4][2] = 1.5" in w for w in t.measurement["warnings"])


def test_the_verify_memo_keeps_fractional_rows_apart(tmp_path):
    t = CostTable("measured", draft_ms=DRAFT, verify_rows_ms=GRID)
    a = float(t.verify(8, rows=2.9))
    assert float(t.verify(8, rows=2)) == pytest.approx(float(t.verify(8.0 + 0 * 1, rows=2)))
    assert float(t.verify(8, rows=2)) != a


def test_a_profiled_table_round_trips_through_the_checks(tmp_path):
    """What --profile-costs writes passes every check above (its refits are its own bootstrap)."""
    t = _load(tmp_path, _data())
    assert load_costs(write_costs(t, tmp_path / "again.yaml")).fingerprint() == t.fingerprint()
