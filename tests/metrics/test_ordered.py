"""The one-sort score tables (`svt.metrics.ordered`) against scikit-learn and the public metric
functions: every scope, ties, chunk cuts inside tie groups, float64 scores that float32 rounding
merges, soft labels, shared orders and the ROC points."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import brier_score_loss, log_loss, roc_auc_score, roc_curve

from svt.metrics import ece, ordered
from svt.metrics.ordered import order_keys, same_ranks, score_tables


def _data(n, seed, kind):
    rng = np.random.default_rng(seed)
    p = rng.random(n)
    if kind == "ties":
        p = np.round(p, 2)
    elif kind == "merged":  # distinct float64 values that round to one float32 value
        p = 0.5 + rng.integers(0, 7, n) * 1e-12 + np.round(rng.random(n), 1) * 0.1
    s = p if kind != "float32" else p.astype(np.float32).astype(np.float64)
    pos = rng.integers(0, 5, n)
    y = (rng.random(n) < 0.2 + 0.6 * s).astype(np.int8)
    return s, y, pos


def _check_scope(block, y, s, probability=True):
    assert block["n"] == y.size
    assert block["accept_rate"] == pytest.approx(y.mean(), abs=1e-12)
    assert block["auc"] == pytest.approx(roc_auc_score(y, s), abs=1e-12)
    if probability:
        assert block["log_loss"] == pytest.approx(log_loss(y, s, labels=[0, 1]), abs=1e-10)
        assert block["brier"] == pytest.approx(brier_score_loss(y, s), abs=1e-12)
        assert block["mean_pred"] == pytest.approx(s.mean(), abs=1e-12)
        assert block["ece"] == pytest.approx(ece(y, s), abs=1e-12)
        assert block["ece_mass"] == pytest.approx(ece(y, s, strategy="mass"), abs=1e-12)


@pytest.fixture(params=["compiled", "dense", "segments"])
def path(request, monkeypatch):
    """Every way of counting tie groups: the compiled walk, or the numpy pass with one [group,
    position] table or each scope's rows."""
    monkeypatch.setattr(ordered, "COMPILED", request.param == "compiled")
    monkeypatch.setattr(ordered, "DENSE_LIMIT", 10**9 if request.param == "dense" else 0)
    return request.param


@pytest.mark.parametrize("kind", ["float32", "float64", "ties", "merged"])
@pytest.mark.parametrize("chunk", [97, None])
def test_every_scope_equals_sklearn(kind, chunk, path):
    s, y, pos = _data(4000, 1, kind)
    t = score_tables(s, y, pos, probability=True, chunk=chunk)
    _check_scope(t["overall"], y, s)
    m = pos > 0
    _check_scope(t["excluding_first"], y[m], s[m])
    assert sorted(t["per_position"]) == sorted(np.unique(pos).tolist())
    for k, block in t["per_position"].items():
        _check_scope(block, y[pos == k], s[pos == k])


def test_merged_float32_groups_are_ordered_by_the_float64_score():
    """Scores 1e-12 apart share a float32 value; their order and ties must still be exact."""
    s = np.r_[np.full(50, 0.3), 0.3 + 1e-12 * np.arange(1, 51)]
    y = np.r_[np.zeros(50, np.int8), np.ones(50, np.int8)]
    t = score_tables(s, y, np.zeros(100, int), probability=True)
    assert t["overall"]["auc"] == 1.0
    assert roc_auc_score(y, s) == 1.0


def test_signed_zeros_and_negative_scores_tie_and_order():
    s = np.array([-0.0, 0.0, -1.5, 2.0, -0.0, 3.0, -1.5])
    y = np.array([1, 0, 0, 1, 0, 1, 1], np.int8)
    t = score_tables(s, y, np.zeros(7, int), probability=False)
    assert t["overall"]["auc"] == pytest.approx(roc_auc_score(y, s), abs=1e-15)
    assert t["overall"]["log_loss"] is None and "reasons" in t["overall"]


