"""Workload rows with references: the formats logged traffic comes in, and their errors."""

import json

import pytest

from svt.collect.chat import Message
from svt.collect.encode import encode_reference
from svt.collect.workloads import read_workload, require_references
from svt.errors import ConfigError


def _write(tmp_path, rows, name="w.jsonl"):
    p = tmp_path / name
    p.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return p


def test_each_format_gives_prompt_and_reference(tmp_path):
    p = _write(tmp_path, [
        {"prompt": "def f(x):\n", "reference": "    return x\n"},
        {"prompt": "Q: 2+2?", "response": " 4"},
        {"prompt": "Q: 3+3?", "completion": " 6"},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello."}]},
        {"messages": [{"role": "user", "content": "No answer yet"}]},
    ])
    rows = read_workload(p)
    assert [(r.text, r.reference, r.whole_answer) for r in rows[:3]] == [
        ("def f(x):\n", "    return x\n", False), ("Q: 2+2?", " 4", True), ("Q: 3+3?", " 6", True)]
    chat = rows[3]
    assert chat.messages == (Message("system", "Be brief."), Message("user", "Hi")) and chat.reference == "Hello."
    assert chat.whole_answer and chat.answer == Message("assistant", "Hello.")
    assert rows[4].reference is None and rows[4].messages == (Message("user", "No answer yet"),)
    assert rows[0].where.endswith("w.jsonl:1") and rows[3].where.endswith("w.jsonl:4")


def test_reference_tokens_end_with_eos_only_for_whole_answers(tiny_pair):
    from svt.collect.workloads import Prompt

    tok = tiny_pair.tokenizer
    window = Prompt("w", "x = 1", None, "\ny = 2\n", "w:1", False)
    answer = Prompt("w", "x = 1", None, "\ny = 2\n", "w:2", True)
    ids = tok.encode("\ny = 2\n", add_special_tokens=False)
    assert encode_reference(window, tok, 100) == ids
    assert encode_reference(answer, tok, 100) == [*ids, tok.eos_token_id]
    assert encode_reference(answer, tok, 2) == ids[:2]


@pytest.mark.parametrize("rows, match", [
    ([{"prompt": "a"}], "no reference"),
    ([{"prompt": "a", "reference": "   "}], "reference is empty"),
    ([{"messages": [{"role": "user", "content": "hi"}]}], "no reference"),
])
def test_references_required_for_a_reference_run(tmp_path, rows, match):
    with pytest.raises(ConfigError, match=match):
        require_references(read_workload(_write(tmp_path, rows)))


@pytest.mark.parametrize("row, match", [
    ({"prompt": "a", "reference": "b", "response": "c"}, "give the reference once"),
    ({"prompt": "a", "reference": 3}, "must be a string"),
    ({"messages": [{"role": "assistant", "content": "only"}]}, "only an assistant turn"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "reference": "x"},
     "give the reference once"),
])
def test_malformed_reference_rows_are_refused_with_their_line(tmp_path, row, match):
    with pytest.raises(ConfigError, match=match) as exc:
        read_workload(_write(tmp_path, [{"prompt": "ok", "reference": "fine"}, row]))
    assert "w.jsonl:2" in str(exc.value)


def test_a_reference_that_tokenizes_to_nothing_is_refused(tiny_pair):
    from svt.collect.workloads import Prompt

    with pytest.raises(ConfigError, match="encodes to no tokens"):
        encode_reference(Prompt("w", "x", None, "", "w:7", False), tiny_pair.tokenizer, 10)
