"""The whole collection path on inputs shaped like real ones: a tokenizer with a real chat template
on both engines, an agent log read as it is, a config copied elsewhere, MT-Bench's question file,
and the limits (rows, positions) that used to pass silently."""

import json
import os
import shutil
from pathlib import Path

import polars as pl
import pytest
import yaml

from svt.collect import collect
from svt.config import load_collect_config
from svt.errors import ConfigError
from svt.traces.io import read_meta
from tests.collect.test_chat_templates import AGENT_LOG, templated_model

ROOT = Path(__file__).resolve().parents[2]
FIX = Path(__file__).parent / "fixtures"


def _requests(run) -> pl.DataFrame:
    return pl.read_parquet(Path(run) / "requests" / "*.parquet").sort("request")


@pytest.mark.parametrize("template", ["chatml", "llama3"])
def test_a_templated_tokenizer_runs_chat_workloads_on_both_engines(tmp_path, models_dir, template):
    """Any tokenizer with a chat template crashed every chat-record workload on both engines."""
    from svt.models.loading import load_tokenizer

    target = templated_model(tmp_path, template, models_dir)
    tok = load_tokenizer(target)
    base = {"target": str(target), "draft": str(models_dir / "draft-small"), "workloads": [str(AGENT_LOG)],
            "requests": 2, "batch_size": 2, "max_new_tokens": 6, "k": 3, "device": "cpu", "temperature": 0,
            "max_prompt_tokens": 1024}
    summary = collect(load_collect_config(None, base=base), tmp_path / "svt", progress=False)
    assert summary.requests == 2
    got = _requests(tmp_path / "svt")
    want = [tok.apply_chat_template([m.for_template() for m in p.messages], tools=json.loads(p.tools),
                                    add_generation_prompt=True)["input_ids"]
            for p in load_workloads_prompts(2)]
    assert got["prompt_ids"].to_list() == [list(w) for w in want]
    refs = pl.read_parquet(tmp_path / "svt" / "references" / "*.parquet").sort("request")
    assert tok.decode(refs["reference_ids"][0].to_list()[:6]) == tok.decode(
        _template_reference(tok, load_workloads_prompts(1)[0])[:6])

    ref = {**base, "engine": "reference", "turns": "all", "requests": None, "max_new_tokens": 512,
           "cache": True, "draft": str(models_dir / "draft-small")}
    collect(load_collect_config(None, base=ref), tmp_path / "ref", progress=False)
    reqs = _requests(tmp_path / "ref")
    assert reqs.height == 24  # one request per assistant turn of the six conversations
    assert read_meta(tmp_path / "ref")["workload_reading"]["turns"] == {"agent-log": "all"}
    texts = [tok.decode(o) for o in reqs["output_ids"].to_list()]
    assert sum('"name": "read_file"' in t for t in texts) == 6 and sum('"name": "run_tests"' in t for t in texts) == 6
    first = load_workloads_prompts(1, turns="all")[0]
    assert reqs["output_ids"][0].to_list() == _template_reference(tok, first)
    cache = pl.read_parquet(tmp_path / "ref" / "cache_drafts" / "*.parquet")
    assert cache.height == sum(len(o) for o in reqs["output_ids"].to_list())


def test_a_record_the_template_refuses_leaves_no_run_behind(tmp_path, models_dir):
    """The crashed collection left a folder holding only run.json: every prompt is rendered before
    anything is written."""
    target = templated_model(tmp_path, "chatml", models_dir)
    wl = tmp_path / "w.jsonl"
    wl.write_text(json.dumps({"messages": [{"role": "user", "content": "a"}]}) + "\n"
                  + json.dumps({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]})
                  + "\n")
    base = {"target": str(target), "draft": str(models_dir / "draft-small"), "workloads": [str(wl)],
            "max_new_tokens": 4, "k": 2, "device": "cpu"}
    with pytest.raises(ConfigError, match=r"w.jsonl:2: the tokenizer's chat template failed on this record"):
        collect(load_collect_config(None, base=base), tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()


def load_workloads_prompts(n, turns="last"):
    from svt.collect.workloads import load_workloads

    return load_workloads([str(AGENT_LOG)], n, turns=turns).prompts


def _template_reference(tok, p):
    msgs = [m.for_template() for m in p.messages]
    tools = json.loads(p.tools)
    head = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)
    full = tok.apply_chat_template([*msgs, p.answer.for_template()], tools=tools, tokenize=False)
    return tok(full[len(head):], add_special_tokens=False)["input_ids"]