def test_soft_labels_are_weighted_pairs_of_distinct_rows(path):
    s, y, pos = _data(3000, 2, "ties" if path == "dense" else "float64")
    tsoft = np.random.default_rng(3).random(s.size).astype(np.float32)
    t = score_tables(s, y, pos, probability=True, soft={"a": tsoft}, chunk=61)["soft"]["a"]
    w = tsoft.astype(np.float64)
    yy, ss, ww = np.r_[np.ones_like(w), np.zeros_like(w)], np.r_[s, s], np.r_[w, 1 - w]
    W, selfp = w.sum() * (1 - w).sum(), np.sum(w * (1 - w))
    assert t["auc"] == pytest.approx((roc_auc_score(yy, ss, sample_weight=ww) * W - 0.5 * selfp) / (W - selfp),
                                     abs=1e-10)
    assert t["log_loss"] == pytest.approx(log_loss(yy, ss, sample_weight=ww), abs=1e-10)
    assert t["ece"] == pytest.approx(ece(w, s), abs=1e-12)
    assert t["ece_mass"] == pytest.approx(ece(w, s, strategy="mass"), abs=1e-12)


def test_a_monotone_transform_reuses_the_order_and_gives_the_same_auc():
    s, y, pos = _data(5000, 4, "float32")
    orders: list = []
    k1 = order_keys(s, orders)
    k2 = order_keys(np.log(s / (1 - s)), orders)  # monotone: no new sort
    assert len(orders) == 1
    assert np.array_equal(k1 & np.uint64(0xFFFFFFFF), k2 & np.uint64(0xFFFFFFFF))
    order_keys(-s, orders)  # reversed: a new sort
    assert len(orders) == 2
    a = score_tables(s, y, pos, probability=False, key=k1)["overall"]["auc"]
    b = score_tables(np.log(s / (1 - s)), y, pos, probability=False, key=k2)["overall"]["auc"]
    assert a == b == pytest.approx(roc_auc_score(y, s), abs=1e-12)


def test_roc_points_lie_on_sklearns_curve(path):
    s, y, pos = _data(2000, 5, "ties")
    roc = score_tables(s, y, pos, probability=True)["curves"]["roc"]
    fpr, tpr, _ = roc_curve(y, s, drop_intermediate=False)
    assert roc["fpr"][0] == roc["tpr"][0] == 0.0 and roc["fpr"][-1] == roc["tpr"][-1] == 1.0
    assert len(roc["fpr"]) <= 201
    for f, t in zip(roc["fpr"], roc["tpr"], strict=True):
        i = np.flatnonzero(np.isclose(fpr, f) & np.isclose(tpr, t))
        assert i.size, (f, t)


def test_one_class_gives_no_auc_and_says_why():
    t = score_tables(np.array([0.2, 0.4]), np.array([1, 1], np.int8), np.array([0, 1]), probability=True)
    assert t["overall"]["auc"] is None
    assert "accepted" in t["overall"]["reasons"]["auc"]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 6), st.integers(0, 1), st.integers(0, 2)), min_size=2, max_size=60),
       st.integers(1, 9))
def test_chunks_and_counting_paths_never_change_a_number(rows, chunk):
    s = np.array([r[0] / 6 for r in rows])
    y = np.array([r[1] for r in rows], np.int8)
    pos = np.array([r[2] for r in rows])
    a = score_tables(s, y, pos, probability=True, chunk=chunk)  # the compiled walk
    saved = ordered.DENSE_LIMIT, ordered.COMPILED
    others = []
    try:
        ordered.COMPILED = False
        for limit, ch in ((0, 1 << 20), (10**9, chunk)):  # each scope's rows; one tie table
            ordered.DENSE_LIMIT = limit
            others.append(score_tables(s, y, pos, probability=True, chunk=ch))
    finally:
        ordered.DENSE_LIMIT, ordered.COMPILED = saved
    for b in others:
        for scope in ("overall", "excluding_first"):
            for m in ("auc", "n", "accept_rate"):
                assert a[scope][m] == b[scope][m]  # integer sums: exactly equal
            for m in ("log_loss", "ece", "ece_mass", "brier"):
                assert a[scope][m] == pytest.approx(b[scope][m], abs=1e-12)
        assert a["curves"]["roc"] == b["curves"]["roc"]


@pytest.mark.parametrize("large", [False, True])
def test_scores_finer_than_float32_everywhere_are_reordered_by_the_float64_score(large, monkeypatch):
    """Float32 rounding merges scores throughout; ``large``: the in-place sort and small chunks."""
    if large:
        monkeypatch.setattr(ordered, "LARGE", 0)
        monkeypatch.setattr(ordered, "CHUNK", 5000)
    rng = np.random.default_rng(9)
    n = 1 << 17
    s = 0.5 + rng.uniform(-1e-8, 1e-8, n)
    y = (rng.random(n) < s).astype(np.int8)
    pos = rng.integers(0, 3, n)
    t = score_tables(s, y, pos, probability=True)
    _check_scope(t["overall"], y, s)
    _check_scope(t["per_position"][2], y[pos == 2], s[pos == 2])


