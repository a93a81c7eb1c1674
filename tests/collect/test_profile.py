import numpy as np
import pytest

from svt.collect.profile import profile_pair
from svt.simulate.cost_files import load_costs, write_costs


def test_profile_writes_a_loadable_measured_table(tiny_pair, tmp_path):
    table = profile_pair(tiny_pair.target, tiny_pair.draft, k=3, batches=(1, 4), context=32, repeats=2)
    assert sorted(table.draft_ms) == [1, 4] and sorted(table.draft_ms[1]) == [1, 2, 3]
    assert all(v > 0 for row in table.draft_ms.values() for v in row.values())
    # drafting k tokens is k sequential forwards: cumulative times grow with k
    assert table.draft_ms[4][3] > table.draft_ms[4][1]
    assert {b: sorted(row) for b, row in table.verify_rows_ms.items()} == {1: [1, 2, 3, 4], 4: [1, 2, 3, 4]}
    loaded = load_costs(write_costs(table, tmp_path / "c.yaml"))
    assert loaded.kind == "measured"
    assert np.isclose(loaded.draft(4, 3), table.draft_ms[4][3] + table.step_ms[4][3], rtol=1e-3)  # with the step's work
    # the file holds the fitted values (4 decimals), read back at (rows, tokens)
    for b, row in table.verify_rows_ms.items():
        for m, ms in row.items():
            assert loaded.verify_rows_ms[b][m] == round(ms, 4)
            assert float(loaded.verify(b * m, rows=b)) == pytest.approx(round(ms, 4), rel=1e-12)
    assert all(v > 0 for row in table.verify_rows_ms.values() for v in row.values())


def test_the_profile_times_the_engines_work_outside_its_forwards_and_the_replay_charges_it(tiny_pair, tmp_path):
    """step_ms[batch][k] for k = 0 and K, from real engine steps: loaded back, charged by draft()
    with the drafter's passes (plain decoding pays it alone) and interpolated in k and batch."""
    from svt.simulate.costs import CostTable

    table = profile_pair(tiny_pair.target, tiny_pair.draft, k=3, batches=(1, 4), context=24, repeats=2)
    assert {b: sorted(row) for b, row in table.step_ms.items()} == {1: [0, 1, 3], 4: [0, 1, 3]}
    assert all(v >= 0 for row in table.step_ms.values() for v in row.values())
    assert table.measurement["step"]["batches"] == [1, 4]
    # each cell: the engine step's mean beyond the time inside its own forwards
    for b, row in table.step_ms.items():
        for k, v in row.items():
            step = table.measurement["step"]["step_means_ms"][str(b)][str(k)]
            fwd = table.measurement["step"]["forward_means_ms"][str(b)][str(k)]
            assert 0 < fwd < step and v == pytest.approx(step - fwd, abs=1e-3)
    loaded = load_costs(write_costs(table, tmp_path / "c.yaml"))
    assert loaded.step_ms == {b: {k: round(v, 4) for k, v in row.items()} for b, row in table.step_ms.items()}
    assert loaded.draft(4, 0) == pytest.approx(loaded.step_ms[4][0])
    assert loaded.draft(4, 3) == pytest.approx(loaded.draft_ms[4][3] + loaded.step_ms[4][3])
    plain = CostTable("measured", draft_ms={1: {1: 1.0}, 4: {1: 2.0}}, verify_ms={1: 1.0},
                      step_ms={1: {0: 0.5, 2: 1.5}, 4: {0: 1.0, 2: 3.0}})
    assert plain.draft(1, 0) == 0.5 and plain.draft(1, 1) == pytest.approx(1.0 + 1.0)
    assert plain.draft(2, 0) == pytest.approx(0.5 + (1.0 - 0.5) / 3)  # between batches 1 and 4
    assert plain.step_overhead(8, 2) == pytest.approx(6.0)  # in proportion to the batch beyond 4
    assert plain.step_overhead(1, 1) == pytest.approx(1.0)  # linear in k
    assert CostTable("measured", draft_ms={1: {1: 1.0}}, verify_ms={1: 1.0}).draft(1, 0) == 0.0


