"""JSON written by svt is valid JSON: non-finite numbers become null, with what they were recorded
beside them and restored by svt's reader."""

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from svt.errors import ConfigError
from svt.fileio import json_text, read_json


def _strict(text):
    def bad(name):
        raise ValueError(name)

    return json.loads(text, parse_constant=bad)


def test_infinities_round_trip_and_nan_is_null_with_its_reason(tmp_path):
    doc = {"rows": [{"tau": -math.inf}, {"tau": 0.5}, {"tau": math.inf}], "a/b": {"x~": math.nan}, "n": 3}
    text = json_text(doc)
    plain = _strict(text)
    assert plain["rows"][0]["tau"] is None and plain["a/b"]["x~"] is None
    assert plain["non_finite"] == {"/rows/0/tau": "-inf", "/rows/2/tau": "inf", "/a~1b/x~0": "nan"}
    (tmp_path / "r.json").write_text(text)
    back = read_json(tmp_path / "r.json", "Report")
    assert back["rows"][0]["tau"] == -math.inf and back["rows"][2]["tau"] == math.inf
    assert back["a/b"]["x~"] is None  # undefined stays undefined
    # written again (a report re-rendered with figures): the marks survive
    assert _strict(json_text(back))["non_finite"] == plain["non_finite"]


def test_a_mark_that_names_nothing_is_one_clear_error(tmp_path):
    (tmp_path / "r.json").write_text(json.dumps({"x": 1, "non_finite": {"/y/3": "inf"}}))
    with pytest.raises(ConfigError, match="names no null value"):
        read_json(tmp_path / "r.json", "Report")


finite_or_not = st.floats(allow_nan=True, allow_infinity=True)
docs = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(), finite_or_not, st.text(max_size=5)),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c, max_size=4),
                    max_leaves=20)


@given(doc=st.dictionaries(st.text(max_size=4).filter(lambda k: k != "non_finite"), docs, max_size=4))
def test_any_document_is_valid_json_and_infinities_come_back(doc, tmp_path_factory):
    text = json_text(doc)
    _strict(text)
    path = tmp_path_factory.mktemp("j") / "d.json"
    path.write_text(text)
    back = read_json(path, "doc")
    back.pop("non_finite", None)

    def same(a, b):
        if isinstance(a, float) and math.isnan(a):
            return b is None
        if isinstance(a, dict):
            return isinstance(b, dict) and a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
        if isinstance(a, list):
            return isinstance(b, list) and len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
        return a == b

    assert same(doc, back)


def test_a_mark_whose_value_changed_is_dropped(tmp_path):
    """Found by a probe: `svt cache --set max_spec_factor=inf`, then a finite value, left the old
    `non_finite` mark in run.json."""
    path = tmp_path / "r.json"
    path.write_text(json_text({"opt": math.inf, "u": math.nan}))
    doc = read_json(path, "doc")
    doc["opt"] = 1.0
    plain = _strict(json_text(doc))
    assert plain["non_finite"] == {"/u": "nan"}
    doc["u"] = 2.0
    assert "non_finite" not in _strict(json_text(doc))


def test_an_interrupted_atomic_write_removes_its_temporary_file_even_when_the_interrupt_fires_again(
        tmp_path, monkeypatch):
    """polars leaves a Ctrl-C pending: it fires again inside the cleanup, which must still remove
    the temporary file (and the old file stays)."""
    from pathlib import Path

    import pytest

    from svt.fileio import atomic_path

    target = tmp_path / "f.json"
    target.write_text("old")
    real_unlink = Path.unlink
    calls = []

    def unlink_once_interrupted(self, missing_ok=False):
        calls.append(self)
        if len(calls) == 1:
            raise KeyboardInterrupt  # the pending interrupt, at the first call of the cleanup
        return real_unlink(self, missing_ok=missing_ok)

    with pytest.raises(KeyboardInterrupt):
        with atomic_path(target) as tmp:
            tmp.write_text("half")
            monkeypatch.setattr(Path, "unlink", unlink_once_interrupted)
            raise KeyboardInterrupt
    monkeypatch.undo()
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["f.json"]
