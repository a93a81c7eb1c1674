"""Cost tables: every bad value is one message naming the key; a table that stops short of the run's
K is refused where it would be used."""

import math

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from svt.errors import ConfigError
from svt.simulate.cost_files import load_costs

GOOD = {"kind": "measured", "draft_ms": {1: {1: 1.0, 2: 2.0, 3: 3.0}, 8: {1: 1.5, 2: 3.0, 3: 4.5}},
        "verify_ms": {1: 5.0, 4: 6.0, 32: 9.0}}
ROOF = {"kind": "roofline", "model": {"bandwidth_bytes_per_s": 3.35e12, "peak_flops": 9.9e14,
                                      "target": {"params": 8e9, "weight_bytes": 1.6e10, "overhead_s": 1e-3},
                                      "drafter": {"params": 2e8, "weight_bytes": 4e8, "overhead_s": 5e-4}}}


def _write(tmp_path, data):
    p = tmp_path / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    return p


@pytest.mark.parametrize(("edit", "key"), [
    (lambda d: d["verify_ms"].__setitem__(4, -1.0), "verify_ms[4]"),
    (lambda d: d["verify_ms"].__setitem__(4, 0.0), "verify_ms[4]"),
    (lambda d: d["verify_ms"].__setitem__(4, float("nan")), "verify_ms[4]"),
    (lambda d: d["draft_ms"][1].__setitem__(2, float("inf")), "draft_ms[1][2]"),
    (lambda d: d["draft_ms"].__setitem__(1, {}), "must not be empty"),
    (lambda d: d["verify_ms"].__setitem__(0, 1.0), "verify_ms"),
    (lambda d: d.__setitem__("step_ms", {1: {-1: 0.5}}), "step_ms"),
    (lambda d: d.__setitem__("step_ms", {0: {0: 0.5}}), "step_ms"),
    (lambda d: d.__setitem__("step_ms", {1: {0: -0.5}}), "step_ms[1][0]"),
    (lambda d: d.__setitem__("step_ms", {}), "step_ms"),
])
def test_bad_measured_values(tmp_path, edit, key):
    import copy

    d = copy.deepcopy(GOOD)
    edit(d)
    with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
        load_costs(_write(tmp_path, d))


@pytest.mark.parametrize("key", ["bandwidth_bytes_per_s", "peak_flops", "target.params", "drafter.weight_bytes",
                                 "target.overhead_s"])
def test_bad_roofline_constants(tmp_path, key):
    import copy

    d = copy.deepcopy(ROOF)
    node = d["model"]
    *path, last = key.split(".")
    for p in path:
        node = node[p]
    node[last] = -1.0
    with pytest.raises(ConfigError, match=f"model.{key}"):
        load_costs(_write(tmp_path, d))


def test_table_short_of_k_is_refused(tmp_path):
    c = load_costs(_write(tmp_path, GOOD))
    c.check_covers(3)
    with pytest.raises(ConfigError, match="stops at k = 3"):
        c.check_covers(5)


@settings(max_examples=40, deadline=None)
@given(st.recursive(st.one_of(st.none(), st.booleans(), st.floats(allow_nan=True), st.integers(-5, 50),
                              st.text(max_size=4)),
                    lambda c: st.dictionaries(st.one_of(st.integers(-2, 40), st.text(max_size=3)), c, max_size=4),
                    max_leaves=12))
def test_random_tables_never_crash_and_never_give_bad_times(tmp_path_factory, junk):
    data = {"kind": "measured", "draft_ms": junk, "verify_ms": junk} if isinstance(junk, dict) else junk
    p = tmp_path_factory.mktemp("c") / "c.yaml"
    p.write_text(yaml.safe_dump(data))
    try:
        c = load_costs(p)
    except ConfigError:
        return
    for t in (1, 2, 7):
        v = float(c.verify(t))
        assert math.isfinite(v) and v > 0
    d = c.draft(1, 1)
    assert math.isfinite(d) and d > 0


@pytest.mark.parametrize("measurement", [5, "busy", {"warnings": "load"}])
def test_a_damaged_measurement_block_is_one_message(tmp_path, measurement):
    with pytest.raises(ConfigError, match="`measurement` must be a mapping"):
        load_costs(_write(tmp_path, {**GOOD, "measurement": measurement}))
    table = load_costs(_write(tmp_path, {**GOOD, "measurement": {"warnings": ["noisy"], "reliable": False}}))
    assert table.measurement["warnings"] == ["noisy"]