def test_the_table_says_how_sure_it_is_and_reads_back(tiny_pair, tmp_path):
    table = profile_pair(tiny_pair.target, tiny_pair.draft, k=2, batches=(1, 2), context=16, repeats=3)
    m = table.measurement
    assert m["repeats"] == 3 and m["cores"] >= 1 and m["threads"] >= 1
    assert set(m["max_spread"]) == {"draft", "verify"} and all(v >= 0 for v in m["max_spread"].values())
    assert m["reliable"] == (not m["warnings"])
    loaded = load_costs(write_costs(table, tmp_path / "c.yaml"))
    assert loaded.measurement == m


def test_a_time_that_falls_as_the_batch_grows_beyond_the_noise_is_flagged():
    from svt.collect.profile import falls_with_batch

    # the busy machine's table: 24 ms at batch 1, 1.4 ms at batch 4
    assert falls_with_batch({1: 24.0, 2: 2.0, 4: 1.4}, {}) == ["24 ms at 1 > 2 ms at 2", "24 ms at 1 > 1.4 ms at 4",
                                                               "2 ms at 2 > 1.4 ms at 4"]
    assert falls_with_batch({1: 1.0, 4: 0.8}, {}) == []  # within the 25 % slack
    assert falls_with_batch({1: 1.0, 4: 0.6}, {1: 0.5}) == []  # within that entry's own spread
    assert falls_with_batch({1: 1.0, 4: 0.6}, {}) != []


def test_noise_falls_and_load_each_give_a_warning():
    from svt.collect.profile import measurement_block

    quiet = {"load_1min": 0.5, "cores": 2, "threads": 2}
    ok = measurement_block(5, {"draft": {1: 0.1}, "verify": {(1, 1): 0.2}}, {"draft": [], "verify": []}, quiet, quiet)
    assert ok["warnings"] == [] and ok["reliable"]
    noisy = measurement_block(5, {"draft": {1: 0.9}, "verify": {}}, {"draft": [], "verify": []}, quiet, quiet)
    assert "interquartile range reaches 90%" in noisy["warnings"][0] and not noisy["reliable"]
    busy = measurement_block(5, {"draft": {}, "verify": {}}, {"draft": [], "verify": []}, quiet,
                             {**quiet, "load_1min": 3.7})
    assert busy["warnings"] == ["other processes kept 1.7 of the machine's 2 cores busy"]
    own = measurement_block(5, {"draft": {}, "verify": {}}, {"draft": [], "verify": []}, quiet,
                            {**quiet, "load_1min": 2.6})  # its own 2 threads and a little more: quiet
    assert own["reliable"]
    falls = measurement_block(5, {"draft": {}, "verify": {}}, {"draft": ["24 ms at 1 > 1.4 ms at 4"], "verify": []},
                              quiet, quiet)
    assert "falls as the batch grows" in falls["warnings"][0]


def test_threads_follow_the_cores_available_unless_given():
    import pytest
    import torch

    from svt.devices import available_cores, set_threads
    from svt.errors import ModelLoadError

    before = torch.get_num_threads()
    try:
        assert set_threads() == available_cores() == torch.get_num_threads()
        assert set_threads(1) == 1 == torch.get_num_threads()
        with pytest.raises(ModelLoadError, match="--threads >= 1"):
            set_threads(0)
    finally:
        torch.set_num_threads(before)


def test_a_report_replayed_on_an_unreliable_table_says_so(tiny_pair, small_run, tmp_path):
    import json

    from typer.testing import CliRunner

    from svt.cli import app

    k = json.loads((small_run / "run.json").read_text())["k"]
    table = profile_pair(tiny_pair.target, tiny_pair.draft, k=k, batches=(1, 8), context=16, repeats=1)
    table.measurement = {**table.measurement, "warnings": ["the machine's load (3.7) was above its 2 cores"],
                         "reliable": False}
    costs = write_costs(table, tmp_path / "busy.yaml")
    r = CliRunner().invoke(app, ["evaluate", str(small_run), "--out", str(tmp_path / "rep"), "--feature", "q_max",
                                 "--costs", str(costs)])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["simulation"]["costs"]["warnings"] == ["the machine's load (3.7) was above its 2 cores"]
    assert "**The cost table is unreliable** (the machine's load (3.7)" in (tmp_path / "rep" / "report.md").read_text()
    assert "UNRELIABLE" in r.output
    from svt.plots import PLOTS

    assert "UNRELIABLE" in PLOTS["pareto"](report).axes[0].get_title()  # the figure says so too


