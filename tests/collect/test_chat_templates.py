"""Real traffic as it is: chat templates (two real Jinja templates written as fixtures, on a
tokenizer derived from the built-in one), agent logs with tool calls, ShareGPT tool turns, and the
bad records of real logs, each one clear message."""

import json
import shutil
from pathlib import Path

import pytest

from svt.collect.chat import Message
from svt.collect.encode import encode
from svt.collect.workloads import load_workloads, read_workload
from svt.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
AGENT_LOG = ROOT / "examples" / "traffic" / "agent-log.jsonl"


def templated_model(tmp: Path, template: str, models: Path) -> Path:
    """The built-in target with a chat template (``chat_template.jinja``, as transformers saves
    one): the same weights and vocabulary, so both engines can run it."""
    d = tmp / f"target-{template}"
    if not d.is_dir():
        d.mkdir(parents=True)
        for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"):
            shutil.copy(models / "target" / f, d / f)
        (d / "model.safetensors").symlink_to(models / "target" / "model.safetensors")
        shutil.copy(TEMPLATES / f"{template}.jinja", d / "chat_template.jinja")
    return d


@pytest.fixture(scope="module", params=["chatml", "llama3"])
def templated(request, tmp_path_factory, models_dir):
    from svt.models.loading import load_tokenizer

    d = templated_model(tmp_path_factory.mktemp("tok"), request.param, models_dir)
    return request.param, d, load_tokenizer(d)


def _write(tmp_path, rows, name="w.jsonl"):
    p = tmp_path / name
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def test_the_prompt_is_the_templates_own_and_the_reference_what_the_turn_adds(templated):
    """transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True): its keys
    became the "token ids" and crashed both engines. The prompt must be exactly the template's
    tokens; the reference exactly the tokens the last assistant turn adds, as the model writes them."""
    name, _, tok = templated
    ps = read_workload(AGENT_LOG)
    for p in ps:
        e = encode(p, tok, 100_000, 100_000)
        msgs = [m.for_template() for m in p.messages]
        tools = json.loads(p.tools)
        want = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=True)["input_ids"]
        assert e.prompt_ids == list(want)
        prompt_text = tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=True, tokenize=False)
        full = tok.apply_chat_template([*msgs, p.answer.for_template()], tools=tools, tokenize=False)
        assert full.startswith(prompt_text)
        assert e.reference_ids == tok(full[len(prompt_text):], add_special_tokens=False)["input_ids"]
        assert tok.decode(e.prompt_ids) + tok.decode(e.reference_ids) == full
        end = "<|im_end|>\n" if name == "chatml" else "<|eot_id|>"
        assert tok.decode(e.reference_ids).endswith(end)  # the template's end of turn, no eos added
        assert e.reference_ids[-1] != tok.eos_token_id


def test_an_indented_answer_is_tokenized_as_the_model_writes_it(templated, tmp_path):
    """The answer's tokens are the added text tokenized on its own: a byte-level BPE tokenizing
    prompt and answer together merges the prompt's last newline with the answer's indentation,
    which no model emits after the prompt's tokens."""
    _, _, tok = templated
    rows = [{"messages": [{"role": "user", "content": "Finish the body."},
                          {"role": "assistant", "content": "    return x + 1\n"}]}]
    (p,) = read_workload(_write(tmp_path, rows))
    e = encode(p, tok, 512, 64)
    body = tok("    return x + 1\n", add_special_tokens=False)["input_ids"]
    assert e.reference_ids[:len(body)] == body
    joint = tok(tok.decode(e.prompt_ids) + tok.decode(e.reference_ids), add_special_tokens=False)["input_ids"]
    assert joint[:len(e.prompt_ids)] != e.prompt_ids  # tokenized together, the boundary would move