def _expected_keys(s: np.ndarray) -> np.ndarray:
    """``dense rank << 32 | row`` in ascending (score, row) order, by lexsort and unique."""
    rows = np.lexsort((np.arange(s.size), s))
    rank = np.unique(s, return_inverse=True)[1]
    return (rank[rows].astype(np.uint64) << np.uint64(32)) | rows.astype(np.uint64)


def _same_order(a: np.ndarray, b: np.ndarray) -> bool:
    """The same rows in the same order with the same ties (rank values may differ: a float32
    sort's ranks are bit patterns, a rebuilt order's are dense)."""
    low, high = np.uint64(0xFFFFFFFF), np.uint64(32)
    return bool(np.array_equal(a & low, b & low)
                and np.array_equal(np.diff(a >> high) != 0, np.diff(b >> high) != 0))


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("in_place", [False, True])
def test_a_reused_order_gives_the_keys_of_a_fresh_sort(in_place, compiled, monkeypatch):
    """Clipping merges values an earlier order kept apart: the rows of each new tie are put back
    in row order, so the keys (and every float sum over a tie) do not depend on which order was
    reused. The scores are finer than float32 (a fresh float32 sort merges them), so the earlier
    order is reused in place, and by the numpy path out of place too (the compiled path sorts the
    merged groups of a fresh float32 sort instead: one walk, cheaper than a reuse)."""
    monkeypatch.setattr(ordered, "COMPILED", compiled)
    rng = np.random.default_rng(11)
    q = 0.5 + rng.uniform(-1e-7, 1e-7, 20_000)
    clipped = np.clip(q, 0.5 - 5e-8, 0.5 + 5e-8)
    orders: list = []
    order_keys(q, orders)
    first = orders[0]
    reused = order_keys(clipped, orders, in_place=in_place)
    assert len(orders) == (2 if compiled and not in_place else 1)  # reused, or a fresh sort kept
    assert np.shares_memory(reused, first) == in_place  # in place: the same memory, no copy
    assert (orders[0] is reused) == in_place  # kept as a new object: no cache under the old one hits it
    assert _same_order(_expected_keys(clipped), reused)


def test_a_strictly_increasing_transform_shares_the_key():
    """logit(q) ranks exactly as q: the same key object, no sort; a transform that merges two
    scores (a clip) does not share it."""
    rng = np.random.default_rng(14)
    q = rng.random(5000).astype(np.float32).astype(np.float64)
    orders: list = []
    key = order_keys(q, orders)
    assert order_keys(np.log(q / (1 - q)), orders) is key
    assert same_ranks(key, q ** 3)
    clipped = np.clip(q, 0.1, 1.0)
    assert not same_ranks(key, clipped)
    other = order_keys(clipped, orders)
    assert other is not key
    assert _same_order(other, _expected_keys(clipped))
    assert not same_ranks(key, -q) and not same_ranks(key[::-1].copy(), q)


def test_a_fresh_float32_sort_is_reordered_only_where_rounding_merged():
    """A few float64 scores share a float32 value with another: only their group is re-sorted, and
    the keys are those of an exact sort."""
    rng = np.random.default_rng(15)
    s = rng.random(50_000).astype(np.float32).astype(np.float64)
    s[:40] = s[100] + rng.uniform(-1e-9, 1e-9, 40)  # forty scores finer than float32, one group
    s[40:70] = s[200] + rng.uniform(-1e-9, 1e-9, 30)  # and a second group
    assert _same_order(order_keys(s), _expected_keys(s))


def test_a_score_that_is_no_probability_shares_the_ordered_pass():
    """The second score ranks as the first: its table comes from the first's ordered pass and is
    the table it gets alone."""
    rng = np.random.default_rng(16)
    q = rng.random(4000).astype(np.float32).astype(np.float64)
    y = (rng.random(q.size) < q).astype(np.int8)
    pos = rng.integers(0, 4, q.size)
    soft = {"accept_prob": rng.random(q.size).astype(np.float32)}
    packed = ordered.pack_rows(y, pos, soft)
    shared: dict = {}
    orders: list = []
    score_tables(q, y, pos, probability=True, soft=soft, key=order_keys(q, orders), packed=packed, shared=shared)
    z = np.log(q / (1 - q))
    with_pass = score_tables(z, y, pos, probability=False, soft=soft, key=order_keys(z, orders), packed=packed,
                             shared=shared)
    alone = score_tables(z, y, pos, probability=False, soft=soft)
    assert sum(1 for k in shared if k[0] == "ordered pass") == 1  # one pass, shared
    # a probability that ranks the same (q**2) needs its own pass: its equal-mass bins hold its values
    sq = score_tables(q ** 2, y, pos, probability=True, soft=soft, key=order_keys(q ** 2, orders), packed=packed,
                      shared=shared)
    sq_alone = score_tables(q ** 2, y, pos, probability=True, soft=soft)
    for block in (with_pass, alone, sq, sq_alone):
        block.pop("_key")
    assert with_pass == alone
    assert sq["overall"]["ece_mass"] == pytest.approx(sq_alone["overall"]["ece_mass"], abs=1e-12)
    assert sq["per_position"][1]["ece_mass"] == pytest.approx(sq_alone["per_position"][1]["ece_mass"], abs=1e-12)