def test_one_slow_repeat_is_not_noise_but_a_busy_stretch_is():
    from svt.collect.profile import _spread

    assert _spread([1.0, 1.02, 0.98, 1.01, 2.0]) < 0.05  # a pause in one repeat of five
    assert _spread([1.0, 1.6, 0.9, 2.2, 1.4]) > 0.3  # the machine busy for part of the run


def test_a_short_verify_forward_is_timed_over_enough_forwards_to_outlast_the_scheduler(tiny_pair, monkeypatch):
    """One 2 ms forward is at the mercy of a scheduler tick (a quiet machine's profile flagged
    itself with a 42 % spread): each verify sample is the mean of as many forwards as last
    SAMPLE_MS, counted from the warm-up. A clock that advances 0.5 ms per reading makes every
    forward last 0.5 ms: 16 forwards a sample (the cap; 20 would reach 10 ms), their mean exact."""
    import svt.collect.profile as prof

    class Clock:
        now = 0.0

        def perf_counter(self):
            self.now += 0.0005
            return self.now

    monkeypatch.setattr(prof, "time", Clock())
    monkeypatch.setattr(prof, "step_overheads", lambda *a, **kw: ({}, {}, None))  # engine steps, timed apart
    calls = []
    real = type(tiny_pair.target).__call__

    class Counted:
        def __init__(self, model):
            self.model = model

        def __call__(self, *a, **kw):
            calls.append(kw.get("input_ids").shape)
            return real(self.model, *a, **kw)

        def parameters(self):
            return self.model.parameters()

        def __getattr__(self, name):
            return getattr(self.model, name)

    table = prof.profile_pair(Counted(tiny_pair.target), tiny_pair.draft, k=1, batches=(1,), context=8, repeats=2)
    assert prof.SAMPLE_MS / 0.5 > prof.MAX_INNER == 16
    # the prefill, then for each of the K + 1 = 2 token counts: one warm-up and 2 repeats x 16
    assert len(calls) == 1 + 2 * (1 + 2 * 16)
    assert table.verify_rows_ms[1] == pytest.approx({1: 0.5, 2: 0.5}, rel=1e-9)


def test_more_threads_than_cores_flags_the_profile_whatever_the_load():
    """The load check subtracted the profiler's own threads: with more threads than cores it could
    never fire. Such a profile is now flagged (its times include oversubscription)."""
    from svt.collect.profile import measurement_block

    over = {"load_1min": 0.3, "cores": 2, "threads": 8}
    for load in (0.3, 9.5):  # quiet, or others busy: either way not the machine's figures
        m = measurement_block(5, {"draft": {1: 0.05}, "verify": {}}, {"draft": [], "verify": []}, over,
                              {**over, "load_1min": load})
        assert not m["reliable"] and "8 threads on 2 cores" in m["warnings"][0], m
    at = {"load_1min": 0.3, "cores": 2, "threads": 2}  # at the cores: reliable when quiet
    assert measurement_block(5, {"draft": {}, "verify": {}}, {"draft": [], "verify": []}, at, at)["reliable"]


class _Clock:
    """``time.perf_counter`` for the profiler: every reading advances by ``step`` ms times a factor
    drawn from ``noise`` (1 for a steady clock)."""

    def __init__(self, noise: float, seed: int = 0):
        self.t, self.noise, self.rng = 100.0, noise, np.random.default_rng(seed)

    def __call__(self) -> float:
        self.t += 1e-3 * (float(self.rng.lognormal(0.0, self.noise)) if self.noise else 1.0)
        return self.t


