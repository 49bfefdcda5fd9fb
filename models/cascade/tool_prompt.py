"""Function tools in a chat prompt: the tool set, the history's call items, and the model family's format.

**Tools** are OpenAI function tools as the Realtime and Responses APIs take them,
``{"type": "function", "name", "description", "parameters"}`` with ``parameters`` a JSON Schema of an
object (the Chat Completions shape ``{"type": "function", "function": {...}}`` is accepted too).
**tool_choice** is ``"auto"`` (the model may answer or call), ``"none"`` (no tool is rendered and no call is
possible), ``"required"`` (at least one call) or ``{"type": "function", "name": NAME}`` (a call of NAME).
:func:`tool_set` checks both and says which field is wrong.

**History items** beside ``[role, text]`` pairs, in the OpenAI Realtime / Responses item shapes:
``{"type": "function_call", "call_id", "name", "arguments"}`` (``arguments`` a JSON string) and
``{"type": "function_call_output", "call_id", "output"}`` (``output`` a string, JSON or not).
:func:`chat_messages` turns them into chat-template messages the Hugging Face way: an assistant message
with ``tool_calls`` (its text, if the assistant said something before calling, as ``content``) and one
``role: "tool"`` message per output, its content the output in plain lines (:func:`result_text`).

**The call format** (Hermes; Qwen2.5's chat template, ``tokenizer_config.json`` of Qwen2.5-*-Instruct)::

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

one block per call, after any text the model says first. A template that renders tools in this format
itself (its source mentions ``tools`` and ``<tool_call>``: Qwen2.5) gets the tools and messages as they are
(:func:`template_renders_tools`). A template without tool support (SmolLM2-Instruct's, which renders only
``role`` and ``content``, or the ChatML fallback) gets them written into plain messages by
:func:`inline_tools`, our documented prompt format: Qwen2.5's own words, so one parser and one grammar serve
both families —

* the system message gains Qwen2.5's tools section: ``# Tools``, the function signatures as JSON lines
  (Chat Completions shape) inside ``<tools></tools>``, and the instruction to answer a call as above (a
  system message is added when there is none);
* an assistant message with calls becomes its text followed by one ``\\n<tool_call>\\n{...}\\n</tool_call>``
  per call (Qwen2.5's rendering, ``json.dumps`` separators);
* consecutive tool outputs become one user message of ``<tool_response>\\n...\\n</tool_response>`` blocks
  joined by newlines.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"
CALL_PREFIX = '<tool_call>\n{"name": "'
"""What a call block starts with, up to the function's name."""
ARGUMENTS_PREFIX = '", "arguments": '
"""What follows the name, up to the arguments object."""
CALL_SUFFIX = "}\n</tool_call>"
"""What follows the arguments object."""
BARE_PREFIX = '{"name": "'
"""A *bare* call: the block's JSON object without the ``<tool_call>`` tags, closed by ``}`` after the
arguments. Qwen2.5-Coder-0.5B-Instruct writes its calls so (seen in ``bench tools`` and from vLLM's server);
the grammar of ``auto`` and the parser accept it beside the tagged form."""
FENCE = "```"
"""A *fenced* call: the object in a markdown code fence (three backticks and ``json``, a newline, the object,
a newline, three backticks), Qwen2.5-Coder-1.5B-Instruct's habit. A spoken reply never holds a code fence, so
under ``auto`` a fence opens a call (the grammar forces the rest into the call's form)."""
TOOLS_SECTION = (
    "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{signatures}\n"
    "</tools>\n\nFor each function call, return a json object with function name and arguments within "
    "<tool_call></tool_call> XML tags:\n"
    '<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)
"""Qwen2.5's tools section (its chat template's words), ``signatures`` = ``"\\n" + json`` per tool."""
CHOICES = ("auto", "none", "required")
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for function names


@dataclass(frozen=True)
class FunctionTool:
    """One function: its ``name``, ``description`` and ``parameters`` (a JSON Schema of an object)."""

    name: str
    description: str
    parameters: dict

    def signature(self) -> dict:
        """The Chat Completions shape chat templates render (``{"type": "function", "function": {...}}``)."""
        fn = {"name": self.name, "description": self.description, "parameters": self.parameters}
        return {"type": "function", "function": fn}


@dataclass(frozen=True)
class ToolSet:
    """Tools offered to one response and how the model may use them.

    Attributes:
        tools: the functions, in the order given.
        choice: ``"auto"``, ``"none"``, ``"required"``, or the name of the one function to call.
    """

    tools: tuple[FunctionTool, ...]
    choice: str

    @property
    def active(self) -> bool:
        """Whether the model may call a tool (some tool, and a choice other than ``none``)."""
        return bool(self.tools) and self.choice != "none"

    @property
    def callable(self) -> tuple[FunctionTool, ...]:
        """The tools a call may name: all of them, the one forced, or none."""
        if not self.active:
            return ()
        if self.choice in CHOICES:
            return self.tools
        return tuple(t for t in self.tools if t.name == self.choice)

    @property
    def forced(self) -> bool:
        """Whether the response must be calls only (``required`` or a named function)."""
        return self.active and self.choice != "auto"

    def key(self) -> str:
        """A canonical string of the set (sorted JSON), for caching what is compiled from it."""
        tools = [[t.name, t.description, t.parameters] for t in self.tools]
        return json.dumps([tools, self.choice], sort_keys=True, separators=(",", ":"))


def _check_schema(schema: dict, field: str) -> None:
    """Check ``schema`` against its JSON Schema metaschema (draft from ``$schema``, else 2020-12)."""
    try:
        import jsonschema
    except ImportError:  # the grammar compiler's own error still names the tool (pipeline.engine.grammar)
        return
    cls = jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(schema)
    except jsonschema.SchemaError as e:
        at = "/".join(str(p) for p in e.absolute_path)
        where = f" (at {at})" if at else ""
        raise ValueError(f"{field}: not a valid JSON Schema: {e.message}{where}") from None


def _tool(i: int, raw) -> FunctionTool:
    field = f"tools[{i}]"
    if not isinstance(raw, dict):
        raise ValueError(f"{field}: a tool must be an object, got {type(raw).__name__}")
    kind = raw.get("type", "function")
    if kind != "function":
        raise ValueError(f"{field}.type: only function tools reach the model, got {kind!r}")
    body = raw["function"] if isinstance(raw.get("function"), dict) else raw  # Chat Completions shape
    if isinstance(raw.get("function"), dict):
        field += ".function"
    name = body.get("name")
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"{field}.name: 1-64 letters, digits, '_' or '-' required, got {name!r}")
    description = body.get("description") or ""
    if not isinstance(description, str):
        raise ValueError(f"{field}.description: must be a string")
    params = body.get("parameters")
    if params is None:
        params = {"type": "object", "properties": {}}
    if not isinstance(params, dict):
        raise ValueError(f"{field}.parameters: not a valid JSON Schema: must be an object, got {params!r}")
    _check_schema(params, f"{field}.parameters")
    if params.get("type", "object") != "object":
        got = params["type"]
        raise ValueError(f"{field}.parameters: arguments must be an object (type: object), got {got!r}")
    return FunctionTool(name, description, params)


