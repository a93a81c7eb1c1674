"""Reference runs (`svt collect --engine reference`): no target forward; cache drafts with oracle
yields against each prompt's reference, and model-drafter yields from a real drafter teacher-forced
on the text or from a stand-in drawn at given rates."""

import json
from pathlib import Path

import numpy as np
import polars as pl
import pytest

from svt.collect.reference_run import collect_reference
from svt.config import load_collect_config
from svt.errors import ConfigError
from svt.simulate.stand_in import expected_tokens_per_cycle, stand_in_yields
from svt.traces.io import open_run, read_meta

ROOT = Path(__file__).resolve().parents[2]
WL = ROOT / "data" / "workloads"


def _cfg(models_dir, **over):
    base = {"engine": "reference", "target": str(models_dir / "target"), "draft": None,
            "stand_in": {"accept": [0.8, 0.7, 0.6, 0.5]},
            "workloads": [str(WL / f"{w}.jsonl") for w in ("code", "edit", "toolcalls")],
            "requests": 9, "batch_size": 3, "max_new_tokens": 40, "k": 4, "temperature": 0, "seed": 3,
            "max_prompt_tokens": 256, "cache": True}
    base.update(over)
    return load_collect_config(None, base=base)


@pytest.fixture(scope="module")
def stand_in_run(tmp_path_factory, models_dir):
    out = tmp_path_factory.mktemp("ref") / "stand-in"
    collect_reference(_cfg(models_dir), out, progress=False)
    return out


def test_output_is_the_reference_and_oracle_yields_match_a_slow_loop(stand_in_run, tiny_pair):
    run = open_run(stand_in_run)
    meta = run.meta
    assert meta["engine"] == "reference" and meta["drafter"]["kind"] == "stand-in"
    assert meta["counts"]["drafts"] == 0 and run.scan("steps").collect().height == 0
    req = run.scan("requests").sort("request").collect()
    refs = [json.loads(line)["reference"] for w in ("code", "edit", "toolcalls")
            for line in (WL / f"{w}.jsonl").read_text().splitlines()[:3]]
    # interleave: code0, edit0, tool0, code1, ...
    order = [refs[0], refs[3], refs[6], refs[1], refs[4], refs[7], refs[2], refs[5], refs[8]]
    tok = tiny_pair.tokenizer
    for r, text in zip(req.iter_rows(named=True), order, strict=True):
        assert r["output_ids"] == tok.encode(text, add_special_tokens=False)[:40]
    rows = run.scan("cache_drafts").sort("request", "decode_pos").collect()
    outputs = dict(zip(req["request"], req["output_ids"], strict=True))
    for row in rows.iter_rows(named=True):  # the slow loop: token by token
        out = outputs[row["request"]][row["decode_pos"]:]
        n = 0
        while n < len(row["draft_ids"]) and n < len(out) and row["draft_ids"][n] == out[n]:
            n += 1
        assert row["oracle_accepted"] == n
    counts = rows.group_by("request").agg(pl.len(), pl.col("decode_pos").max()).sort("request")
    assert counts["len"].to_list() == [len(outputs[r]) for r in counts["request"]]
    assert rows["oracle_accepted"].sum() > 0  # edit and toolcalls references repeat their prompts


def test_stand_in_yields_are_the_recorded_draws(stand_in_run):
    run = open_run(stand_in_run)
    meta = run.meta
    acc = np.asarray(meta["drafter"]["accept"])
    rows = run.scan("cache_drafts").sort("request", "decode_pos").collect()
    for (req,), part in rows.group_by("request", maintain_order=True):
        want = stand_in_yields(acc, meta["seed"], int(req), part.height)
        assert part["model_accepted"].to_list() == want.tolist()


def test_stand_in_acceptance_matches_the_given_rates():
    """Conditional acceptance at each position within 4.5 binomial standard errors of the given
    rate, over 60,000 independent positions; and the run is capped at the tokens left."""
    acc = np.array([0.9, 0.5, 0.75, 0.2, 1.0])
    y = np.concatenate([stand_in_yields(acc, 11, r, 6000)[:5000] for r in range(12)])
    for i, a in enumerate(acc):
        reached = y >= i
        n = int(reached.sum())
        got = float((y[reached] > i).mean())
        se = max(np.sqrt(a * (1 - a) / n), 1e-12)
        assert abs(got - a) <= 4.5 * se + 1e-12, (i, got, a)
    assert abs(y.mean() + 1 - expected_tokens_per_cycle(acc)) < 0.03
    tail = stand_in_yields(np.ones(4), 0, 0, 6)
    assert tail.tolist() == [4, 4, 4, 3, 2, 1]


