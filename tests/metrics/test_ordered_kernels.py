"""The compiled walks of `svt.metrics.ordered` (`ordered_kernel`, `sums_kernel`, `ranks_kernel`)
against the numpy passes they replace, which stay as the reference: every scope, soft label, ROC
point and bootstrap weight, on ties, one class, sparse positions and scores finer than float32;
and the dense-rank rewrite against a lexsort."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from svt.metrics import ordered
from svt.metrics.ordered import order_keys, pack_rows, score_tables
from svt.metrics.ranks_kernel import dense_ranks, has_ranks, sorts


def _expected_keys(s: np.ndarray) -> np.ndarray:
    """``dense rank << 32 | row`` in ascending (score, row) order."""
    rows = np.lexsort((np.arange(s.size), s))
    rank = np.unique(s, return_inverse=True)[1]
    return (rank[rows].astype(np.uint64) << np.uint64(32)) | rows.astype(np.uint64)


def _both(**kw):
    """The table from the compiled walks and from the numpy passes."""
    saved = ordered.COMPILED
    try:
        ordered.COMPILED = True
        a = score_tables(**kw)
        ordered.COMPILED = False
        b = score_tables(**kw)
    finally:
        ordered.COMPILED = saved
    return a, b


def _equal_tables(a: dict, b: dict) -> None:
    """Counts, hard-label AUCs and ROC points exactly equal (integer and half-integer sums); float
    sums (soft-label AUCs among them) to rounding (another summation order)."""
    scopes = [("overall", a["overall"], b["overall"]), ("excluding_first", a["excluding_first"], b["excluding_first"]),
              *((k, a["per_position"][k], b["per_position"][k]) for k in b["per_position"])]
    assert sorted(a["per_position"]) == sorted(b["per_position"])
    scopes += [(f"soft {k}", a["soft"][k], b["soft"][k]) for k in b["soft"]]
    assert sorted(a["soft"]) == sorted(b["soft"])
    for name, x, y in scopes:
        assert x["n"] == y["n"], name
        assert x.get("reasons") == y.get("reasons"), name
        if str(name).startswith("soft") and y["auc"] is not None:  # soft weights: float sums
            assert x["auc"] == pytest.approx(y["auc"], rel=1e-12, abs=1e-13), name
        else:
            assert x["auc"] == y["auc"], name
        for m in ("accept_rate", "log_loss", "brier", "mean_pred", "ece", "ece_mass"):
            if y.get(m) is None:
                assert x.get(m) is None, (name, m)
            else:
                assert x[m] == pytest.approx(y[m], rel=1e-12, abs=1e-13), (name, m)
    assert a["curves"].get("roc") == b["curves"].get("roc")
    if "reliability" in b["curves"]:
        ra, rb = a["curves"]["reliability"], b["curves"]["reliability"]
        assert ra["count"] == rb["count"]
        np.testing.assert_allclose(ra["mean_pred"], rb["mean_pred"], rtol=1e-12, atol=1e-13)
        np.testing.assert_allclose(ra["rate"], rb["rate"], rtol=1e-12, atol=1e-13)


def _rows_table(rows, values: str):
    """Scores (a grid of 13 values; ``fine``: finer than float32; ``one``: all one value), labels,
    even positions only (odd ones are empty scopes) and two soft labels from drawn rows."""
    s = np.array([r[0] / 12 for r in rows])
    if values == "fine":
        s = 0.5 + (s - 0.5) * 1e-9
    elif values == "one":
        s[:] = 0.25
    y = np.array([r[1] for r in rows], np.int8)
    pos = np.array([r[2] * 2 for r in rows])
    soft = {"accept_prob": (np.array([r[3] for r in rows]) / 4).astype(np.float32),
            "accept_prob_expected": (np.array([r[4] for r in rows]) / 3).astype(np.float32)}
    return s, y, pos, soft


rows_strategy = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 1), st.integers(0, 4),
                                   st.integers(0, 4), st.integers(0, 3)), min_size=1, max_size=80)


@settings(max_examples=60, deadline=None)
@given(rows_strategy, st.booleans(), st.booleans(), st.integers(1, 9), st.sampled_from(["grid", "fine", "one"]))
def test_the_compiled_walks_give_the_numpy_tables(rows, probability, weighted, chunk, values):
    """Ties (a grid of 13 values), scores finer than float32 (`fine`) or all one value, positions
    with gaps, one class, two soft labels, chunks that cut ties (numpy side), bootstrap weights
    with zeros."""
    s, y, pos, soft = _rows_table(rows, values)
    weights = np.array([r[3] for r in rows], dtype=np.float64) if weighted else None
    packed = pack_rows(y, pos, soft)
    key = order_keys(s)
    a, b = _both(s=s, y=y, position=pos, probability=probability, soft=soft, key=key, packed=packed,
                 chunk=chunk, weights=weights, roc_points=7)
    _equal_tables(a, b)


def _real_sized(rng, n: int):
    """Half the scores on a grid of 1,001 values (ties), half distinct; labels drawn at the score,
    seven positions, one soft label."""
    s = np.where(rng.random(n) < 0.5, np.round(rng.random(n), 3), rng.random(n))
    y = (rng.random(n) < s).astype(np.int8)
    return s, y, rng.integers(0, 7, n), {"accept_prob": rng.random(n).astype(np.float32)}


def test_the_compiled_walks_on_a_real_sized_table():
    """Many ties and many distinct scores at once, past one block of the gather (4096 rows)."""
    rng = np.random.default_rng(3)
    n = 50_000
    s, y, pos, soft = _real_sized(rng, n)
    for weights in (None, rng.multinomial(n, np.full(n, 1 / n)).astype(np.float64)):
        a, b = _both(s=s, y=y, position=pos, probability=True, soft=soft, weights=weights)
        _equal_tables(a, b)


def test_records_the_walk_cannot_read_take_the_numpy_pass():
    """A float64 soft label: the records hold it as float64, the compiled walk reads float32 words,
    so the numpy pass runs (and gives the same table as float32 soft labels of the same values)."""
    rng = np.random.default_rng(4)
    n = 3000
    s, y, pos = rng.random(n), (rng.random(n) < 0.5).astype(np.int8), rng.integers(0, 3, n)
    t32 = rng.random(n).astype(np.float32)
    assert ordered._soft_word_columns(pack_rows(y, pos, {"t": t32.astype(np.float64)}), {"t": 0}) is None
    assert ordered._soft_word_columns(pack_rows(y, pos, {"t": t32}), {"t": 0}) is not None
    a = score_tables(s, y, pos, probability=True, soft={"t": t32.astype(np.float64)})
    b = score_tables(s, y, pos, probability=True, soft={"t": t32})
    _equal_tables(a, b)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=1, max_size=300), st.booleans())
def test_dense_ranks_give_the_keys_of_an_exact_sort(values, by_s):
    """From a float32 sort of scores finer than float32 (merged groups out of order), or from the
    order of a coarser score (``by_s``: its ties split out of row order)."""
    v = np.array(values, dtype=np.float64)
    s = 0.5 + v * 1e-10  # 31 values, a few float32 values
    if by_s:
        other = s + np.random.default_rng(len(values)).uniform(0, 1e-12, s.size)  # a finer score, same order
        key = _expected_keys(other)
        assert sorts(key, s)
    else:
        key = np.empty(s.size, dtype=np.uint64)
        ordered._float32_keys(s, key)
        key = ordered._sort_keys(key)
    dense_ranks(key, s, by_s)
    assert np.array_equal(key, _expected_keys(s))
    assert has_ranks(key, s)


def test_dense_ranks_sort_segments_longer_than_the_buffer():
    """A float32 group of 10,000 distinct float64 scores in one segment, past the 4,096-row buffer."""
    rng = np.random.default_rng(5)
    s = np.r_[0.5 + rng.uniform(0, 1e-9, 10_000), rng.random(5000)]
    key = np.empty(s.size, dtype=np.uint64)
    ordered._float32_keys(s, key)
    key = ordered._sort_keys(key)
    dense_ranks(key, s, False)
    assert np.array_equal(key, _expected_keys(s))


def test_has_ranks_and_sorts_reject_what_they_must():
    s = np.array([0.1, 0.2, 0.2, 0.3])
    key = _expected_keys(s)
    assert has_ranks(key, s) and sorts(key, s)
    assert not has_ranks(key, np.array([0.1, 0.2, 0.25, 0.3]))  # a tie the order does not have
    assert not has_ranks(key, np.array([0.1, 0.1, 0.1, 0.3]))  # rises where the score ties
    assert sorts(key, np.array([0.1, 0.1, 0.1, 0.3])) and not sorts(key, np.array([0.1, 0.3, 0.2, 0.4]))


@pytest.fixture
def halves(monkeypatch):
    """Every key array counts as beyond LARGE: the walks run on two threads, one half each."""
    monkeypatch.setattr(ordered, "LARGE", 0)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.integers(0, 12), min_size=2, max_size=600), st.integers(0, 2), st.booleans())
def test_walks_in_halves_give_the_one_walk_keys(values, fine, by_s):
    """Keys made, checked and rewritten by two threads (one half each; the rewrite cut where a
    segment opens, the second half's ranks moved past the first's) are those of one walk. ``fine``:
    scores finer than float32 in neither half, the first or the second."""
    v = np.array(values, dtype=np.float64)
    s = 0.5 + v * 1e-3
    half = s.size // 2
    if fine:  # distinct float64 scores within a float32 value, on one side of the middle
        part = slice(0, half) if fine == 1 else slice(half, None)
        s[part] += np.random.default_rng(len(values)).uniform(0, 1e-10, s[part].size)
    saved = ordered.LARGE
    try:
        ordered.LARGE = 1 << 40
        one, one_exact = np.empty(s.size, np.uint64), None
        one_exact = ordered._float32_keys(s, one)
        ordered.LARGE = 0
        two = np.empty(s.size, np.uint64)
        assert ordered._float32_keys(s, two) == one_exact
        np.testing.assert_array_equal(two, one)
        if by_s:
            other = s + np.random.default_rng(1).uniform(0, 1e-13, s.size)  # finer, the same order
            key = _expected_keys(other)
        else:
            key = ordered._sort_keys(two)
        sorted_one = bool(sorts(key, s))  # one walk
        assert ordered._ranks_from_order(key, s, check_only=True) == sorted_one
        assert sorted_one or not by_s
        ordered._ranks_from_order(key, s, sorted_by_s=by_s)
        np.testing.assert_array_equal(key, _expected_keys(s))
        assert ordered.same_ranks(key, s)
    finally:
        ordered.LARGE = saved


def test_checks_in_halves_see_the_pair_across_the_middle(halves):
    """A score that ties, rises or descends only between the two keys either side of the middle."""
    n = 10_000
    s = np.arange(n, dtype=np.float64)
    key = _expected_keys(s)
    mid = n // 2
    tied = s.copy()
    tied[mid] = tied[mid - 1]  # the order's ranks rise there, the score does not
    assert not ordered.same_ranks(key, tied)
    down = s.copy()
    down[mid] = down[mid - 1] - 0.5  # descends there only
    assert not ordered._ranks_from_order(key, down, check_only=True)
    assert ordered._ranks_from_order(key, s, check_only=True) and ordered.same_ranks(key, s)


@settings(max_examples=60, deadline=None)
@given(rows_strategy, st.booleans(), st.sampled_from(["grid", "fine", "one"]), st.sampled_from([7, 1000]))
def test_the_walk_in_halves_gives_the_numpy_tables(rows, probability, values, roc_points):
    """Beyond LARGE the ordered pass walks up to a cut near the middle and down from the top on two
    threads: the same counts, AUCs and ROC points as the numpy pass (``roc_points`` 1000: a point at
    every group, the first above the cut among them), bins to rounding."""
    s, y, pos, soft = _rows_table(rows, values)
    packed = pack_rows(y, pos, soft)
    saved = ordered.LARGE
    try:
        ordered.LARGE = 0
        a = score_tables(s=s, y=y, position=pos, probability=probability, soft=soft, key=order_keys(s),
                         packed=packed, roc_points=roc_points)
        ordered.LARGE, ordered.COMPILED = saved, False
        b = score_tables(s=s, y=y, position=pos, probability=probability, soft=soft, key=order_keys(s),
                         packed=packed, roc_points=roc_points)
    finally:
        ordered.LARGE, ordered.COMPILED = saved, True
    _equal_tables(a, b)


def test_the_walk_in_halves_on_a_real_sized_table(halves):
    """The walk in halves against one walk, with many groups each side of the cut."""
    s, y, pos, soft = _real_sized(np.random.default_rng(4), 60_000)
    a = score_tables(s=s, y=y, position=pos, probability=True, soft=soft, roc_points=500)
    ordered.LARGE = 1 << 40
    b = score_tables(s=s, y=y, position=pos, probability=True, soft=soft, roc_points=500)
    _equal_tables(a, b)
