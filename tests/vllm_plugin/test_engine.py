"""svt's vLLM plugin inside a real vLLM engine (CPU build), on the built-in tiny pair.

Run by `make test-vllm` (in .venv-vllm); skipped where vLLM is not installed. Each engine runs in
its own process, as a user's would, with the plugin loaded by vLLM's entry point.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

from svt.traces.io import open_run  # noqa: E402
from svt.vllm_plugin.finish import finish_spool  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).with_name("vllm_generate.py")
SVT = Path(sys.executable).with_name("svt")


def _generate(tmp_path, name, *, trace=False, plugins=True, **kw):
    env = {k: v for k, v in os.environ.items() if k not in ("SVT_TRACE_DIR", "VLLM_PLUGINS")}
    if trace:
        env["SVT_TRACE_DIR"] = str(tmp_path / f"{name}-trace")
    if not plugins:
        env["VLLM_PLUGINS"] = "none"  # no plugin is loaded at all
    args = [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
    out = tmp_path / f"{name}.json"
    r = subprocess.run([sys.executable, str(SCRIPT), str(out), *args], env=env, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(out.read_text())


def _finish(tmp_path, name, res):
    finish_spool(tmp_path / f"{name}-trace", tmp_path / name, order=res["request_ids"])
    return open_run(tmp_path / name, deep=True)


@pytest.fixture(scope="module")
def greedy_runs(tmp_path_factory):
    """The tiny pair at temperature 0: with the plugin inert, with no plugin, and traced."""
    tmp = tmp_path_factory.mktemp("greedy")
    kw = dict(temperature=0, draft_sample_method="greedy", requests=8, max_tokens=64)
    return tmp, {"inert": _generate(tmp, "inert", **kw), "none": _generate(tmp, "none", plugins=False, **kw),
                 "traced": _generate(tmp, "traced", trace=True, **kw)}


def test_plugin_without_trace_dir_changes_nothing(greedy_runs):
    _, res = greedy_runs
    assert not res["inert"]["traced"] and not res["inert"]["internals_loaded"]
    assert res["inert"]["output_ids"] == res["none"]["output_ids"]
    # tracing itself changes nothing either (greedy: vLLM's output is deterministic)
    assert res["traced"]["traced"] and res["traced"]["output_ids"] == res["none"]["output_ids"]


def test_greedy_trace_matches_vllm_own_counts(greedy_runs):
    tmp, res = greedy_runs
    run = _finish(tmp, "traced", res["traced"])
    _check_against_vllm(run, res["traced"])
    d = run.scan("drafts").filter(pl.col("label").is_not_null()).collect()
    # greedy: acceptance is argmax agreement, and accept_prob is that 0/1 outcome
    assert (d["label"].cast(pl.Float32) == d["accept_prob"]).all()


def _check_against_vllm(run, res):
    """Per request: the plugin's per-step accepted and verified counts are vLLM's own
    (per_request_spec_decode_metrics="detailed"), and its tokens are vLLM's output."""
    steps = run.scan("steps").sort("request", "step").collect()
    reqs = run.scan("requests").sort("request").collect()
    assert reqs.height == len(res["request_ids"])
    assert run.meta["vllm"]["counters"]["mismatched_drafts"] == run.meta["vllm"]["counters"]["unmatched_drafts"] == 0
    assert run.meta["vllm"]["requests_with_tokens_from_unrecorded_steps"] == 0
    for i in range(reqs.height):
        s = steps.filter(pl.col("request") == i)
        assert s["accepted"].to_list() == res["per_step_accepted"][i], i
        assert s["kept"].to_list() == res["per_step_drafted"][i], i
        assert reqs["output_ids"][i].to_list() == res["output_ids"][i]
        assert reqs["prompt_ids"][i].to_list() == res["prompt_ids"][i]
        assert s["emitted"].sum() + 1 == len(res["output_ids"][i])  # + the prefill's token


