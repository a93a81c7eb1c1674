"""Chat records as serving systems and agents log them: messages, tool calls and tool results.

A message is read from the OpenAI chat format (the one vLLM, SGLang and most agent frameworks log):

- ``role``: ``system``, ``user``, ``assistant`` or ``tool`` (any case); anything else is refused
  by name;
- ``content``: a string, null (an assistant turn that only calls tools), or a list of text parts
  (``{"type": "text", "text": ...}``; a non-text part is refused by its type);
- an assistant's ``tool_calls``: ``[{"id": ..., "type": "function", "function": {"name": ...,
  "arguments": "<JSON text>"}}]`` (the legacy single ``function_call`` too);
- a tool result's ``tool_call_id`` (and ``name``, when given).

ShareGPT conversations (``from``: ``human``, ``gpt``, ``system``, ``function_call``,
``observation``) are read into the same messages: a ``function_call`` turn is an assistant turn
calling the tool its JSON value names, an ``observation`` is the tool's result.

Rendering, in :mod:`svt.collect.encode`: with the tokenizer's chat template (the model's own), or,
for a tokenizer without one, :func:`plain_prompt` / :func:`plain_body`, which keep every tool call
and result as text so a suffix cache sees them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from svt.errors import ConfigError

ROLES = ("system", "user", "assistant", "tool")
TEXT_PARTS = ("text", "input_text", "output_text")  # the Chat Completions and Responses APIs' text parts


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text as logged (an object's text when it parses; else the raw string)
    id: str | None = None

    def parsed_arguments(self):
        """The arguments as the object they encode (what chat templates expect), else the raw text."""
        try:
            return json.loads(self.arguments)
        except (json.JSONDecodeError, TypeError):
            return self.arguments


@dataclass(frozen=True)
class Message:
    role: str  # one of ROLES
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    tool_call_id: str | None = None
    name: str | None = None

    def for_template(self) -> dict:
        """The message as transformers' chat templates take it (tool-call arguments as objects, a
        null content as an empty string: templates print ``None`` otherwise)."""
        out: dict = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{**({"id": c.id} if c.id is not None else {}), "type": "function",
                                  "function": {"name": c.name, "arguments": c.parsed_arguments()}}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        if self.name is not None:
            out["name"] = self.name
        return out


def parse_messages(raw, where: str, key: str = "messages") -> tuple[Message, ...]:
    """A record's ``messages`` list as messages, or one error naming the record and the message."""
    if not isinstance(raw, list) or not raw:
        raise ConfigError(f"{where}: `{key}` must be a non-empty list of messages.")
    return tuple(_message(m, f"{where}: message {i + 1}") for i, m in enumerate(raw))


def _message(m, where: str) -> Message:
    if not isinstance(m, dict):
        raise ConfigError(f"{where} must be an object with `role` and `content`, but got {type(m).__name__}.")
    role = m.get("role")
    if not isinstance(role, str) or role.strip().lower() not in ROLES:
        shown = "null" if role is None else repr(role)
        raise ConfigError(f"{where} has role {shown}; expected one of {', '.join(ROLES)} (any case).")
    role = role.strip().lower()
    content = _content(m.get("content"), where)
    calls = _tool_calls(m, where) if role == "assistant" else ()
    for key in ("tool_calls", "function_call"):
        if role != "assistant" and m.get(key):
            raise ConfigError(f"{where}: only an assistant turn calls tools, but this {role} turn has `{key}`.")
    if role == "assistant" and content is None and not calls:
        raise ConfigError(f"{where}: an assistant turn with neither content nor tool calls.")
    call_id = m.get("tool_call_id")
    if call_id is not None and not isinstance(call_id, (str, int)):
        raise ConfigError(f"{where}: `tool_call_id` must be a string, but got {json.dumps(call_id)[:60]}.")
    name = m.get("name")
    if name is not None and not isinstance(name, str):
        raise ConfigError(f"{where}: `name` must be a string, but got {json.dumps(name)[:60]}.")
    return Message(role, content or "", calls, None if call_id is None else str(call_id), name)


def _content(value, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if isinstance(part, str):
                texts.append(part)
                continue
            kind = part.get("type") if isinstance(part, dict) else None
            if kind not in TEXT_PARTS or not isinstance(part.get("text"), str):
                raise ConfigError(f"{where}: content part {j + 1} is of type {kind!r}; only text parts "
                                  f"({', '.join(TEXT_PARTS)}) can be tokenized.")
            texts.append(part["text"])
        return "".join(texts)
    raise ConfigError(f"{where}: `content` must be a string, null or a list of text parts, but got "
                      f"{type(value).__name__}.")


def _tool_calls(m: dict, where: str) -> tuple[ToolCall, ...]:
    raw = m.get("tool_calls")
    legacy = m.get("function_call")
    if legacy is not None:  # the legacy single call
        if raw is not None:
            raise ConfigError(f"{where}: give `tool_calls` or the legacy `function_call`, not both.")
        if not isinstance(legacy, dict):
            raise ConfigError(f"{where}: `function_call` must be an object with `name` and `arguments`, but got "
                              f"{type(legacy).__name__}.")
        raw = [{"type": "function", "function": legacy}]
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"{where}: `tool_calls` must be a list, but got {type(raw).__name__}.")
    calls = []
    for j, c in enumerate(raw):
        fn = c.get("function") if isinstance(c, dict) else None
        if not (isinstance(fn, dict) and isinstance(fn.get("name"), str) and fn["name"]):
            raise ConfigError(f"{where}: tool call {j + 1} needs `function` with a string `name`.")
        calls.append(ToolCall(fn["name"], _arguments(fn.get("arguments"), f"{where}: tool call {j + 1}"),
                              None if c.get("id") is None else str(c["id"])))
    return tuple(calls)