def test_a_config_copied_elsewhere_runs_from_a_third_folder(tmp_path, monkeypatch):
    """The one path rule: a config's relative paths are read from its own folder, built-in names
    from svt's data, whatever the working directory."""
    here, elsewhere = tmp_path / "cfgs", tmp_path / "somewhere" / "else"
    here.mkdir()
    elsewhere.mkdir(parents=True)
    shutil.copy(ROOT / "examples" / "traffic" / "reference.yaml", here / "reference.yaml")
    shutil.copy(ROOT / "examples" / "traffic" / "chat-log.jsonl", here / "chat-log.jsonl")
    shutil.copy(ROOT / "configs" / "collect" / "hvd-reference.yaml", here / "hvd-reference.yaml")
    monkeypatch.chdir(elsewhere)
    cfg = load_collect_config(here / "reference.yaml", {"requests": 4})
    collect(cfg, "out", config_path=here / "reference.yaml", progress=False)
    assert _requests(elsewhere / "out").height == 4
    meta = read_meta(elsewhere / "out")
    assert Path(meta["workloads"]["chat-log"]) == here / "chat-log.jsonl"
    assert Path(meta["models"]["target"]["path"]) == (ROOT / "data" / "models" / "target").resolve()
    # a shipped config copied alone: built-in models and workloads by name
    cfg = load_collect_config(here / "hvd-reference.yaml",
                              {"requests": 5, "max_new_tokens": 16, "draft": None, "stand_in": {"rate": 0.5}})
    collect(cfg, "out2", config_path=here / "hvd-reference.yaml", progress=False)
    assert _requests(elsewhere / "out2")["workload"].to_list() == ["code", "prose", "structured", "edit", "toolcalls"]
    # a relative path on the command line is read from the working directory, not the config's folder
    (elsewhere / "mine.jsonl").write_text('{"prompt": "a", "reference": "b"}\n')
    cfg = load_collect_config(here / "reference.yaml", {"workloads": ["mine.jsonl"]})
    assert cfg.workloads == [str(elsewhere / "mine.jsonl")]
    with pytest.raises(ConfigError, match=r"file .*cfgs/nothere.jsonl' not found \(a relative path in a config is "
                                          r"read from the config's folder"):
        (here / "bad.yaml").write_text("engine: reference\ntarget: builtin:target\nstand_in: {rate: 0.5}\n"
                                       "workloads: [nothere.jsonl]\ntemperature: 0\ncache: true\n")
        collect(load_collect_config(here / "bad.yaml"), "out3", config_path=here / "bad.yaml", progress=False)
    with pytest.raises(ConfigError, match=r"'builtin:nope': svt's built-in models are builtin:dflash, builtin:draft-large"):
        collect(load_collect_config(here / "reference.yaml", {"target": "builtin:nope"}), "out4",
                config_path=here / "reference.yaml", progress=False)
    assert not (elsewhere / "out3").exists() and not (elsewhere / "out4").exists()


def _ref_cfg(workloads, **over):
    return load_collect_config(None, base={"engine": "reference", "target": "builtin:target", "stand_in": {"rate": 0.5},
                                           "workloads": workloads, "temperature": 0, "cache": True, **over})


def test_mt_bench_questions_run_with_the_rows_without_reference_skipped(tmp_path):
    """MT-Bench's question.jsonl failed at line 1 ("no reference"): most rows have none."""
    collect(_ref_cfg([str(FIX / "mt_bench_question.jsonl")]), tmp_path / "mt", progress=False)
    meta = read_meta(tmp_path / "mt")
    assert meta["workload_reading"]["skipped_no_reference"] == {"mt_bench_question": 2}
    assert meta["workload_reading"]["on_missing_reference"] == "skip"
    assert _requests(tmp_path / "mt")["workload"].to_list() == ["mt_bench_question/math"]
    from typer.testing import CliRunner

    from svt.cli import app

    (tmp_path / "mt.yaml").write_text(yaml.safe_dump({"engine": "reference", "target": "builtin:target",
                                                      "stand_in": {"rate": 0.5}, "temperature": 0, "cache": True,
                                                      "workloads": [str(FIX / "mt_bench_question.jsonl")]}))
    r = CliRunner().invoke(app, ["collect", str(tmp_path / "mt.yaml"), "--out", str(tmp_path / "cli"), "--quiet"])
    assert r.exit_code == 0 and "skipped prompts without a usable reference: mt_bench_question 2" in r.output, r.output
    with pytest.raises(ConfigError, match=r"mt_bench_question.jsonl:1: no reference"):
        collect(_ref_cfg([str(FIX / "mt_bench_question.jsonl")], on_missing_reference="error"), tmp_path / "e",
                progress=False)
    assert not (tmp_path / "e").exists()