def test_float32_scores_give_the_float64_table():
    """Scores held as float32 (large runs keep exact float32 values so) give the same numbers:
    bins and logs are computed in float64 (0.7f * 10 is 7.0 in float32 but 6.99... in float64)."""
    rng = np.random.default_rng(12)
    s32 = np.r_[np.float32(0.7), np.float32(0.9), rng.random(3000).astype(np.float32)]
    y = (rng.random(s32.size) < 0.6).astype(np.int8)
    pos = rng.integers(0, 3, s32.size)
    a = score_tables(s32, y, pos, probability=True)
    b = score_tables(s32.astype(np.float64), y, pos, probability=True)
    for m in ("auc", "ece", "ece_mass", "log_loss", "brier", "mean_pred"):
        assert a["overall"][m] == b["overall"][m]
    assert a["curves"] == b["curves"]


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("in_place", [False, True])
def test_a_reused_order_puts_ties_across_chunks_in_row_order(in_place, compiled, monkeypatch):
    monkeypatch.setattr(ordered, "COMPILED", compiled)
    monkeypatch.setattr(ordered, "CHUNK", 7)
    rng = np.random.default_rng(13)
    q = 0.5 + rng.uniform(-1e-7, 1e-7, 3000)
    clipped = np.clip(q, 0.5 - 6e-8, 0.5 + 6e-8)
    orders: list = []
    order_keys(q, orders)
    reused = order_keys(clipped, orders, in_place=in_place)
    assert len(orders) == (2 if compiled and not in_place else 1)
    assert _same_order(_expected_keys(clipped), reused)


def _tables_close(a, b):
    """Every scope's every metric equal (to rounding: weighted sums add in another order)."""
    assert sorted(a["per_position"]) == sorted(b["per_position"])
    scopes = [("overall", a["overall"], b["overall"]), ("excluding_first", a["excluding_first"], b["excluding_first"]),
              *((k, a["per_position"][k], b["per_position"][k]) for k in a["per_position"])]
    for name, x, y in scopes:
        assert x["n"] == y["n"], name
        for m in ("accept_rate", "auc", "log_loss", "brier", "mean_pred", "ece", "ece_mass"):
            if y.get(m) is None:
                assert x.get(m) is None, (name, m)
            else:
                assert x[m] == pytest.approx(y[m], rel=1e-11, abs=1e-12), (name, m)


@pytest.mark.parametrize("kind", ["float64", "ties"])
@pytest.mark.parametrize("probability", [True, False])
@pytest.mark.parametrize("chunk", [97, None])
def test_weights_score_the_rows_repeated_by_their_weights(kind, probability, chunk, path):
    """A bootstrap resample is row weights through the same accumulators: the table of weighted
    rows is exactly the table of the rows repeated that many times (every scope, every metric),
    with a position no drawn row reaches absent."""
    s, y, pos = _data(3000, 4, kind)
    rng = np.random.default_rng(9)
    w = rng.multinomial(3000, np.full(3000, 1 / 3000)).astype(np.float64)
    w[pos == 3] = 0.0  # a position no resampled request reaches
    t = score_tables(s, y, pos, probability=probability, chunk=chunk, weights=w)
    rep = np.repeat(np.arange(s.size), w.astype(np.int64))
    ref = score_tables(s[rep], y[rep], pos[rep], probability=probability, chunk=chunk)
    assert 3 not in t["per_position"]
    _tables_close(t, ref)
    assert t["curves"] == {} and t["soft"] == {}