def test_real_drafter_yields_match_a_per_position_greedy_loop(tmp_path, models_dir, tiny_pair):
    """Teacher-forced on the reference: the accepted length from t is how many of the drafter's greedy
    drafts (each from its own forward on prompt + reference[:t+j]) equal the reference, capped at K."""
    import torch

    out = tmp_path / "real"
    collect_reference(_cfg(models_dir, draft=str(models_dir / "draft-small"), stand_in=None, requests=2,
                           max_new_tokens=16), out, progress=False)
    run = open_run(out)
    assert run.meta["drafter"]["kind"] == "model"
    req = run.scan("requests").sort("request").collect()
    rows = run.scan("cache_drafts").sort("request", "decode_pos").collect()
    draft = tiny_pair.draft
    for r in req.iter_rows(named=True):
        p, o = r["prompt_ids"], r["output_ids"]
        want = []
        for t in range(len(o)):
            a = 0
            while a < 4 and t + a < len(o):
                ids = torch.tensor([p + o[: t + a]])
                with torch.inference_mode():
                    guess = int(draft(input_ids=ids).logits[0, -1].argmax())
                if guess != o[t + a]:
                    break
                a += 1
            want.append(a)
        got = rows.filter(pl.col("request") == r["request"])["model_accepted"].to_list()
        assert got == want


def test_recache_reproduces_the_table_and_takes_new_options(stand_in_run, tmp_path):
    import shutil

    from svt.collect.add_cache import add_cache_to_run

    copy = tmp_path / "copy"
    shutil.copytree(stand_in_run, copy)
    before = open_run(copy).scan("cache_drafts").sort("request", "decode_pos").collect()
    add_cache_to_run(copy, {})
    after = open_run(copy).scan("cache_drafts").sort("request", "decode_pos").collect()
    assert before.drop("lookup_ms").equals(after.drop("lookup_ms"))
    add_cache_to_run(copy, {"max_draft_len": 2})
    short = open_run(copy).scan("cache_drafts").sort("request", "decode_pos").collect()
    assert short["draft_len"].max() <= 2 and read_meta(copy)["cache"]["options"]["max_draft_len"] == 2
    # the stand-in's draws do not depend on the cache options
    assert short["model_accepted"].to_list() == after["model_accepted"].to_list()


@pytest.mark.parametrize("over, match", [
    ({"stand_in": {"rate": 1.5}}, "stand_in.rate"),
    ({"stand_in": {"accept": [0.5, -0.1, 0.5, 0.5]}}, r"stand_in.accept\[1\]"),
    ({"stand_in": {"accept": [0.5, 0.5]}}, "k = 4 rates"),
    ({"stand_in": {"rate": 0.5, "accept": [0.5] * 4}}, "exactly one of accept, rate, from_run"),
    ({"stand_in": {}}, "exactly one of accept, rate, from_run"),
    ({"draft": "x"}, "exactly one of them"),
    ({"stand_in": None}, "exactly one of them"),
    ({"engine": "svt"}, "`draft`"),
    ({"engine": "bogus"}, "engine"),
])
def test_bad_reference_configs_are_refused(models_dir, over, match):
    with pytest.raises(ConfigError, match=match):
        _cfg(models_dir, **over)


def test_missing_references_write_nothing(tmp_path, models_dir):
    wl = tmp_path / "chat.jsonl"
    wl.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    out = tmp_path / "out"
    with pytest.raises(ConfigError, match="no row has a usable reference"):
        collect_reference(_cfg(models_dir, workloads=[str(wl)]), out, progress=False)
    assert not out.exists()
    with pytest.raises(ConfigError, match="chat.jsonl:1: no reference"):
        collect_reference(_cfg(models_dir, workloads=[str(wl)], on_missing_reference="error"), out, progress=False)
    assert not out.exists()