def tool_set(tools, tool_choice="auto") -> ToolSet:
    """The checked :class:`ToolSet` of ``tools`` (a list of function tools, see the module docstring; ``None``
    = none) and ``tool_choice`` (``None`` = ``auto``).

    Raises:
        ValueError: the message names the field: ``tools[2].parameters: not a valid JSON Schema: ...``,
            ``tools[0].name``, a duplicate name, ``tool_choice`` not one of the forms or naming an unknown
            function, ``required`` without tools.
    """
    if tools is None:
        tools = []
    if not isinstance(tools, (list, tuple)):
        raise ValueError(f"tools: must be a list of function tools, got {type(tools).__name__}")
    parsed = tuple(_tool(i, t) for i, t in enumerate(tools))
    seen: set[str] = set()
    for i, t in enumerate(parsed):
        if t.name in seen:
            raise ValueError(f"tools[{i}].name: {t.name!r} is defined twice")
        seen.add(t.name)
    choice = "auto" if tool_choice is None else tool_choice
    if isinstance(choice, dict):
        if choice.get("type") != "function":
            raise ValueError(f"tool_choice: a function choice needs type 'function', got {choice!r}")
        name = choice.get("name") or (choice.get("function") or {}).get("name")
        if name not in seen:
            raise ValueError(f"tool_choice: no tool named {name!r} among {sorted(seen)}")
        choice = name
    elif choice not in CHOICES:
        raise ValueError(f"tool_choice: must be auto, none, required or a function, got {choice!r}")
    if choice == "required" and not parsed:
        raise ValueError("tool_choice: required, but no tools are given")
    return ToolSet(parsed, choice)


# -- history items -----------------------------------------------------------------------------------------
def _arguments(raw: str):
    """A call's arguments for a template: the parsed object (templates ``tojson`` it), else the raw string."""
    try:
        return json.loads(raw)
    except (TypeError, ValueError):
        return raw


def history_item(i: int, item, where: str) -> dict:
    """One history entry as a chat message (``[role, text]`` pairs) or a call/output item (see the module
    docstring), checked.

    Raises:
        ValueError: an entry of neither form, naming ``where[i]`` and the field.
    """
    if isinstance(item, (list, tuple)) and len(item) == 2 and item[0] in ("user", "assistant"):
        if not isinstance(item[1], str):
            raise ValueError(f"{where}[{i}] text must be a string")
        return {"role": item[0], "content": item[1]}
    if isinstance(item, dict) and item.get("type") == "function_call":
        for key in ("call_id", "name", "arguments"):
            if not isinstance(item.get(key), str):
                raise ValueError(f"{where}[{i}].{key}: a function_call needs a string {key}")
        return {"type": "function_call", **{k: item[k] for k in ("call_id", "name", "arguments")}}
    if isinstance(item, dict) and item.get("type") == "function_call_output":
        for key in ("call_id", "output"):
            if not isinstance(item.get(key), str):
                raise ValueError(f"{where}[{i}].{key}: a function_call_output needs a string {key}")
        return {"type": "function_call_output", "call_id": item["call_id"], "output": item["output"]}
    raise ValueError(
        f"{where}[{i}] must be [role, text] with role user/assistant, or a function_call / "
        "function_call_output item"
    )


