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
    # every assistant turn after some message is a request (the greeting too, its prompt the system
    # turn, as with `turns: last`); the last user turn waits for an answer
    assert [(len(x.messages), x.reference) for x in ps] == [(1, "Hello, how can I help?"), (3, "A"), (5, "B"),
                                                            (7, None)]
    assert [x.where.split(":1 ", 1)[1] for x in ps] == ["turn 2", "turn 4", "turn 6", "after turn 7 (unanswered)"]
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


def _head_tokens(tok, p):
    """The tokens before the first non-system message's content, as the model's template renders them."""
    text = tok.apply_chat_template([m.for_template() for m in p.messages], tools=json.loads(p.tools) if p.tools else None,
                                   add_generation_prompt=True, tokenize=False)
    first = next(m for m in p.messages if m.role != "system")
    return tok(text[:text.index(first.content)], add_special_tokens=False)["input_ids"], text


def test_max_prompt_tokens_keeps_the_templates_head(templated):
    """A long agent prompt keeps its last tokens after rendering, and its head (the template's
    opening, the tools, the system turn) intact; a head longer than the limit is refused rather than cut."""
    _, _, tok = templated
    p = read_workload(AGENT_LOG, turns="all")[3]  # the longest prompt of the first conversation
    whole = encode(p, tok, 100_000, 10).prompt_ids
    head_ids, _ = _head_tokens(tok, p)
    n = len(head_ids)
    cut = encode(p, tok, n + 40, 10).prompt_ids
    assert len(cut) == n + 40 and cut[:n - 1] == whole[:n - 1] and cut[-40:] == whole[-40:]
    text = tok.decode(cut)
    assert "You are a coding agent" in text and '"name": "replace_in_file"' in text  # the system turn, the tools
    with pytest.raises(ConfigError, match=r"the prompt's head .* takes \d+ tokens, more than max_prompt_tokens = 30"):
        encode(p, tok, 30, 10)


def test_a_cut_keeps_the_tools_without_a_system_turn(templated, tmp_path):
    """Found by a hostile-input probe: with tools and no system turn the cut dropped the tools block."""
    _, _, tok = templated
    tools = json.loads(AGENT_LOG.read_text().splitlines()[0])["tools"]
    rows = [{"tools": tools, "messages": [{"role": "user", "content": " ".join(f"word{i}" for i in range(300))},
                                          {"role": "assistant", "content": "ok"}]}]
    (p,) = read_workload(_write(tmp_path, rows))
    head_ids, _ = _head_tokens(tok, p)
    cut = encode(p, tok, len(head_ids) + 60, 10).prompt_ids
    text = tok.decode(cut)
    assert '"name": "read_file"' in text and '"name": "run_tests"' in text and "word299" in text
    assert "word0 " not in text


def test_a_template_that_refuses_a_system_only_conversation_still_renders_and_cuts(tmp_path, models_dir):
    """Found by the probe: the head was found by rendering the system turns alone, which templates
    such as Qwen3's refuse ("No user query found"): every record with a system turn failed."""
    from svt.models.loading import load_tokenizer

    d = templated_model(tmp_path, "chatml", models_dir)
    (d / "chat_template.jinja").write_text(
        "{%- if not (messages | selectattr('role', 'equalto', 'user') | list) -%}"
        "{{- raise_exception('No user query found in messages.') -}}{%- endif -%}"
        + (TEMPLATES / "chatml.jinja").read_text())
    tok = load_tokenizer(d)
    rows = [{"messages": [{"role": "system", "content": "Be brief."},
                          {"role": "user", "content": " ".join(f"w{i}" for i in range(200))},
                          {"role": "assistant", "content": "ok"}]}]
    (p,) = read_workload(_write(tmp_path, rows))
    assert tok.decode(encode(p, tok, 10_000, 10).reference_ids) == "ok<|im_end|>\n"
    cut = tok.decode(encode(p, tok, 80, 10).prompt_ids)
    assert cut.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n") and "w199" in cut


def test_a_template_that_does_not_render_tool_calls_is_refused(tmp_path, models_dir):
    """Found by the probe: a template that never prints `tool_calls` turned a tool call into an
    empty reference, silently."""
    from svt.models.loading import load_tokenizer

    d = templated_model(tmp_path, "chatml", models_dir)
    (d / "chat_template.jinja").write_text(
        "{%- for m in messages -%}{{- '<|im_start|>' + m.role + '\\n' + (m.content or '') + '<|im_end|>\\n' -}}"
        "{%- endfor -%}{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}")
    tok = load_tokenizer(d)
    ps = read_workload(AGENT_LOG, turns="all")
    with pytest.raises(ConfigError, match=r"agent-log.jsonl:1 turn 3: the chat template does not render the tool call "
                                          r"'read_file' of the answer"):
        encode(ps[0], tok, 10_000, 10)
    with pytest.raises(ConfigError, match=r"does not render the tool call 'read_file' of the conversation"):
        encode(ps[1], tok, 10_000, 10)


@pytest.mark.parametrize(("row", "match"), [
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "I'll call",
                                                      "function_call": "f({})"}]},
     r"message 2: `function_call` must be an object"),
    ({"messages": [{"role": "user", "content": "q", "function_call": {"name": "f"}},
                   {"role": "assistant", "content": "a"}]}, r"only an assistant turn calls tools, but this user turn"),
    ({"prompt": "PLAIN", "reference": "R", "messages": [{"role": "user", "content": "q"}]},
     r"the row has both `prompt` and `messages`"),
])
def test_records_that_would_lose_a_part_silently_are_refused(tmp_path, row, match):
    with pytest.raises(ConfigError, match=match):
        read_workload(_write(tmp_path, [row]))


def test_a_byte_order_mark_and_padded_sharegpt_roles_are_read(tmp_path):
    p = tmp_path / "w.jsonl"
    p.write_bytes("\ufeff".encode() + json.dumps({"conversations": [{"from": " Human ", "value": "q"},
                                                                     {"from": "GPT", "value": "a"}]}).encode() + b"\n")
    (row,) = read_workload(p)
    assert row.messages == (Message("user", "q"),) and row.reference == "a"


def test_json_lines_split_on_newlines_only(tmp_path):
    """U+2028 and U+0085 are legal raw inside a JSON string; splitlines() broke such records."""
    p = tmp_path / "w.jsonl"
    p.write_text('{"prompt": "a\u2028b", "reference": "c\u0085d"}\r\n{"prompt": "e", "reference": "f"}\n',
                 encoding="utf-8")
    ps = read_workload(p)
    assert [(x.text, x.reference) for x in ps] == [("a\u2028b", "c\u0085d"), ("e", "f")]
    assert ps[1].where.endswith("w.jsonl:2")