def test_agent_log_references_keep_their_tool_calls(templated):
    """OpenAI assistant turns with `tool_calls` and null or empty content were dropped or refused;
    with `turns: all` each assistant turn is a request whose reference is its call."""
    name, _, tok = templated
    ws = load_workloads([str(AGENT_LOG)], None, turns="all", need_reference=True)
    assert len(ws.prompts) == 6 * 4 and ws.reading["turns"] == {"agent-log": "all"}
    first = [encode(p, tok, 100_000, 100_000) for p in ws.prompts[:4]]  # one conversation, in order
    texts = [tok.decode(e.reference_ids) for e in first]
    key = "arguments" if name == "chatml" else "parameters"
    assert f'{{"name": "read_file", "{key}": {{"path": "textutil/header.py"}}}}' in texts[0]
    assert '"name": "replace_in_file"' in texts[1] and texts[1].startswith("The bug is in `parse_header`")
    assert '"name": "run_tests"' in texts[2] and texts[3].startswith("Fixed `parse_header`")
    # the conversation so far is each next request's prompt: earlier calls and tool results included
    assert tok.decode(first[1].prompt_ids).count("def parse_header(line):") == 1
    assert [len(e.prompt_ids) for e in first] == sorted(len(e.prompt_ids) for e in first)


def test_without_a_template_the_plain_rendering_keeps_tool_calls_as_text(tiny_pair):
    tok = tiny_pair.tokenizer
    ps = read_workload(AGENT_LOG, turns="all")
    e = encode(ps[1], tok, 100_000, 100_000)
    prompt = tok.decode(e.prompt_ids)
    assert prompt.startswith("### tools\n{\"type\": \"function\"")
    assert '### assistant\n<tool_call>{"name": "read_file", "arguments": {"path": "textutil/header.py"}}</tool_call>\n' \
           "### tool (call_01)\ndef parse_header(line):" in prompt
    assert prompt.endswith("### assistant\n")
    assert tok.decode(e.reference_ids) == ("The bug is in `parse_header`; I replace the faulty line.\n<tool_call>"
                                           + json.dumps({"name": "replace_in_file",
                                                         "arguments": json.loads(ps[1].answer.tool_calls[0].arguments)})
                                           + "</tool_call><|endoftext|>")


def test_roles_any_case_text_parts_and_null_content(tmp_path):
    p = _write(tmp_path, [{"messages": [
        {"role": "SYSTEM", "content": "Be brief."},
        {"role": "User", "content": [{"type": "text", "text": "Read "}, {"type": "text", "text": "a.py"}]},
        {"role": "Assistant", "content": None,
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{\"p\": 1}"}}]},
        {"role": "tool", "tool_call_id": "c1", "name": "read", "content": "x = 1"},
        {"role": "assistant", "content": "Done."}]}])
    (last,) = read_workload(p)
    assert [m.role for m in last.messages] == ["system", "user", "assistant", "tool"]
    assert last.messages[1].content == "Read a.py"
    assert last.messages[2].content == "" and last.messages[2].tool_calls[0].parsed_arguments() == {"p": 1}
    assert last.messages[3].for_template() == {"role": "tool", "content": "x = 1", "tool_call_id": "c1",
                                               "name": "read"}
    assert last.answer == Message("assistant", "Done.")


@pytest.mark.parametrize(("message", "match"), [
    ({"role": "robot", "content": "hi"}, r"w.jsonl:1: message 1 has role 'robot'; expected one of system, user"),
    ({"role": None, "content": "hi"}, r"w.jsonl:1: message 1 has role null"),
    ({"content": "hi"}, r"w.jsonl:1: message 1 has role null"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
     r"content part 1 is of type 'image_url'; only text parts"),
    ({"role": "assistant", "content": None}, r"an assistant turn with neither content nor tool calls"),
    ({"role": "assistant", "content": "", "tool_calls": [{"function": {"arguments": "{}"}}]},
     r"tool call 1 needs `function` with a string `name`"),
    ({"role": "user", "content": 3}, r"`content` must be a string, null or a list of text parts"),
])
def test_a_bad_message_is_named_with_its_line(tmp_path, message, match):
    p = _write(tmp_path, [{"messages": [message, {"role": "assistant", "content": "ok"}]}])
    with pytest.raises(ConfigError, match=match):
        read_workload(p)


def test_sharegpt_function_call_and_observation_turns(tmp_path):
    p = _write(tmp_path, [{"conversations": [
        {"from": "human", "value": "Weather in Paris?"},
        {"from": "function_call", "value": "{\"name\": \"weather\", \"arguments\": {\"city\": \"Paris\"}}"},
        {"from": "observation", "value": "{\"temp\": 21}"},
        {"from": "gpt", "value": "21 degrees."}], "tools": "[{\"name\": \"weather\"}]"}])
    ps = read_workload(p, turns="all")
    assert [p.answer.tool_calls[0].name if p.answer.tool_calls else p.answer.content for p in ps] == \
        ["weather", "21 degrees."]
    assert ps[1].messages[2] == Message("tool", "{\"temp\": 21}") and json.loads(ps[0].tools) == [{"name": "weather"}]
    bad = _write(tmp_path, [{"conversations": [{"from": "human", "value": "q"},
                                               {"from": "function_call", "value": "weather(Paris)"}]}], "b.jsonl")
    with pytest.raises(ConfigError, match=r"b.jsonl:1: turn 2: a `function_call` turn's value must be a JSON object"):
        read_workload(bad)