def test_from_run_copies_a_runs_measured_acceptance(small_run, models_dir, tmp_path):
    from svt.collect.reference_run import measured_acceptance

    acc = measured_acceptance(small_run, 4)
    d = open_run(small_run).scan("drafts").filter(pl.col("label").is_not_null()).collect()
    for i in range(4):
        at = d.filter(pl.col("position") == i)
        assert acc[i] == pytest.approx(float((at["label"] == 1).mean()))
    with pytest.raises(ConfigError, match="K = 4"):
        collect_reference(_cfg(models_dir, k=3, stand_in={"from_run": str(small_run)}), tmp_path / "x",
                          progress=False)


def test_a_failure_midway_leaves_out_as_it_was(tmp_path, models_dir, monkeypatch, stand_in_run):
    """Written beside --out and moved in when complete: a failure during the cache table leaves no
    run claiming to be complete, and an old run is untouched by a failed --overwrite."""
    import shutil

    import svt.collect.cache_run as cache_run

    def boom(*a, **k):
        raise KeyboardInterrupt

    old = tmp_path / "old"
    shutil.copytree(stand_in_run, old)
    before = read_meta(old)
    monkeypatch.setattr(cache_run, "build_cache_drafts", boom)
    for out, overwrite in ((tmp_path / "new", False), (old, True)):
        with pytest.raises(KeyboardInterrupt):
            collect_reference(_cfg(models_dir, requests=3), out, progress=False, overwrite=overwrite)
        assert not (tmp_path / f".{out.name}.svt-new").exists()
    assert not (tmp_path / "new").exists()
    assert read_meta(old) == before and open_run(old).has("cache_drafts")


def test_finish_reason_says_where_max_new_tokens_cut_the_reference(stand_in_run, tiny_pair):
    run = open_run(stand_in_run)
    req = run.scan("requests").collect()
    for r in req.iter_rows(named=True):
        assert r["finish_reason"] == ("length" if len(r["output_ids"]) == 40 else "stop")
    assert set(req["finish_reason"]) <= {"length", "stop"}


def test_recache_checks_the_models_it_is_given(stand_in_run, tmp_path, models_dir):
    import shutil

    from svt.collect.add_cache import add_cache_to_run
    from svt.errors import ModelLoadError

    copy = tmp_path / "copy"
    shutil.copytree(stand_in_run, copy)
    add_cache_to_run(copy, {}, target=models_dir / "target")  # moved: the same weights elsewhere
    with pytest.raises(ModelLoadError, match="weights differ"):
        add_cache_to_run(copy, {}, target=models_dir / "draft-small")
    with pytest.raises(ConfigError, match="--draft does not apply"):
        add_cache_to_run(copy, {}, draft=models_dir / "draft-small")


@pytest.mark.parametrize("kind", ["vllm-steps", "specdec-tokens"])
def test_a_reference_run_exported_in_an_import_format_is_refused(stand_in_run, tmp_path, kind):
    """Issue 34: the specdec-tokens export of a reference run was a 1-byte file with exit 0."""
    from svt.errors import DataError
    from svt.interop.export import export

    with pytest.raises(DataError, match="a reference run: its drafts are the cache's"):
        export(kind, stand_in_run, tmp_path / "out.jsonl")
    assert not (tmp_path / "out.jsonl").exists()


def _live_greedy_as_references(models_dir, tmp_path, draft: str, n: int = 6, tokens: int = 40, k: int = 4,
                               workload: str = "code"):
    """A live greedy run of the built-in target with ``draft``, and a workload whose references are
    its outputs as text (the prompts' rows, each with the target's own continuation)."""
    from svt.collect import collect

    rows = [json.loads(line) for line in (WL / f"{workload}.jsonl").read_text().splitlines()[:n]]
    src = tmp_path / "prompts.jsonl"
    src.write_text("".join(json.dumps({"prompt": r["prompt"]}) + "\n" for r in rows))
    base = {"target": str(models_dir / "target"), "draft": str(models_dir / draft), "workloads": [str(src)],
            "requests": n, "batch_size": 3, "max_new_tokens": tokens, "k": k, "temperature": 0, "device": "cpu",
            "max_prompt_tokens": 256, "log": {"hidden": False, "dists_fraction": 0.0}}
    live = tmp_path / "live"
    collect(load_collect_config(None, base=base), live, progress=False)
    from svt.models.loading import load_tokenizer

    tok = load_tokenizer(models_dir / "target")
    req = open_run(live).scan("requests").sort("request").collect()
    refs = tmp_path / "refs.jsonl"
    refs.write_text("".join(json.dumps({"prompt": r["prompt"], "reference": tok.decode(o)}) + "\n"
                            for r, o in zip(rows, req["output_ids"].to_list(), strict=True)))
    return live, refs