def test_requests_above_the_rows_is_refused_and_repeat_counts_them(tmp_path):
    wl = str(ROOT / "examples" / "traffic" / "chat-log.jsonl")
    with pytest.raises(ConfigError, match=r"`requests` is 20, but the workloads hold 18 prompts"):
        collect(_ref_cfg([wl], requests=20), tmp_path / "a", progress=False)
    assert not (tmp_path / "a").exists()
    collect(_ref_cfg([wl], requests=20, repeat=True), tmp_path / "b", progress=False)
    reading = read_meta(tmp_path / "b")["workload_reading"]
    assert reading["repeat"] is True and reading["repeated_requests"] == 2 and reading["requests"] == 20
    assert reading["requests_per_workload"] == {"chat-log": 20} and reading["prompts"] == {"chat-log": 18}


def _short_model(tmp_path, models_dir, role, positions):
    d = tmp_path / f"{role}-{positions}"
    shutil.copytree(models_dir / role, d)
    cfg = json.loads((d / "config.json").read_text())
    cfg["max_position_embeddings"] = positions
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def test_prompts_beyond_the_models_positions_are_refused_before_any_work(tmp_path, models_dir):
    """A 3,000-token prompt plus 512 reference tokens was accepted for a drafter with 2,048 positions."""
    draft = _short_model(tmp_path, models_dir, "draft-small", 160)
    ws = [str(ROOT / "data" / "workloads" / "code.jsonl")]
    cfg = _ref_cfg(ws, requests=3, stand_in=None, draft=str(draft), max_prompt_tokens=150, max_new_tokens=64)
    with pytest.raises(ConfigError, match=r"3 request\(s\) need more positions than the draft allows "
                                          r"\(max_position_embeddings 160\): .*code.jsonl:1 needs 214"):
        collect(cfg, tmp_path / "ref", progress=False)
    assert not (tmp_path / "ref").exists()
    base = {"target": str(models_dir / "target"), "draft": str(draft), "workloads": ws, "requests": 2,
            "max_new_tokens": 16, "k": 3, "device": "cpu", "max_prompt_tokens": 150}
    with pytest.raises(ConfigError, match=r"need more positions than the target or the draft allows .*needs 170"):
        collect(load_collect_config(None, base=base), tmp_path / "svt", progress=False)
    assert not (tmp_path / "svt").exists()
    collect(load_collect_config(None, base={**base, "max_prompt_tokens": 120}), tmp_path / "ok", progress=False)


def test_shipped_configs_load_from_any_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for path in sorted((ROOT / "configs" / "collect").glob("*.yaml")):
        data = yaml.safe_load(path.read_text())
        assert not str(data.get("target", "")).startswith("data/"), f"{path.name}: use builtin: names"
        cfg = load_collect_config(path)
        from svt.collect.workloads import resolve_workload
        from svt.config import resolve_path

        assert resolve_path(cfg.target, path).is_dir()
        for w in cfg.workloads:
            assert resolve_workload(w, path).is_file()
    assert os.getcwd() == str(tmp_path)


@pytest.mark.parametrize("prompt_tokens", [150, 151])
def test_the_position_limit_is_checked_at_the_boundary(tmp_path, models_dir, prompt_tokens):
    """A request needs prompt + max_new_tokens + K + 1 positions: exactly the model's limit runs,
    one more is refused (the check was only ever tested far from the limit)."""
    draft = _short_model(tmp_path, models_dir, "draft-small", 170)
    base = {"target": str(models_dir / "target"), "draft": str(draft), "requests": 1,
            "workloads": [str(ROOT / "data" / "workloads" / "code.jsonl")], "max_new_tokens": 16, "k": 3,
            "device": "cpu", "max_prompt_tokens": prompt_tokens}
    if prompt_tokens == 150:
        collect(load_collect_config(None, base=base), tmp_path / "run", progress=False)
        assert read_meta(tmp_path / "run")["status"] == "complete"
        return
    with pytest.raises(ConfigError, match=r"1 request\(s\) need more positions .*max_position_embeddings 170\): "
                                          r".*code.jsonl:1 needs 171"):
        collect(load_collect_config(None, base=base), tmp_path / "run", progress=False)


@pytest.mark.parametrize("reference_tokens", [10, 11])
def test_a_reference_run_checks_the_targets_positions_too(tmp_path, models_dir, reference_tokens):
    """A stand-in drafter makes no forward, but the text stands for what the target served: it must
    fit the target's positions, as a teacher-forced draft run of the same text must fit the draft's."""
    target = _short_model(tmp_path, models_dir, "target", 160)
    cfg = _ref_cfg([str(ROOT / "data" / "workloads" / "code.jsonl")], target=str(target), requests=1,
                   max_prompt_tokens=150, max_new_tokens=reference_tokens)
    if reference_tokens == 10:
        collect(cfg, tmp_path / "ref", progress=False)
        return
    with pytest.raises(ConfigError, match=r"need more positions than the target allows .*needs 161"):
        collect(cfg, tmp_path / "ref", progress=False)
    assert not (tmp_path / "ref").exists()
