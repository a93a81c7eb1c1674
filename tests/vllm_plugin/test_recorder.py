"""The recorder and the spool -> run step, driven by synthetic engine events (no vLLM needed)."""

import json
import os
import sys

import numpy as np
import polars as pl
import pytest

from svt.errors import ConfigError, DataError
from svt.traces.io import open_run
from svt.vllm_plugin.finish import finish_spool
from svt.vllm_plugin.recorder import PLACEHOLDER, Recorder

K = 3


def _engine(rec: Recorder, requests=4, steps=5, seed=0, aborted=(), unfinished=()):
    """Propose/verify/finish like the engine: returns {req: [accepted per step]}."""
    rng = np.random.default_rng(seed)
    names = [f"{i}-abcd{i:04d}" for i in range(requests)]
    for i, r in enumerate(names):
        rec.named(str(i), r)
    rec.describe(vllm="0.32.0", target="t", draft="d", k=K, method="draft_model",
                 draft_sample_method="probabilistic", device="cpu")
    truth = {r: [] for r in names}
    out = {r: [5] for r in names}  # the first output token comes from the prefill
    for _ in range(steps):
        ids = rng.integers(1, 100, (requests, K))
        q = rng.random((requests, K, 4)).astype(np.float32)
        q[..., 0] = q[..., [0, 1, 3]].max(axis=-1)  # q_max bounds q_margin and q_sampled, as a distribution's do
        q[..., 2] = np.maximum(q[..., 2], -np.log(q[..., 0]))  # and its entropy is at least -ln q_max
        rec.proposed(names, ids, q, draft_ms=1.0)
        # the last request gets only 2 of its 3 drafts verified (the scheduler trimmed one)
        num = [K] * (requests - 1) + [2]
        flat = np.concatenate([ids[i, :n] for i, n in enumerate(num)])
        p = rng.random((sum(num), 4)).astype(np.float32)
        p[:, 1] = p[:, :2].max(axis=1)  # p_max bounds p_sampled
        q_sampled = np.concatenate([q[i, :n, 3] for i, n in enumerate(num)])
        p[:, 2] = np.minimum(1.0, p[:, 0] / q_sampled)  # the rejection sampler's acceptance probability
        sampled = np.full((requests, K + 1), PLACEHOLDER)
        for i, (r, n) in enumerate(zip(names, num, strict=True)):
            a = int(rng.integers(0, n + 1))
            sampled[i, :a + 1] = 7
            truth[r].append(a)
            out[r] += [7] * (a + 1)
        rec.verified(names, num, flat, p, sampled, verify_ms=2.0)
    for r in reversed(names):  # requests finish in another order than they were sent
        if r in unfinished:
            continue
        # the scheduler drops what the last step emitted past max_tokens (request 1 here)
        output = out[r][:-1] if r == names[1] and truth[r][-1] > 0 else out[r]
        rec.finished(r, [1, 2, 3], output, "abort" if r in aborted else "length", 1.0, 1.0)
    rec.flush()
    return names, truth


def test_spool_to_run_labels_and_counts(tmp_path):
    rec = Recorder(tmp_path / "trace")
    names, truth = _engine(rec)
    meta = finish_spool(tmp_path / "trace", tmp_path / "run", order=[str(i) for i in range(4)],
                        workloads={"0": "code", "1": "prose", "2": "code", "3": "prose"})
    run = open_run(tmp_path / "run", deep=True)
    steps = run.scan("steps").sort("request", "step").collect()
    drafts = run.scan("drafts").collect()
    for i, r in enumerate(names):
        assert steps.filter(pl.col("request") == i)["accepted"].to_list() == truth[r]
    # labels: 1 up to the first rejection, 0 there, null after; position < kept
    for (req, step), g in drafts.group_by("request", "step"):
        a = truth[names[req]][step]
        want = [1 if j < a else 0 if j == a else None for j in range(g.height)]
        assert g.sort("position")["label"].to_list() == want
    last = steps.filter(pl.col("request") == 3)
    assert set(last["kept"].to_list()) == {2} and set(last["drafted"].to_list()) == {K}
    assert not last["explored"].any()
    assert meta["counts"]["drafts"] == drafts.height == 5 * (3 * K + 2)
    assert meta["engine"] == "vllm" and meta["k"] == K
    # emitted: the tokens of the output each step produced (the prefill gave the first)
    reqs = run.scan("requests").sort("request").collect()
    per = steps.group_by("request").agg(pl.col("emitted").sum()).sort("request")["emitted"].to_list()
    assert [e + 1 for e in per] == reqs["output_ids"].list.len().to_list()
    assert meta["vllm"]["requests_with_tokens_from_unrecorded_steps"] == 0
    assert run.scan("requests").sort("request").collect()["workload"].to_list() == ["code", "prose", "code", "prose"]