@pytest.mark.parametrize("draft", ["eagle3", "dspark"])
def test_a_reference_run_with_a_hidden_state_drafter_measures_what_live_greedy_decoding_accepts(
        models_dir, tmp_path, draft):
    """The reference *is* the target's greedy output (a live greedy run with the head): the
    reference run's model yield at every step's decode position equals the live step's accepted
    length (float ties aside: none expected in float32 here)."""
    _agreement(models_dir, tmp_path, draft, "code", 6, 40)


@pytest.mark.slow
@pytest.mark.parametrize("draft", ["eagle3", "mtp", "dflash", "dspark"])
def test_held_out_reference_runs_with_each_hidden_state_drafter_agree_with_live_greedy(models_dir, tmp_path, draft):
    """The same on the held-out prose workload, 24 requests of 96 tokens, every drafter kind."""
    _agreement(models_dir, tmp_path, draft, "prose", 24, 96, k=5)


def _agreement(models_dir, tmp_path, draft, workload, n, tokens, k=4):
    live, refs = _live_greedy_as_references(models_dir, tmp_path, draft, n=n, tokens=tokens, k=k, workload=workload)
    out = tmp_path / "ref"
    collect_reference(_cfg(models_dir, draft=str(models_dir / draft), stand_in=None, workloads=[str(refs)], requests=n,
                           max_new_tokens=tokens, cache=True, device="cpu", k=k), out, progress=False)
    meta = read_meta(out)
    assert meta["drafter"]["kind"] == "head" and meta["drafter"]["head"] == draft
    assert meta["drafter"]["target"]["weights_sha256_16"] == meta["models"]["target"]["weights_sha256_16"]
    lr, rr = open_run(live), open_run(out)
    live_out = lr.scan("requests").sort("request").collect()["output_ids"].to_list()
    ref_out = rr.scan("requests").sort("request").collect()["output_ids"].to_list()
    yields = {(r, t): a for r, t, a in rr.scan("cache_drafts").select("request", "decode_pos", "model_accepted")
              .collect().iter_rows()}
    steps = lr.scan("steps").sort("request", "step").collect()
    compared = same = 0
    for r, out_ids in enumerate(live_out):
        if ref_out[r] != out_ids:  # the text round trip re-tokenized this output otherwise: not comparable
            continue
        pos = 0
        for row in steps.filter(pl.col("request") == r).iter_rows(named=True):
            m = len(out_ids) - pos
            compared += 1
            same += min(row["accepted"], m - 1) == min(yields[(r, pos)], m - 1)
            pos += row["emitted"]
    assert compared >= 4 * n, "the round trip kept too few requests to compare"
    assert same / compared >= 0.995, f"{same} of {compared} positions agree"
    assert steps["accepted"].max() > 0


def test_a_reference_run_with_a_head_bound_to_another_target_is_refused(models_dir, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from svt.errors import ModelLoadError

    other = tmp_path / "other-target"  # the same shape, other weights: the head would draft, silently, nothing
    shutil.copytree(models_dir / "target", other)
    weights = load_file(other / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 1e-2
    save_file(weights, other / "model.safetensors", metadata={"format": "pt"})
    cfg = _cfg(models_dir, draft=str(models_dir / "eagle3"), stand_in=None, target=str(other))
    with pytest.raises((ModelLoadError, ConfigError), match="trained on a target with weights"):
        collect_reference(cfg, tmp_path / "ref", progress=False)
    assert not (tmp_path / "ref" / "cache_drafts").exists()