def _arguments(value, where: str) -> str:
    if value is None:
        return "{}"
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        return json.dumps(value, ensure_ascii=False)
    raise ConfigError(f"{where}: `arguments` must be JSON text or an object, but got {type(value).__name__}.")


SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "chatgpt": "assistant", "bing": "assistant", "bard": "assistant", "system": "system",
                  "function_call": "assistant", "observation": "tool", "tool": "tool"}


def sharegpt_messages(conv, where: str) -> tuple[Message, ...]:
    """ShareGPT's ``conversations`` as messages (``function_call`` and ``observation`` turns too)."""
    if not isinstance(conv, list) or not conv:
        raise ConfigError(f"{where}: `conversations` must be a non-empty list of turns.")
    out = []
    for i, turn in enumerate(conv):
        if not (isinstance(turn, dict) and isinstance(turn.get("value"), str)):
            raise ConfigError(f"{where}: turn {i + 1} of `conversations` needs a string `value`.")
        source = str(turn.get("from", "")).strip().lower()
        role = SHAREGPT_ROLES.get(source)
        if role is None:
            raise ConfigError(f"{where}: turn {i + 1} is from {turn.get('from')!r}; expected one of "
                              f"{', '.join(sorted(SHAREGPT_ROLES))}.")
        if source == "function_call":
            out.append(Message("assistant", "", (_sharegpt_call(turn["value"], f"{where}: turn {i + 1}"),)))
        else:
            out.append(Message(role, turn["value"]))
    return tuple(out)


def _sharegpt_call(value: str, where: str) -> ToolCall:
    try:
        obj = json.loads(value)
    except json.JSONDecodeError:
        obj = None
    if not (isinstance(obj, dict) and isinstance(obj.get("name"), str)):
        raise ConfigError(f"{where}: a `function_call` turn's value must be a JSON object with a `name` "
                          "(and `arguments`).")
    return ToolCall(obj["name"], _arguments(obj.get("arguments"), where))


def parse_tools(raw, where: str) -> str | None:
    """A record's ``tools`` (OpenAI function schemas, or their JSON text as ShareGPT stores them)
    as canonical JSON text, passed to the chat template as transformers passes tools."""
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError:
            raise ConfigError(f"{where}: `tools` is text that is not JSON.") from None
    if not (isinstance(raw, list) and all(isinstance(t, dict) for t in raw)):
        raise ConfigError(f"{where}: `tools` must be a list of tool schemas (objects).")
    return json.dumps(raw, ensure_ascii=False) if raw else None


# --- the plain rendering, for a tokenizer without a chat template ----------------------------------

def plain_call(call: ToolCall) -> str:
    return f"<tool_call>{json.dumps({'name': call.name, 'arguments': call.parsed_arguments()}, ensure_ascii=False)}" \
           "</tool_call>"


def plain_body(m: Message) -> str:
    """A turn's text: its content, then each tool call on a line of its own."""
    return "\n".join([m.content] * bool(m.content) + [plain_call(c) for c in m.tool_calls])


def plain_header(m: Message) -> str:
    extra = "".join([f" {m.name}"] * bool(m.name) + [f" ({m.tool_call_id})"] * (m.tool_call_id is not None))
    return f"### {m.role}{extra}\n"


def plain_prompt(messages: tuple[Message, ...], tools: str | None) -> str:
    """The prompt's text: a ``### tools`` block (one schema per line) when the record has tools,
    each turn as ``### ROLE`` + its body, and the assistant's header that the answer follows."""
    head = "" if tools is None else "### tools\n" + "".join(json.dumps(t, ensure_ascii=False) + "\n"
                                                            for t in json.loads(tools))
    return head + "".join(plain_header(m) + plain_body(m) + "\n" for m in messages) + "### assistant\n"


def plain_head(messages: tuple[Message, ...], tools: str | None) -> str:
    """The part of :func:`plain_prompt` a cut keeps: the tools block and the leading system turns."""
    lead = []
    for m in messages:
        if m.role != "system":
            break
        lead.append(m)
    head = plain_prompt(tuple(lead), tools)
    return head[: -len("### assistant\n")]