def chat_messages(items: list[dict]) -> list[dict]:
    """Chat-template messages of checked history entries (:func:`history_item`): the calls that follow an
    assistant message (or each other) join it as its ``tool_calls``; an output becomes a ``tool`` message."""
    out: list[dict] = []
    for it in items:
        kind = it.get("type")
        if kind == "function_call":
            call = {
                "type": "function",
                "id": it["call_id"],
                "function": {"name": it["name"], "arguments": _arguments(it["arguments"])},
            }
            last = out[-1] if out else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            out.append({"role": "tool", "tool_call_id": it["call_id"], "content": result_text(it["output"])})
        else:
            out.append(dict(it))
    return out


def _plain(value) -> str:
    if isinstance(value, dict):
        return "; ".join(f"{k}: {_plain(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ", ".join(_plain(v) for v in value)
    return json.dumps(value) if isinstance(value, bool) or value is None else str(value)


def result_text(output: str) -> str:
    """A tool's output as the model reads it in the prompt: a JSON object as one ``key: value`` line per
    member (nested values ``k: v; k: v``, lists comma-separated), anything else as written. With no braces
    to copy, the model says the result rather than reading JSON out (``bench tools``: the post-result reply
    in words; figures in ``MODELS.md``). (A note asking for plain words after the result was tried: the
    135M model read the note out.)

    >>> result_text('{"status": "shipped", "arrives": "Friday"}').splitlines()[:2]
    ['status: shipped', 'arrives: Friday']
    """
    try:
        value = json.loads(output)
    except ValueError:
        value = None
    return "\n".join(f"{k}: {_plain(v)}" for k, v in value.items()) if isinstance(value, dict) else output


def answered_since_user(items: list[dict]) -> frozenset[str]:
    """Names of the functions whose calls after the last user message of chat ``messages``-like ``items``
    (:func:`chat_messages` output) returned a result; a call whose output reads ``error: ...`` (a failed
    call's ``{"error": ...}``, :mod:`omniduplex.app.core.tools`, through :func:`result_text`) does not
    count: the model may retry it."""
    names: dict[str, str] = {}
    out: set[str] = set()
    for m in items:
        if m.get("role") == "user":
            names.clear()
            out.clear()
        for c in m.get("tool_calls") or ():
            names[c.get("id", "")] = c.get("function", c)["name"]
        answered = m.get("role") == "tool" and m.get("tool_call_id") in names
        if answered and not str(m.get("content", "")).startswith("error: "):
            out.add(names[m["tool_call_id"]])
    return frozenset(out)


def calls_since_user(items: list[dict]) -> int:
    """Function calls in the history after its last user message (the calls of the turn in progress)."""
    n = 0
    for it in reversed(items):
        if it.get("role") == "user":
            break
        n += it.get("type") == "function_call"
    return n


# -- rendering ---------------------------------------------------------------------------------------------
def template_renders_tools(source: str) -> bool:
    """Whether a chat template renders tools in the Hermes format itself (Qwen2.5's does)."""
    return "tools" in source and CALL_OPEN in source and "tool_calls" in source


def call_block(name: str, arguments) -> str:
    """One call as the model writes it (Qwen2.5's rendering, without the newline before it)."""
    return f"{CALL_PREFIX}{name}{ARGUMENTS_PREFIX}{json.dumps(arguments, ensure_ascii=False)}{CALL_SUFFIX}"


def inline_tools(messages: list[dict], tools: ToolSet | None) -> list[dict]:
    """``messages`` (with ``tool_calls`` and ``tool`` messages) as plain ``role``/``content`` messages in our
    prompt format (the module docstring), for templates that do not render tools: the tools section when
    ``tools`` may be called, calls as ``<tool_call>`` blocks, outputs as ``<tool_response>`` user turns."""
    out: list[dict] = []
    for m in messages:
        if m["role"] == "tool":
            block = f"<tool_response>\n{m['content']}\n</tool_response>"
            if out and out[-1].get("_tool_outputs"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_outputs": True})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            text = m.get("content") or ""
            for c in m["tool_calls"]:
                fn = c.get("function", c)
                text += "\n" + call_block(fn["name"], fn["arguments"])
            out.append({"role": "assistant", "content": text.lstrip("\n") if not m.get("content") else text})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    for m in out:
        m.pop("_tool_outputs", None)
    if tools is not None and tools.active:
        signatures = "".join("\n" + json.dumps(t.signature(), ensure_ascii=False) for t in tools.tools)
        section = TOOLS_SECTION.format(signatures=signatures)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + section}
        else:
            out.insert(0, {"role": "system", "content": section.lstrip("\n")})
    return out
