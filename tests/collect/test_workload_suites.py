"""Workloads from the suites people benchmark on, read from local files: MT-Bench / Spec-Bench
question files, SPEED-Bench's Parquet rows, ShareGPT conversations (fixtures written by hand from
each format's public description)."""

from pathlib import Path

import polars as pl
import pytest

from svt.collect.chat import Message
from svt.collect.workloads import load_workloads, read_workload
from svt.errors import ConfigError

FIX = Path(__file__).parent / "fixtures"


def test_mt_bench_questions_take_the_first_turn_and_the_category():
    ps = read_workload(FIX / "mt_bench_question.jsonl")
    assert [p.workload for p in ps] == ["mt_bench_question/writing", "mt_bench_question/math",
                                        "mt_bench_question/coding"]
    # a question is a one-turn chat: the chat template (where the tokenizer has one) renders it
    assert ps[0].messages[0].role == "user" and ps[0].text is None
    assert ps[0].messages[0].content.startswith("Compose an engaging travel blog post") and ps[0].reference is None
    assert ps[1].reference == "Area is 3" and ps[1].whole_answer  # the first turn's reference


def test_speed_bench_parquet_rows(tmp_path):
    path = tmp_path / "speed_qualitative.parquet"
    pl.DataFrame({"question_id": ["q1", "q2"], "category": ["coding", "rag"], "sub_category": ["py", "doc"],
                  "turns": [["Write a function that reverses a list."], ["Summarise the passage.", "Shorter."]],
                  "source": ["x", "y"], "src_id": ["1", "2"], "difficulty": ["easy", "hard"],
                  "multiturn": [False, True]}).write_parquet(path)
    ps = read_workload(path)
    assert [p.workload for p in ps] == ["speed_qualitative/coding", "speed_qualitative/rag"]
    ws = load_workloads([str(path)], None)
    assert ws.names == ["speed_qualitative"] and len(ws.prompts) == 2
    assert ws.prompts[1].messages[0].content == "Summarise the passage."


def test_sharegpt_conversations_are_chat_records():
    ps = read_workload(FIX / "sharegpt.json")
    assert ps[0].messages == (Message("user", "What is a suffix tree?"),)
    assert ps[0].reference == "A compressed trie of all suffixes of a string."
    assert ps[1].messages[0] == Message("system", "Answer briefly.") and ps[1].reference == "Eleven."
    assert len(ps[1].messages) == 4  # every turn before the last answer is the prompt


@pytest.mark.parametrize(("text", "match"), [
    ('{"turns": []}\n', r":1: `turns` must be a non-empty list"),
    ('{"turns": ["a"], "reference": 3}\n', r":1: `reference` must be a string or a list"),
    ('{"conversations": [{"from": "robot", "value": "hi"}]}\n', r":1: turn 1 is from 'robot'"),
    ('{"conversations": [{"from": "human"}]}\n', r":1: turn 1 of `conversations` needs a string `value`"),
])
def test_a_bad_suite_row_is_named(tmp_path, text, match):
    (tmp_path / "w.jsonl").write_text(text)
    with pytest.raises(ConfigError, match=match):
        read_workload(tmp_path / "w.jsonl")


def test_a_workload_that_is_not_utf8_json_is_one_message(tmp_path):
    """Found by review: a non-UTF-8 workload was a UnicodeDecodeError traceback (the suites share
    svt.fileio.json_objects with svt import now)."""
    (tmp_path / "w.jsonl").write_bytes(b'{"prompt": "caf\xe9"}\n')
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        read_workload(tmp_path / "w.jsonl")
    (tmp_path / "l.json").write_text('[{"prompt": "a"}, 3]')
    with pytest.raises(ConfigError, match=r"l.json record 2: expected a JSON object"):
        read_workload(tmp_path / "l.json")
