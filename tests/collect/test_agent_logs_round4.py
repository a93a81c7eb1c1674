"""Real agent logs (issue 53): with `turns: all` the assistant turns that open a conversation were
dropped without a count; prompts whose head (system turn, tools) is longer than max_prompt_tokens
were refused one row per run. Now the opening turns are counted (run.json, the collect summary, the
report), every long-head row is named in one error, and `on_long_head: skip` leaves them out,
counted."""

import json

import pytest
import yaml
from typer.testing import CliRunner

from svt.cli import app
from svt.collect.encode import encode_all
from svt.collect.workloads import read_workload
from svt.errors import ConfigError
from svt.models.loading import load_tokenizer
from svt.traces.io import read_meta
from tests.collect.test_chat_templates import templated_model

LONG_SYSTEM = "You are a careful assistant. " * 40


def _rows(n_long: int, n_short: int, opening: int = 0) -> list[dict]:
    rows = []
    for i in range(n_long + n_short):
        system = LONG_SYSTEM if i < n_long else "Be brief."
        rows.append({"messages": [{"role": "system", "content": system},
                                  {"role": "user", "content": f"Question {i}: what is {i} + {i}?"},
                                  {"role": "assistant", "content": f"It is {2 * i}."}]})
    for i in range(opening):  # a conversation the assistant opens (a greeting), then answers the user
        rows.append({"messages": [{"role": "assistant", "content": "Hello! How can I help?"},
                                  {"role": "user", "content": f"Say {i}."},
                                  {"role": "assistant", "content": f"{i}."}]})
    return rows


def _write(tmp_path, rows, name="agent.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


@pytest.fixture(scope="module")
def target(models_dir, tmp_path_factory):
    return templated_model(tmp_path_factory.mktemp("tpl"), "chatml", models_dir)


def test_every_long_head_is_named_in_one_error(target, tmp_path):
    tok = load_tokenizer(target)
    prompts = read_workload(_write(tmp_path, _rows(3, 2)))
    with pytest.raises(ConfigError) as err:
        encode_all(prompts, tok, 60, 16)
    msg = str(err.value)
    assert msg.startswith("3 prompt(s) have a head") and "on_long_head: skip" in msg
    for line in (1, 2, 3):
        assert f"agent.jsonl:{line} (" in msg
    assert "agent.jsonl:4" not in msg


def _collect(tmp_path, target, workload, **over):
    cfg = tmp_path / "c.yaml"
    cfg.write_text(yaml.safe_dump({"engine": "reference", "target": str(target), "stand_in": {"rate": 0.5},
                                   "workloads": [str(workload)], "temperature": 0, "max_prompt_tokens": 60,
                                   "max_new_tokens": 16, **over}))
    return CliRunner().invoke(app, ["collect", str(cfg), "--out", str(tmp_path / "run")])


def test_long_heads_are_skipped_and_counted_when_asked(target, tmp_path):
    wl = _write(tmp_path, _rows(3, 2))
    refused = _collect(tmp_path, target, wl)
    assert refused.exit_code == 2 and "3 prompt(s) have a head" in refused.output, refused.output
    assert not (tmp_path / "run").exists()
    r = _collect(tmp_path, target, wl, on_long_head="skip")
    assert r.exit_code == 0, r.output
    reading = read_meta(tmp_path / "run")["workload_reading"]
    assert reading["skipped_long_head"] == {"agent": 3} and reading["requests"] == 2
    assert reading["requests_per_workload"] == {"agent": 2}
    assert "on_long_head: skip): agent 3" in r.output
    assert read_meta(tmp_path / "run")["counts"]["requests"] == 2


def test_long_heads_are_skipped_before_the_requests_are_picked(target, tmp_path):
    """`requests: N` with `on_long_head: skip` picked N rows, then skipped the long ones among them
    (76 of 78 usable rows run for requests: 80): the long rows leave first, then N usable rows run."""
    rows = _rows(0, 6)
    rows[0:0] = _rows(3, 0)  # three long rows first: the first rows picked
    wl = _write(tmp_path, rows)
    r = _collect(tmp_path, target, wl, on_long_head="skip", requests=4)
    assert r.exit_code == 0, r.output
    reading = read_meta(tmp_path / "run")["workload_reading"]
    assert reading["requests"] == 4 and reading["skipped_long_head"] == {"agent": 3}
    assert read_meta(tmp_path / "run")["counts"]["requests"] == 4


def test_opening_assistant_turns_are_counted_with_turns_all(target, tmp_path):
    wl = _write(tmp_path, _rows(0, 2, opening=2))
    prompts = read_workload(wl, turns="all", counts=(counts := {}))
    assert len(prompts) == 4 and counts["assistant_turns_without_prompt"] == 2
    r = _collect(tmp_path, target, wl, turns="all", max_prompt_tokens=200)
    assert r.exit_code == 0, r.output
    reading = read_meta(tmp_path / "run")["workload_reading"]
    assert reading["assistant_turns_without_prompt"] == {"agent": 2} and reading["requests"] == 4
    assert "open a conversation" in r.output and "agent 2" in r.output
    rep = CliRunner().invoke(app, ["evaluate", str(tmp_path / "run"), "--out", str(tmp_path / "rep")])
    assert rep.exit_code == 0, rep.output
    assert "open a conversation, not requests (nothing before them): agent 2" in (tmp_path / "rep" / "report.md").read_text()
