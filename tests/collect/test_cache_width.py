import numpy as np
import pytest
import torch

from svt.collect.cache_width import engine_widths, mean_width
from svt.collect.engine import SamplingParams, run_batch

STATIC = 3


def _engine(tiny_pair, prompts, slots, k, tokens, seed=0):
    if slots == "static":  # the collector's static schedule: each `STATIC` prompts alone, drained
        logs = [_engine(tiny_pair, prompts[i : i + STATIC], None, k, tokens, seed) for i in range(0, len(prompts), STATIC)]
        acc, tick = {}, 0
        for i, (sched, a) in enumerate(logs):  # one engine after another: ticks continue, requests offset
            acc.update({(r + i * STATIC, t + tick): v for (r, t), v in a.items()})
            tick += len(sched["tick"])
        return {c: np.concatenate([sched[c] for sched, _ in logs]) for c in logs[0][0]}, acc
    log = run_batch(tiny_pair.target, tiny_pair.draft, prompts, SamplingParams(1.0, 1.0, k, tokens), eos_id=None,
                    pad_id=tiny_pair.tokenizer.pad_token_id, generator=torch.Generator().manual_seed(seed), slots=slots)
    sched = {c: np.concatenate(v) for c, v in log.schedule.items()}
    steps = {c: np.concatenate(v) for c, v in log.steps.items()}
    acc = {(int(r), int(t)): int(a) for r, t, a in zip(steps["request"], steps["step"], steps["accepted"], strict=True)}
    return sched, acc


@pytest.mark.parametrize("k,slots,lengths", [(3, 2, (40, 7, 90, 3, 25, 60, 12)), (1, 3, (40, 1, 90, 3, 25, 60, 1)),
                                             (0, 2, (40, 7, 90, 3, 25, 60, 12)), (3, 2, (300, 260, 280)),
                                             (3, "static", (40, 7, 90, 1, 25, 60, 12)), (2, None, (70, 1, 30))])
def test_the_replayed_bookkeeping_is_the_engines_width_step_for_step(tiny_pair, k, slots, lengths):
    """Fed the run's own accepted counts, the replay gives the engine's batch size and verify width
    at every step: padding to the longest prompt, joining padded to the batch, K + 1 slots a step,
    compaction of the holes (which each run with drafts reaches; on the long prompts, past 256 slots, the share
    of the width decides when, not the 64-slot floor); one-token prompts (a padded slot, none live);
    the collector's static batches and one batch of every prompt (``slots=None``)."""
    tok = tiny_pair.tokenizer
    rng = np.random.default_rng(0)
    prompts = [rng.integers(10, tok.vocab_size, n).tolist() for n in lengths]
    sched, acc = _engine(tiny_pair, prompts, slots, k, 70)
    lengths = [len(p) for p in prompts]

    def replay(compacts=True):
        return engine_widths(lengths, STATIC if slots == "static" else slots, k, 70,
                             lambda req, t: np.array([acc[(int(r), t)] for r in req]), compacts=compacts,
                             static=slots == "static")

    b, w = replay()
    assert b.tolist() == sched["batch_size"].tolist()
    assert w.tolist() == sched["verify_slots"].tolist()
    if k:  # rejected drafts left holes and the run compacted them: its widths differ from no compaction's
        assert w.tolist() != replay(compacts=False)[1].tolist()


def test_the_mean_width_grows_with_the_batch_and_with_rejections():
    lengths = [380, 80, 384, 200, 384, 300, 120, 384] * 4
    all_accepted = [0, 0, 0, 1]
    none_accepted = [1, 0, 0, 0]
    one = mean_width(lengths, 1, 3, 96, all_accepted)
    # batch 1, every draft accepted: no holes, no padding: the mean prompt + the mean progress
    assert one == pytest.approx(np.mean(lengths) - 1 + 4 * (1 + 24) / 2, rel=0.02)
    assert mean_width(lengths, 8, 3, 96, all_accepted) > one + 50  # padded to the longest of 8
    assert mean_width(lengths, 8, 3, 96, none_accepted) > mean_width(lengths, 8, 3, 96, all_accepted)


def test_bad_inputs_are_refused():
    with pytest.raises(ValueError, match="at least 1 token"):
        engine_widths([], 2, 3, 10, lambda r, t: np.zeros(r.size))
    with pytest.raises(ValueError, match="no accepted counts"):
        mean_width([5, 6], 2, 3, 10, [0, 0, 0, 0])


def test_a_long_replay_takes_fewer_rounds_and_then_the_first_prompts(monkeypatch):
    """Long outputs or many prompts: one seeded round once a round holds STEPS_A_ROUND steps, and past
    MAX_STEPS the first prompts, in order, that fill them (the estimate within a few % of the whole)."""
    import svt.collect.cache_width as cw

    rng = np.random.default_rng(0)
    lengths = rng.integers(77, 385, 192).tolist()
    counts = [270, 188, 105, 100, 80, 263]  # 2,333 / 1,006 drafts accepted a step: 3.32 tokens a step
    monkeypatch.setattr(cw, "STEPS_A_ROUND", 5_000)
    monkeypatch.setattr(cw, "MAX_STEPS", 25_000)
    # 192 prompts x 1,024 tokens at batch 1: 59,236 steps -> one round over the first 192 x 25,000 / 59,236
    got = mean_width(lengths, 1, 5, 1024, counts)
    assert got == mean_width(lengths[:81], 1, 5, 1024, counts, rounds=1)
    monkeypatch.setattr(cw, "STEPS_A_ROUND", 10**9)
    monkeypatch.setattr(cw, "MAX_STEPS", 10**9)
    assert got == pytest.approx(mean_width(lengths, 1, 5, 1024, counts), rel=0.03)