@pytest.mark.parametrize("noise", [0.0, 1.0])
def test_the_spread_is_over_the_repeats_of_one_cell(tiny_pair, monkeypatch, noise):
    """The spread warning is the interquartile range of one cell's repeats over their median: a
    steady clock gives none (cumulative draft times grow with k, which is no noise), a noisy one
    gives it in both tables."""
    import svt.collect.profile as profile

    quiet = {"load_1min": 0.0, "cores": 2, "threads": 2}
    monkeypatch.setattr(profile, "machine_load", lambda: quiet)
    monkeypatch.setattr(profile.time, "perf_counter", _Clock(noise))
    m = profile_pair(tiny_pair.target, tiny_pair.draft, k=3, batches=(1, 2), context=8, repeats=9).measurement
    if noise == 0.0:
        assert m["reliable"] and m["max_spread"] == {"draft": 0.0, "verify": 0.0}, m
        assert m["fit"]["max_residual"] == pytest.approx(0.0, abs=1e-9) and m["raw_notes"] == []
    else:  # the raw spreads are noted; the table is judged by its fit, which these times defeat
        assert not m["reliable"] and m["max_spread"]["draft"] > 0.4 and m["max_spread"]["verify"] > 0.25, m
        assert any("draft times' interquartile range" in w for w in m["raw_notes"])
        assert any("verify times' interquartile range" in w for w in m["raw_notes"])
        # which of the fit's two checks fires depends on where the noise lands (the engine's steps
        # read the same clock first): either says the times defeat the model
        assert any("misses a measured cell" in w or "95 % interval reaches" in w for w in m["warnings"]), m["warnings"]


def test_a_collections_profile_times_its_cells_at_the_width_the_engine_will_attend(tiny_pair, monkeypatch):
    """Given the collection's prompts, each batch size's cells hold the target cache width the
    engine's verify forwards will attend on them (padding to the longest, holes until compaction;
    svt.collect.cache_width), from the accepted counts of the engine steps it timed: wider at
    batch 4 than at batch 1, and above the mean prompt plus half the new tokens."""
    import svt.collect.profile as prof
    from svt.collect.cache_width import mean_width

    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, tiny_pair.tokenizer.vocab_size, n).tolist() for n in (60, 8, 30, 55, 12, 40, 20, 50)]
    prefilled = []
    real = prof._prefill
    monkeypatch.setattr(prof, "_prefill", lambda model, b, ctx, dev: prefilled.append((model is tiny_pair.target, b, ctx))
                        or real(model, b, ctx, dev))
    table = prof.profile_pair(tiny_pair.target, tiny_pair.draft, k=2, batches=(1, 4), repeats=1, prompts=prompts,
                              max_new_tokens=24, context=999)
    m = table.measurement
    counts = np.array(m["step"]["accepted_counts"])
    assert counts.sum() > 0 and counts.size == 3
    lengths = [len(p) for p in prompts]
    want = {b: round(mean_width(lengths, b, 2, 24, counts)) - 3 for b in (1, 4)}
    assert m["context"] == want
    assert want[4] > want[1] > np.mean(lengths) - 1
    # the verify cells' caches (the target's) and the draft model's cells were prefilled at those widths
    assert {(True, b, want[b]) for b in (1, 4)} <= set(prefilled)
    assert {(False, b, want[b]) for b in (1, 4)} <= set(prefilled) and not any(c == 999 for *_, c in prefilled)


def test_the_profile_replays_the_collections_schedule_and_samples_as_it_does(tiny_pair, monkeypatch):
    """profile_pair hands the collection's schedule (static batches or continuous) to the width
    replay and its temperature and top-p to the engine steps it times (stopped right after)."""
    import svt.collect.profile as prof

    seen = {}

    class Stop(Exception):
        pass

    def steps(*a, **kw):
        seen["sampling"] = (kw["temperature"], kw["top_p"])
        return {}, {}, np.array([1, 2, 3])

    def contexts(target, prompts, batches, k, max_new, accepted, static=False):
        seen["static"] = static
        raise Stop

    monkeypatch.setattr(prof, "step_overheads", steps)
    monkeypatch.setattr(prof, "engine_contexts", contexts)
    for static, temperature, top_p in ((True, 0.0, 1.0), (False, 0.7, 0.9)):
        with pytest.raises(Stop):
            prof.profile_pair(tiny_pair.target, tiny_pair.draft, k=2, batches=(1,), prompts=[[5, 6, 7]],
                              max_new_tokens=4, static=static, temperature=temperature, top_p=top_p)
        assert seen == {"static": static, "sampling": (temperature, top_p)}