def test_bootstrap_intervals_are_percentiles_of_weighted_resamples():
    """The intervals are the 2.5th and 97.5th percentiles of the metrics of resamples drawn as
    whole requests, each the table of its requests' rows repeated by how often they were drawn."""
    s, y, pos = _data(600, 2, "ties")
    req = np.arange(600) // 6  # 100 requests of 6 drafts
    cis = ordered.bootstrap_intervals(s, y, pos, req, probability=True, n=30, seed=5)
    rng = np.random.default_rng(5)
    ref = {"overall": [], "excluding_first": [], 2: []}
    for _ in range(30):
        counts = rng.multinomial(100, np.full(100, 1 / 100))
        rows = np.repeat(np.arange(600), counts[req])
        t = score_tables(s[rows], y[rows], pos[rows], probability=True)
        ref["overall"].append(t["overall"]["log_loss"])
        ref["excluding_first"].append(t["excluding_first"]["auc"])
        ref[2].append(t["per_position"][2]["ece"])
    for scope, metric in (("overall", "log_loss"), ("excluding_first", "auc"), (2, "ece")):
        np.testing.assert_allclose(cis[scope][metric], np.percentile(ref[scope], [2.5, 97.5]), rtol=1e-10)
    from svt.metrics.specs import names

    assert set(cis["overall"]) == set(names("table", compared=True))  # every compared metric has one


def test_an_order_rewritten_in_place_is_no_shared_hit(monkeypatch):
    """Beyond LARGE an order that sorts a coarser score is rewritten in place for it: its ordered pass
    must not be taken from the earlier score's (shared) entry, which referred to the same memory."""
    from svt.metrics import ordered

    monkeypatch.setattr(ordered, "LARGE", 1000)
    rng = np.random.default_rng(4)
    a = rng.random(20_000)
    b = np.round(a, 1)  # ascends along a's order, with ties a does not have: a's order is rewritten
    y = (rng.random(a.size) < a).astype(np.float64)
    pos = rng.integers(0, 4, a.size)
    packed = ordered.pack_rows(y, pos)
    orders, shared = [], {}
    for s in (a, b, a):
        key = ordered.order_keys(s, orders, in_place=True)
        got = ordered.score_tables(s, y, pos, probability=False, key=key, packed=packed, shared=shared)
        want = ordered.score_tables(s, y, pos, probability=False)
        assert got["overall"]["auc"] == want["overall"]["auc"]
        assert got["curves"]["roc"] == want["curves"]["roc"]


def _assert_identical(a, b, where="table"):
    """Two tables equal bit for bit: the same keys, every number and array the same."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for key in a:
            _assert_identical(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple, np.ndarray)):
        assert np.array_equal(np.asarray(a), np.asarray(b), equal_nan=np.asarray(a).dtype.kind == "f"), where
    elif isinstance(a, float) and np.isnan(a):
        assert isinstance(b, float) and np.isnan(b), where
    else:
        assert a == b, where


@pytest.mark.parametrize("kind", ["float64", "merged"])
def test_the_unordered_pass_beside_the_sort_gives_the_same_table(kind, monkeypatch):
    """A large score scored from the main thread runs its unordered pass on a second thread, beside
    the sort and the ordered pass, and its exact walks (keys, rank checks, dense ranks) in two
    halves: the same table, weights and soft labels included, and float64 scores that float32
    rounding merges into groups cut by the halves."""
    import threading

    rng = np.random.default_rng(7)
    s, y, pos = _data(3000, 7, kind)
    soft = {"t": rng.random(s.size).astype(np.float32)}
    w = rng.integers(0, 3, s.size).astype(np.float64)
    seen = []
    real = ordered._score_sums

    def spy(*args, **kwargs):
        seen.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(ordered, "_score_sums", spy)
    monkeypatch.setattr(ordered, "available_cores", lambda: 2)  # as on two cores (a test worker may be pinned to one)
    alone = [score_tables(s, y, pos, probability=True, soft=soft), score_tables(s, y, pos, probability=True, weights=w)]
    assert not any(n.startswith("svt-sums") for n in seen)
    monkeypatch.setattr(ordered, "BESIDE", 1000)
    beside = [score_tables(s, y, pos, probability=True, soft=soft), score_tables(s, y, pos, probability=True, weights=w)]
    assert sum(n.startswith("svt-sums") for n in seen) == 2
    for a, b in zip(alone, beside, strict=True):
        _assert_identical(a, b)
    # a weighted table is the table of the rows repeated by their weights
    rep = np.repeat(np.arange(s.size), w.astype(int))
    _check_scope(beside[1]["overall"], y[rep], s[rep])
    _check_scope(beside[0]["overall"], y, s)