def test_mismatched_and_unmatched_drafts_are_counted_not_logged(tmp_path):
    rec = Recorder(tmp_path / "t")
    rec.describe(k=K, target="t", draft="d")
    rec.proposed(["a", "b"], np.array([[1, 2, 3], [4, 5, 6]]), np.zeros((2, K, 4)), 1.0)
    sampled = np.array([[1, 2, 3, 9], [4, 5, 6, 9], [1, -1, -1, -1]])
    # b's verified drafts are not its proposal; c was never proposed
    rec.verified(["a", "b", "c"], [3, 3, 1], np.array([1, 2, 3, 4, 5, 7, 1]), np.full((7, 4), 0.5), sampled, 1.0)
    assert rec.counters == {"verified_drafts": 3, "mismatched_drafts": 3, "unmatched_drafts": 1, "nonfinite_drafts": 0,
                            "unrecorded_proposals": 0}
    assert rec.rows == 3


def test_nonfinite_statistics_refuse_the_run(tmp_path):
    rec = Recorder(tmp_path / "t")
    rec.describe(k=K, target="t", draft="d")
    rec.proposed(["a"], np.array([[1, 2, 3]]), np.zeros((1, K, 4)), 1.0)
    p = np.full((3, 4), 0.5, np.float32)
    p[1, 0] = np.nan
    rec.verified(["a"], [3], np.array([1, 2, 3]), p, np.array([[1, 2, 3, 4]]), 1.0)
    rec.finished("a", [1], [1, 2, 3, 4], "length", 1.0, 1.0)
    rec.flush()
    with pytest.raises(DataError, match="NaN or infinite"):
        finish_spool(tmp_path / "t", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_aborted_and_unfinished_requests_are_dropped_and_counted(tmp_path):
    rec = Recorder(tmp_path / "t")
    names, _ = _engine(rec, aborted={"1-abcd0001"}, unfinished={"2-abcd0002"})
    meta = finish_spool(tmp_path / "t", tmp_path / "run")
    assert meta["counts"]["requests"] == 2
    assert meta["vllm"]["dropped"]["requests_not_finished_or_aborted"] == 1  # the aborted one
    assert meta["vllm"]["dropped"]["drafts_of_dropped_requests"] == 2 * 5 * K
    # without an order, requests are numbered in the order they finished (3 first, 1 aborted)
    reqs = open_run(tmp_path / "run").scan("requests").sort("request").collect()
    assert reqs["request"].to_list() == [0, 1]
    assert meta["counts"]["output_tokens"] == reqs["output_ids"].list.len().sum()


def test_a_flush_without_its_marker_is_ignored_and_damage_is_an_error(tmp_path):
    rec = Recorder(tmp_path / "t", flush_rows=10)
    _engine(rec, steps=6)  # several flushes
    proc = rec.dir
    finish_spool(tmp_path / "t", tmp_path / "whole")
    n_whole = open_run(tmp_path / "whole").meta["counts"]["drafts"]
    # a process killed while writing its last flush leaves files without a .done marker
    done = sorted(proc.glob("*.done"))
    last = done[-1]
    last.unlink()
    with pytest.raises(DataError, match="did not finish|finished"):
        # the requests of the lost flush are gone, so the caller's order no longer matches
        finish_spool(tmp_path / "t", tmp_path / "partial", order=[str(i) for i in range(4)])
    (proc / last.name).write_text(json.dumps({"rows": {"drafts": 1, "steps": 0, "requests": 0, "ids": 0}}))
    with pytest.raises(DataError, match="rows, but"):
        finish_spool(tmp_path / "t", tmp_path / "bad")
    assert n_whole > 0 and not (tmp_path / "bad").exists()


def test_a_spool_of_two_runs_with_the_same_ids_is_refused(tmp_path):
    _engine(Recorder(tmp_path / "t"))
    _engine(Recorder(tmp_path / "t", name="second"))
    with pytest.raises(DataError, match="finished 2 times"):
        finish_spool(tmp_path / "t", tmp_path / "run")


def test_existing_output_needs_overwrite_and_old_run_survives_a_failure(tmp_path):
    _engine(Recorder(tmp_path / "t"))
    finish_spool(tmp_path / "t", tmp_path / "run")
    with pytest.raises(ConfigError, match="--overwrite"):
        finish_spool(tmp_path / "t", tmp_path / "run")
    with pytest.raises(DataError):
        finish_spool(tmp_path / "nothing", tmp_path / "run", overwrite=True)
    open_run(tmp_path / "run", deep=True)  # untouched


def test_register_is_inert_without_trace_dir(monkeypatch):
    monkeypatch.delenv("SVT_TRACE_DIR", raising=False)
    for m in [m for m in sys.modules if m.startswith("svt.vllm_plugin.internals")]:
        monkeypatch.delitem(sys.modules, m)
    from svt.vllm_plugin import register
    from svt.vllm_plugin.state import active

    register()
    assert active() is None
    assert "svt.vllm_plugin.internals" not in sys.modules  # nothing of vLLM's was even imported
    assert os.environ.get("SVT_TRACE_DIR") is None


def _suffix_engine(rec: Recorder, outputs: dict[str, list[int]], prompt=(1, 2, 3)):
    """Suffix proposals at every other position of each request, plus one past the end."""
    rec.describe(vllm="0.32.0", target=str(MODELS / "target"), draft=None, k=4, method="suffix", device="cpu",
                 suffix={"max_tree_depth": 24})
    for r, out in outputs.items():
        for t in list(range(1, len(out), 2)) + [len(out) + 3]:
            # at position 1 the draft is right for 3 tokens; elsewhere for 2, then wrong
            draft = (out[t:t + 3] if t == 1 else out[t:t + 2] + [9]) if t < len(out) else [5, 5]
            rec.cache_proposed(r, t, len(prompt) + t, draft, [0.5] * len(draft), 1.5, 2, t % 4 == 1, 0.01)
        rec.finished(r, list(prompt), out, "length", 0.0, 1.0)
    rec.flush()


MODELS = __import__("pathlib").Path(__file__).resolve().parents[2] / "data" / "models"


def test_suffix_proposals_become_cache_drafts(tmp_path):
    outputs = {"a-1": [11, 12, 13, 14, 15, 16, 17, 18], "b-2": [21, 22, 23, 24, 25, 26]}
    _suffix_engine(Recorder(tmp_path / "t"), outputs)
    with pytest.raises(DataError, match="--draft"):
        finish_spool(tmp_path / "t", tmp_path / "run")
    meta = finish_spool(tmp_path / "t", tmp_path / "run", draft=MODELS / "draft-large")
    run = open_run(tmp_path / "run", deep=True)
    c = run.scan("cache_drafts").sort("request", "decode_pos").collect()
    assert meta["drafter_kinds"] == ["cache"] and meta["counts"]["drafts"] == 0
    # one row per engine proposal within the output; the one past the end is dropped
    assert c.filter(pl.col("request") == 0)["decode_pos"].to_list() == [1, 3, 5, 7]
    # oracle: the draft's common prefix with the real continuation (the last token, 9, is wrong,
    # and the draft at position 7 runs past the output)
    assert c.filter(pl.col("request") == 0)["oracle_accepted"].to_list() == [3, 2, 2, 1]
    # history uses only tokens generated before the row: at position 3 the draft from 1
    # ([12, 13, 14], right for 3 tokens) is confirmed on output[1:3] = [12, 13] only: 2 tokens
    row = c.filter((pl.col("request") == 0) & (pl.col("decode_pos") == 3)).row(0, named=True)
    assert row["hist_yield_max"] == 2 and row["prev_draft_len"] == 3 and row["prev_match_len"] == 2
    assert row["context_len"] == 6 and row["prob_mean"] == 0.5
    first = c.filter((pl.col("request") == 0) & (pl.col("decode_pos") == 1)).row(0, named=True)
    assert first["hist_draft_share"] == 0 and first["prev_draft_len"] == 0
    assert (c["model_accepted"] <= 4).all()
    # the yield fitters read it (rows at engine steps, checked against the outputs)
    from svt.fit import fit_runs

    assert fit_runs([tmp_path / "run"], "yield-linear").name == "yield-linear"


def test_damaged_suffix_proposals_are_an_error(tmp_path):
    rec = Recorder(tmp_path / "t")
    rec.describe(target=str(MODELS / "target"), k=4, method="suffix")
    rec.cache_proposed("a", 2, 99, [1], [1.0], 1.0, 1, False, 0.1)  # context length is not prompt + 2
    rec.finished("a", [1, 2, 3], [4, 5, 6, 7], "length", 0.0, 1.0)
    rec.flush()
    with pytest.raises(DataError, match="context of 99 tokens"):
        finish_spool(tmp_path / "t", tmp_path / "run", draft=MODELS / "draft-large")


@pytest.mark.parametrize("damage, message", [
    (lambda d: (d / "00000.done").write_text("{}"), "has no count"),
    (lambda d: (d / "00000.done").write_text("[]"), "expected a JSON object"),
    (lambda d: (d / "00000.done").write_bytes(b"\xff\xfe"), "not valid JSON"),
    (lambda d: (d / "00000.done").write_text('{"rows": {"drafts": "200"}}'), "integers >= 0"),
    (lambda d: (d / "00000-drafts.parquet").write_bytes(b"garbage"), "not a readable Parquet"),
    (lambda d: (d / "process.json").write_text("[1]"), "expected a JSON object"),
    (lambda d: (d / "process.json").write_text('{"k": "4"}'), "`k` must be an integer"),
    (lambda d: (d / "process.json").write_text('{"k": 9, "target": "t", "draft": "d", "vllm": "0.32.0", '
                                               '"method": "draft_model", "draft_sample_method": "probabilistic", '
                                               '"device": "cpu"}'), "proposed at most 3"),
])
def test_damaged_spool_files_are_one_clear_error(tmp_path, damage, message):
    rec = Recorder(tmp_path / "t")
    _engine(rec)
    damage(rec.dir)
    with pytest.raises(DataError, match=message):
        finish_spool(tmp_path / "t", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_two_engines_in_one_spool_and_overlapping_out_are_refused(tmp_path):
    _engine(Recorder(tmp_path / "t"))
    other = Recorder(tmp_path / "t", name="b")
    other.describe(vllm="0.32.0", target="t", draft="another-draft", k=K, method="draft_model",
                   draft_sample_method="probabilistic", device="cpu")
    other.finished("z", [1], [1, 2], "length", 1.0, 1.0)
    other.flush()
    with pytest.raises(DataError, match="disagree on `draft`"):
        finish_spool(tmp_path / "t", tmp_path / "run")
    for inside in (tmp_path / "t", tmp_path / "t" / "spool", tmp_path):
        with pytest.raises(ConfigError, match="overlaps"):
            finish_spool(tmp_path / "t", inside, overwrite=True)
    (tmp_path / "file").write_text("x")
    with pytest.raises(ConfigError, match="is a file"):
        finish_spool(tmp_path / "t", tmp_path / "file", overwrite=True)


def test_output_shorter_than_its_steps_is_an_error(tmp_path):
    rec = Recorder(tmp_path / "t")
    _engine(rec)
    # cut one request's output well short of what its steps emitted
    path = rec.dir / "00000-requests.parquet"
    reqs = pl.read_parquet(path)
    reqs = reqs.with_columns(pl.when(pl.col("vllm_request") == reqs["vllm_request"][0])
                             .then(pl.col("output_ids").list.head(2)).otherwise(pl.col("output_ids")))
    reqs.write_parquet(path)
    with pytest.raises(DataError, match="shorter than what its steps|began after its output ended"):
        finish_spool(tmp_path / "t", tmp_path / "run")


def test_strict_unpaired_drafts_and_failed_verification_keep_the_old_run(tmp_path):
    rec = Recorder(tmp_path / "t")
    rec.verified(["x"], [2], np.array([1, 2]), np.full((2, 4), 0.5), np.array([[1, 2, 3, -1]]), 1.0)  # no proposal
    _engine(rec)
    finish_spool(tmp_path / "t", tmp_path / "run")  # counted, not refused
    with pytest.raises(DataError, match="could not be paired"):
        finish_spool(tmp_path / "t", tmp_path / "run", overwrite=True, strict=True)

    def bad(staged):
        raise DataError("outputs differ")

    before = (tmp_path / "run" / "run.json").read_text()
    with pytest.raises(DataError, match="outputs differ"):
        finish_spool(tmp_path / "t", tmp_path / "run", overwrite=True, verify=bad)
    assert (tmp_path / "run" / "run.json").read_text() == before
    assert not list(tmp_path.glob(".run.svt-*"))


def test_spool_without_cache_files_still_reads(tmp_path):
    """Spools written before the cache table existed have no NNNNN-cache.parquet."""
    rec = Recorder(tmp_path / "t")
    _engine(rec)
    (rec.dir / "00000-cache.parquet").unlink()
    done = json.loads((rec.dir / "00000.done").read_text())
    del done["rows"]["cache"]
    (rec.dir / "00000.done").write_text(json.dumps(done))
    assert finish_spool(tmp_path / "t", tmp_path / "run")["counts"]["requests"] == 4


def test_steps_after_the_output_ended_are_dropped(tmp_path):
    """Under async scheduling vLLM verifies a finished request once more: that step's tokens went
    nowhere, so it and its drafts are dropped (and counted), not logged as acceptance events."""
    rec = Recorder(tmp_path / "t")
    rec.describe(vllm="0.32.0", target="t", draft="d", k=K, method="draft_model", draft_sample_method="greedy",
                 async_scheduling=True)
    out = [5]
    for step in range(3):
        q = np.full((1, K, 4), 0.5)
        q[..., 2] = np.log(2.0)  # the entropy of a distribution whose largest probability is 0.5: at least ln 2
        rec.proposed(["a"], np.array([[1, 2, 3]]), q, 1.0)
        p = np.full((K, 4), 0.5)
        p[:, 2] = p[:, 3] = [1.0, 0.0, 0.0]  # greedy: acceptance is the 0/1 argmax agreement (draft 1 accepted)
        rec.verified(["a"], [K], np.array([1, 2, 3]), p, np.array([[1, 2, -1, -1]]), 1.0)
        if step < 2:
            out += [1, 2]
    rec.finished("a", [9], out, "length", 0.0, 1.0)  # the third step came after the end
    rec.flush()
    meta = finish_spool(tmp_path / "t", tmp_path / "run")
    assert meta["counts"]["steps"] == 2 and meta["counts"]["drafts"] == 2 * K
    assert meta["vllm"]["dropped"]["steps_after_the_output_ended"] == 1
    # without async scheduling such a step is damage, not an artefact
    facts = json.loads((rec.dir / "process.json").read_text())
    (rec.dir / "process.json").write_text(json.dumps({**facts, "async_scheduling": False}))
    with pytest.raises(DataError, match="without async scheduling"):
        finish_spool(tmp_path / "t", tmp_path / "run2")


def test_synthetic_rejection_and_processes_without_engine_facts(tmp_path):
    rec = Recorder(tmp_path / "t")
    _engine(rec)
    server = Recorder(tmp_path / "t", name="api")  # an API server's process: request ids only, no engine facts
    server.named("zzz", "zzz-1")
    server.flush()
    assert finish_spool(tmp_path / "t", tmp_path / "run")["counts"]["requests"] == 4
    facts = json.loads((rec.dir / "process.json").read_text())
    (rec.dir / "process.json").write_text(json.dumps({**facts, "rejection_sample_method": "synthetic"}))
    with pytest.raises(DataError, match="synthetic"):
        finish_spool(tmp_path / "t", tmp_path / "run2")
    (rec.dir / "process.json").write_text(json.dumps({"pid": 1}))
    with pytest.raises(DataError, match="no engine facts"):
        finish_spool(tmp_path / "t", tmp_path / "run3")


def test_activate_turns_off_the_v2_model_runner(tmp_path, monkeypatch):
    from svt.vllm_plugin import internals, recorder, state

    monkeypatch.setattr(internals, "check_version", lambda: "0.32.0")
    monkeypatch.setattr(internals, "install", lambda: None)
    monkeypatch.setattr(state, "_ACTIVE", None)
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")
    with pytest.raises(RuntimeError, match="V1 model runner"):
        recorder.activate(tmp_path / "t")
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER")
    rec = recorder.activate(tmp_path / "t")
    assert os.environ["VLLM_USE_V2_MODEL_RUNNER"] == "0" and state.active() is rec
    recorder.deactivate()


def test_other_vllm_versions_are_refused(monkeypatch):
    import types

    from svt.vllm_plugin import internals
    from svt.vllm_plugin.collect import _need_vllm

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.31.2"))
    with pytest.raises(RuntimeError, match="written against vLLM 0.32.0, but this is vLLM 0.31.2"):
        internals.check_version()
    with pytest.raises(ConfigError, match="refuses to trace"):
        _need_vllm()
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(__version__="0.32.0"))
    assert internals.check_version() == "0.32.0"


def test_suffix_draft_model_with_another_tokenizer_is_refused(tmp_path):
    import shutil

    from transformers import AutoTokenizer

    from svt.errors import ModelLoadError

    other = tmp_path / "draft"
    shutil.copytree(MODELS / "draft-large", other)
    tok = AutoTokenizer.from_pretrained(str(MODELS / "target"))
    tok.add_tokens(["<not-in-the-target>"])
    tok.save_pretrained(str(other))
    _suffix_engine(Recorder(tmp_path / "t"), {"a-1": [11, 12, 13, 14]})
    with pytest.raises(ModelLoadError, match="does not share the target's tokenizer"):
        finish_spool(tmp_path / "t", tmp_path / "run", draft=other)
    assert not (tmp_path / "run").exists()


def test_vllm_finish_overwrite_never_replaces_a_folder_that_is_not_a_run(tmp_path):
    """`svt vllm-finish SPOOL --out DIR --overwrite` used to replace any folder (a project with
    src/main.py was deleted); --overwrite replaces runs only."""
    _engine(Recorder(tmp_path / "t"))
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('mine')\n")
    with pytest.raises(ConfigError, match="not a run directory"):
        finish_spool(tmp_path / "t", project, overwrite=True)
    assert (project / "src" / "main.py").read_text() == "print('mine')\n"
    finish_spool(tmp_path / "t", tmp_path / "run")
    finish_spool(tmp_path / "t", tmp_path / "run", overwrite=True)  # a run is replaced
    open_run(tmp_path / "run", deep=True)


def _edit(spool_dir, table, change):
    """Rewrite one spool table of flush 00000 (same row count, so its marker still matches)."""
    path = spool_dir / f"00000-{table}.parquet"
    frame = pl.read_parquet(path)
    change(frame).write_parquet(path)


def _reorder_labels(d):
    """In one step whose first two drafts were accepted, the first becomes a rejection: a verified
    draft then follows a rejected one."""
    two = d.filter((pl.col("position") <= 1) & (pl.col("label") == 1)).group_by("vllm_request", "step").len()
    req, step = two.filter(pl.col("len") == 2).select("vllm_request", "step").row(0)
    hit = (pl.col("vllm_request") == req) & (pl.col("step") == step) & (pl.col("position") == 0)
    return d.with_columns(pl.when(hit).then(0).otherwise(pl.col("label")).cast(pl.Int8).alias("label"))


def _first(col, value, dtype):
    return lambda f: f.with_columns(pl.when(pl.int_range(pl.len()) == 0).then(value).otherwise(pl.col(col))
                                    .cast(dtype).alias(col))


@pytest.mark.parametrize("table, change, message", [
    ("drafts", _reorder_labels, "labels out of order"),
    ("drafts", _first("token", -5, pl.Int32), "negative draft token id"),
    ("steps", _first("verify_ms", -2.0, pl.Float32), "verify_ms = -2"),
    ("steps", _first("draft_ms", float("nan"), pl.Float32), "draft_ms = nan"),
    ("requests", _first("temperature", float("nan"), pl.Float32), "temperature nan"),
    ("requests", _first("temperature", 0.0, pl.Float32), "sampled with 2 settings"),
    ("requests", lambda f: f.with_columns(pl.col("output_ids").list.eval(pl.element() - 10)), "negative token id in output_ids"),
    ("steps", _first("batch_size", -1, pl.Int16), "batch_size = -1"),
    ("steps", _first("emitted", -3, pl.Int16), "emitted = -3"),
])
def test_damaged_spool_values_are_refused(tmp_path, table, change, message):
    """Issue 23: vllm-finish accepted these spools (labels reordered, two server sessions at T=0
    and T=1 in one folder, negative token ids, negative verify_ms, a NaN temperature)."""
    rec = Recorder(tmp_path / "t")
    _engine(rec)
    _edit(rec.dir, table, change)
    with pytest.raises(DataError, match=message):
        finish_spool(tmp_path / "t", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_a_lost_flush_is_said_not_only_counted(tmp_path):
    """Issue 23: a lost flush was recorded only as a counter in run.json; vllm-finish now says it."""
    from typer.testing import CliRunner

    from svt.cli import app

    rec = Recorder(tmp_path / "t", flush_rows=6)
    _engine(rec, steps=6)
    dones = sorted(rec.dir.glob("*.done"))
    assert len(dones) > 2
    dones[1].unlink()  # the flush is lost: its files are never read
    res = CliRunner().invoke(app, ["vllm-finish", str(tmp_path / "t"), "--out", str(tmp_path / "run")])
    assert res.exit_code == 0, res.output
    assert "warning:" in res.output and "steps the spool does not hold" in res.output


def test_unreadable_markers_and_facts_of_the_wrong_type_are_refused(tmp_path):
    rec = Recorder(tmp_path / "t")
    _engine(rec)
    done = rec.dir / "00000.done"
    text = done.read_text()
    done.unlink()
    done.mkdir()
    with pytest.raises(DataError, match="cannot be read"):
        finish_spool(tmp_path / "t", tmp_path / "run")
    done.rmdir()
    done.write_text(text)
    facts = json.loads((rec.dir / "process.json").read_text())
    (rec.dir / "process.json").write_text(json.dumps({**facts, "target": 5}))
    with pytest.raises(DataError, match="`target` = 5"):
        finish_spool(tmp_path / "t", tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_an_inert_plugin_loads_none_of_the_hooks():
    """Importing the recorder (as vLLM's entry point and the collector do) leaves the hooks module
    unloaded until tracing is switched on (make test-vllm checks the same inside vLLM)."""
    import subprocess
    import sys

    code = ("import sys, svt.vllm_plugin, svt.vllm_plugin.recorder, svt.vllm_plugin.state; "
            "print('svt.vllm_plugin.internals' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert res.stdout.strip() == "False", res.stderr