def test_static_batches_attend_another_width_than_continuous_ones(tiny_pair):
    from svt.collect.cache_width import mean_width
    from svt.collect.profile import engine_contexts

    prompts = [[5] * n for n in (300, 20, 250, 30, 280, 10, 40, 200)]
    counts = np.array([5, 3, 2])
    for static in (False, True):
        got = engine_contexts(tiny_pair.target, prompts, (2, 4), 2, 64, counts, static=static)
        assert got == {b: round(mean_width([len(p) for p in prompts], b, 2, 64, counts, static=static)) - 3
                       for b in (2, 4)}
    assert engine_contexts(tiny_pair.target, prompts, (4,), 2, 64, counts, static=True) != \
        engine_contexts(tiny_pair.target, prompts, (4,), 2, 64, counts)


@pytest.mark.parametrize("which", ["target", "eagle3", "dspark"])
def test_the_cells_caches_are_filled_as_a_prefill_shapes_them(tiny_pair, models_dir, which):
    """The cells' caches are random keys and values, not a forward over random tokens: every layer
    holds what a real prefill of (batch, context) would, in shape and dtype, and the next forward
    reads them as ``context`` slots (its positions continue from there)."""
    import torch

    import svt.collect.profile as prof
    from svt.collect.kv_cache import cache_kwarg, growing_cache
    from svt.models import load_pair

    b, ctx, dev = 3, 37, torch.device("cpu")
    if which == "target":
        model = tiny_pair.target
        real = growing_cache(model.config)
        ids = torch.randint(10, 100, (b, ctx))
        with torch.inference_mode():
            prof._forward(model)(input_ids=ids, use_cache=True, **{cache_kwarg(model): real})
        got = prof._prefill(model, b, ctx, dev)
    else:
        head = load_pair(models_dir / "target", models_dir / which, device="cpu", dtype="float32").draft
        real = growing_cache(head.config)
        feat = torch.randn((b, ctx, head.cfg.hidden_size))
        with torch.inference_mode():
            head(torch.randint(10, 100, (b, ctx)), feat, torch.ones((b, ctx), dtype=torch.long),
                 torch.arange(ctx)[None].expand(b, -1), real)
        got = prof._prefill_head(head, b, ctx, dev)
    assert len(got.layers) == len(real.layers) and got.get_seq_length() == ctx
    for mine, theirs in zip(got.layers, real.layers, strict=True):
        assert mine.keys.shape == theirs.keys.shape and mine.values.shape == theirs.values.shape
        assert mine.keys.dtype == theirs.keys.dtype and torch.isfinite(mine.keys).all()
        assert mine.keys.std() > 0.5  # random, not left empty
    if which == "target":  # a verify cell's forward on top: logits for its tokens, the cache grown by them
        cell = prof._VerifyCell(tiny_pair.target, b, 4, got, ctx, dev)
        cell.sample()
        assert got.get_seq_length() == ctx  # cropped back after the sample


def test_a_layer_holding_more_than_keys_and_values_is_prefilled_by_a_real_forward(tiny_pair, monkeypatch):
    """A cache layer without plain keys and values (a shared layer's keys=None, an indexed or
    linear-attention layer) cannot be filled at random: the profile then runs the real prefill."""
    import torch
    from transformers.cache_utils import DynamicLayer

    import svt.collect.profile as prof
    from svt.collect.kv_cache import growing_cache

    class Shared(DynamicLayer):  # keys=None, as transformers' layers for shared KV
        pass

    probe = growing_cache(tiny_pair.target.config)
    probe.layers[1] = Shared()
    assert prof._random_like(probe, growing_cache(tiny_pair.target.config), 2, 9, torch.device("cpu")) is None
    forwards = []
    real = prof._forward
    monkeypatch.setattr(prof, "_random_like", lambda *a: None)
    monkeypatch.setattr(prof, "_forward", lambda m: (lambda **kw: forwards.append(kw["input_ids"].shape) or real(m)(**kw)))
    cache = prof._prefill(tiny_pair.target, 2, 9, torch.device("cpu"))
    assert cache.get_seq_length() == 9 and forwards[-1] == (2, 9)