def test_turns_all_is_one_request_per_assistant_turn_in_order(tmp_path):
    p = _write(tmp_path, [{"messages": [
        {"role": "system", "content": "s"}, {"role": "assistant", "content": "Hello, how can I help?"},
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "A"},
        {"role": "user", "content": "b"}, {"role": "assistant", "content": "B"},
        {"role": "user", "content": "c"}]}])
    ps = read_workload(p, turns="all")
    # the greeting answers nothing (no user or tool turn before it); the last user turn waits for an answer
    assert [(len(x.messages), x.reference) for x in ps] == [(3, "A"), (5, "B"), (7, None)]
    assert [x.where.rsplit(" ", 1)[1] for x in ps] == ["4", "6", "8"]
    (last,) = read_workload(p)  # turns: last: the record does not end with the assistant: no reference
    assert last.reference is None and len(last.messages) == 7


def test_a_template_error_is_one_message_naming_the_record(templated, tmp_path):
    """A template that raises (here: a system turn after the first) was an uncaught jinja TemplateError."""
    _, _, tok = templated
    p = _write(tmp_path, [{"prompt": "fine", "reference": "ok"},
                          {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "late"},
                                        {"role": "assistant", "content": "b"}]}])
    ps = read_workload(p)
    with pytest.raises(ConfigError, match=r"w.jsonl:2: the tokenizer's chat template failed on this record: "
                                          r"[aA] system turn must come first"):
        encode(ps[1], tok, 512, 64)


def test_a_template_that_rewrites_earlier_turns_is_refused_with_the_reason(tmp_path, models_dir):
    from svt.models.loading import load_tokenizer

    d = templated_model(tmp_path, "chatml", models_dir)
    # a template whose text depends on the whole conversation (it counts the turns at the top)
    (d / "chat_template.jinja").write_text("{{ messages | length }} turns\n" + (TEMPLATES / "chatml.jinja").read_text())
    tok = load_tokenizer(d)
    ps = read_workload(_write(tmp_path, [{"messages": [{"role": "user", "content": "a"},
                                                       {"role": "assistant", "content": "b"}]}]))
    with pytest.raises(ConfigError, match=r"w.jsonl:1: the chat template does not render the conversation with "
                                          r"the assistant's turn as the prompt followed by that turn"):
        encode(ps[0], tok, 512, 64)


def test_max_prompt_tokens_keeps_the_templates_head(templated):
    """A long agent prompt keeps its last tokens after rendering, and the system turn (with the
    tools) intact; a head longer than the limit is refused rather than cut."""
    _, _, tok = templated
    p = read_workload(AGENT_LOG, turns="all")[3]  # the longest prompt of the first conversation
    whole = encode(p, tok, 100_000, 10).prompt_ids
    lead = tok.apply_chat_template([p.messages[0].for_template()], tools=json.loads(p.tools), tokenize=False)
    head = len(tok(lead, add_special_tokens=False)["input_ids"])
    cut = encode(p, tok, head + 40, 10).prompt_ids
    assert len(cut) == head + 40 and cut[:head - 1] == whole[:head - 1] and cut[head:] == whole[-40:]
    with pytest.raises(ConfigError, match=r"the prompt's head .* takes \d+ tokens, more than max_prompt_tokens = 30"):
        encode(p, tok, 30, 10)


def test_json_lines_split_on_newlines_only(tmp_path):
    """U+2028 and U+0085 are legal raw inside a JSON string; splitlines() broke such records."""
    p = tmp_path / "w.jsonl"
    p.write_text('{"prompt": "a\u2028b", "reference": "c\u0085d"}\r\n{"prompt": "e", "reference": "f"}\n',
                 encoding="utf-8")
    ps = read_workload(p)
    assert [(x.text, x.reference) for x in ps] == [("a\u2028b", "c\u0085d"), ("e", "f")]
    assert ps[1].where.endswith("w.jsonl:2")