def test_tiny_pair_at_temperature_1(tmp_path):
    res = _generate(tmp_path, "t1", trace=True, temperature=1, requests=24, max_tokens=96)
    run = _finish(tmp_path, "t1", res)
    _check_against_vllm(run, res)
    d = run.scan("drafts").filter(pl.col("label").is_not_null()).collect()
    y = d["label"].to_numpy().astype(float)
    a = d["accept_prob"].to_numpy().astype(float)
    # each label is a Bernoulli(accept_prob) draw: the mean difference is within noise (z-test)
    z = (y - a).sum() / np.sqrt((a * (1 - a)).sum())
    assert abs(z) < 4, (z, y.mean(), a.mean())
    assert len(y) > 1000 and 0.2 < y.mean() < 0.95
    # the run is an svt run: evaluate reads it
    from typer.testing import CliRunner

    from svt.cli import app

    r = CliRunner().invoke(app, ["evaluate", str(tmp_path / "t1"), "--out", str(tmp_path / "rep")])
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "rep" / "report.json").read_text())
    assert report["runs"][0]["counts"]["labelled"] == len(y)
    assert 0.5 < report["features"]["q_max"]["auc"] <= 1


@pytest.mark.parametrize("temperature, method", [(0, "greedy"), (1, "probabilistic")])
def test_draft_equal_to_target_accepts_every_draft(tmp_path, temperature, method):
    """Through `svt collect --engine vllm`: a draft identical to the target is always accepted, and
    its distribution equals the target's at every draft."""
    out = tmp_path / "run"
    r = subprocess.run([str(SVT), "collect", "--engine", "vllm", str(ROOT / "configs/collect/vllm.yaml"), "--out",
                        str(out), "--quiet", "--set", "draft=data/models/target", "--set", "requests=8",
                        "--set", "max_new_tokens=64", "--set", f"temperature={temperature}",
                        "--set", f"vllm.draft_sample_method={method}"], cwd=ROOT, capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run = open_run(out, deep=True)
    d = run.scan("drafts").collect()
    assert d.height > 200 and (d["label"] == 1).all()
    np.testing.assert_allclose(d["q_sampled"], d["p_sampled"], atol=2e-4)
    np.testing.assert_allclose(d["q_max"], d["p_max"], atol=2e-4)
    assert d["accept_prob"].min() > 0.999
    assert run.meta["engine"] == "vllm" and run.meta["vllm"]["draft_sample_method"] == method


def test_suffix_method_writes_the_engines_cache_drafts(tmp_path):
    """vLLM's own SuffixDecoding drafter (arctic-inference) at temperature 0: its proposals become
    cache_drafts whose oracle yields match the outputs, and a yield predictor trains on them."""
    out = tmp_path / "run"
    r = subprocess.run([str(SVT), "collect", "--engine", "vllm", str(ROOT / "configs/collect/vllm.yaml"), "--out",
                        str(out), "--quiet", "--set", "requests=12", "--set", "max_new_tokens=96",
                        "--set", "temperature=0", "--set", "vllm.method=suffix", "--set", "k=8"],
                       cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    run = open_run(out, deep=True)
    assert run.meta["drafter_kinds"] == ["cache"] and run.meta["vllm"]["method"] == "suffix"
    c = run.scan("cache_drafts").collect()
    assert c.height > 100 and (c["draft_len"] > 0).sum() > 20 and (c["oracle_accepted"] > 0).sum() > 10
    from svt.fit import fit_runs  # checks every oracle yield against the request's output

    fit = fit_runs([out], "yield-linear")
    assert fit.name == "yield-linear"


def test_sigterm_during_collect_leaves_the_old_run_and_nothing_else(tmp_path):
    import signal
    import time

    out = tmp_path / "run"
    out.mkdir()
    (out / "run.json").write_text("{}")
    p = subprocess.Popen([str(SVT), "collect", "--engine", "vllm", str(ROOT / "configs/collect/vllm.yaml"), "--out",
                          str(out), "--overwrite", "--quiet", "--set", "requests=64"], cwd=ROOT,
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and not list(tmp_path.glob(".run.svt-spool-*/spool")):
        time.sleep(0.2)
    assert list(tmp_path.glob(".run.svt-spool-*")), "the collection never started"
    time.sleep(2)
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=120) != 0
    assert (out / "run.json").read_text() == "{}"  # the old run untouched
    assert not list(tmp_path.glob(".run.svt-*"))  # no spool, no half-written run
