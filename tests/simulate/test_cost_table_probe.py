"""What a hostile probe of the cost tables and the chain replay found (issue 53): a key given twice,
digits that are not ASCII, booleans in a roofline model, draft times that fall as k grows, a table
that says it is unreliable without a reason, a table profiled on another pair, a replay past the
table's measured cells, and a table so slow that throughput underflows to zero."""

import copy
import json

import pytest
import yaml

from svt.errors import ConfigError
from svt.report import EvaluateOptions, evaluate
from svt.report.render import to_markdown
from svt.simulate.cost_files import load_costs
from tests.conftest import ROOT

GOOD = {"kind": "measured", "draft_ms": {1: {1: 1.0, 2: 2.0, 3: 3.0, 4: 4.0}, 8: {1: 1.5, 2: 3.0, 3: 4.5, 4: 6.0}},
        "verify_ms": {1: 5.0, 4: 6.0, 512: 9.0}}


def _write(tmp_path, data, name="c.yaml"):
    p = tmp_path / name
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


@pytest.mark.parametrize("text,words", [
    ("kind: measured\ndraft_ms: {1: {1: 1.0}}\nverify_ms: {1: 1.0}\nverify_mss: {2: 1.0}\n", "unknown key(s) 'verify_mss'"),
    ("kind: measured\ndraft_ms:\n  1: {1: 1.0}\n  1: {1: 2.0}\nverify_ms: {1: 1.0}\n", "found the key 1 twice"),
    ("kind: measured\ndraft_ms: {'1': {1: 1.0}, 1: {1: 2.0}}\nverify_ms: {1: 1.0}\n", "gives batch 1 twice"),
    ("kind: measured\ndraft_ms: {'¹': {1: 1.0}}\nverify_ms: {1: 1.0}\n", "has the key '¹'"),
    ("kind: measured\ndraft_ms: {'１': {1: 1.0}}\nverify_ms: {1: 1.0}\n", "has the key '１'"),
    ("kind: measured\ndraft_ms: {1: {1: 1.0, 2: 5.5, 3: 1.0}}\nverify_ms: {1: 1.0}\n", "`draft_ms[1][3]` = 1.0 is below"),
])
def test_bad_measured_tables_are_one_message(tmp_path, text, words):
    import re

    with pytest.raises(ConfigError, match=re.escape(words)):
        load_costs(_write(tmp_path, text))


def test_booleans_are_not_numbers_in_a_roofline_model(tmp_path):
    data = yaml.safe_load((ROOT / "configs" / "costs" / "h100-llama8b-eagle.yaml").read_text())
    load_costs(_write(tmp_path, data))
    bad = copy.deepcopy(data)
    bad["model"]["target"]["overhead_s"] = True
    with pytest.raises(ConfigError, match="model.target.overhead_s` is a boolean"):
        load_costs(_write(tmp_path, bad))


def test_a_table_that_says_it_is_unreliable_is_flagged(tmp_path):
    t = load_costs(_write(tmp_path, {**GOOD, "measurement": {"reliable": False}}))
    assert t.measurement["warnings"] and "not reliable" in t.measurement["warnings"][0]
    assert not load_costs(_write(tmp_path, {**GOOD, "measurement": {"reliable": True}})).measurement.get("warnings")


def test_a_table_profiled_on_another_pair_is_named(tmp_path):
    t = load_costs(_write(tmp_path, {**GOOD, "models": {"weights": {"target": "aaaa", "draft": "bbbb"}}}))
    same = {"models": {"target": {"weights_sha256_16": "aaaa"}, "draft": {"weights_sha256_16": "bbbb"}}}
    other = {"models": {"target": {"weights_sha256_16": "aaaa"}, "draft": {"weights_sha256_16": "cccc"}}}
    assert t.pair_problems([same]) == []
    assert t.pair_problems([other]) == ["it was profiled on another draft (weights bbbb) than the run's (cccc)"]
    assert load_costs(_write(tmp_path, GOOD)).pair_problems([other]) == []  # a table without hashes: no claim


def test_the_replay_says_where_it_reads_past_the_table(small_run, tmp_path):
    k = json.loads((small_run / "run.json").read_text())["k"]
    table = {**GOOD, "draft_ms": {b: {j: float(j) * b for j in range(1, k + 1)} for b in (1, 2)},
             "verify_ms": {1: 5.0, 4: 6.0}}
    rep = evaluate([small_run], EvaluateOptions(features=["q_max"], costs=str(_write(tmp_path, table))))
    beyond = rep["simulation"]["costs"]["beyond_table"]
    requests = rep["simulation"]["requests"]
    assert beyond == [f"verify_ms up to 4 tokens, the replay needs {requests * (k + 1)}",
                      f"draft_ms up to batch 2, the replay needs {requests}"]
    md = to_markdown(rep)
    assert "The cost table does not cover this replay" in md
    assert f"The replay holds {requests} requests (those every predictor may be scored on): rows with B above" in md
    wide = {**table, "draft_ms": {b: {j: float(j) * b for j in range(1, k + 1)} for b in (1, 64)},
            "verify_ms": {1: 5.0, 512: 9.0}}
    rep = evaluate([small_run], EvaluateOptions(features=["q_max"], costs=str(_write(tmp_path, wide, "w.yaml"))))
    assert rep["simulation"]["costs"]["beyond_table"] == []


def test_a_table_so_slow_that_throughput_is_zero_is_no_traceback(small_run, tmp_path):
    """A measured table that slow is refused (no step takes 1e308 ms); a roofline model with absurd
    constants still loads, and its zero throughputs give a dash, not a ZeroDivisionError."""
    k = json.loads((small_run / "run.json").read_text())["k"]
    table = {**GOOD, "draft_ms": {1: {j: 1e308 for j in range(1, k + 1)}}, "verify_ms": {1: 1e308}}
    with pytest.raises(ConfigError, match="at most"):
        load_costs(_write(tmp_path, table, "measured.yaml"))
    huge = {"params": 1e300, "weight_bytes": 1e300, "overhead_s": 0.0}
    roof = {"kind": "roofline", "model": {"bandwidth_bytes_per_s": 1e-300, "peak_flops": 1e-300,
                                          "target": huge, "drafter": huge}}
    rep = evaluate([small_run], EvaluateOptions(features=["q_max"], costs=str(_write(tmp_path, roof))))
    assert any(r["throughput_given_up"] is None for r in rep["simulation"]["rules"])
    assert "—" in to_markdown(rep)
