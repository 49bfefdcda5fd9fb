"""Chat prompts from a checkpoint's Jinja chat template (the Hugging Face ``chat_template`` convention).

The template comes from ``chat_template.jinja`` in the model folder or else the ``chat_template`` key of
``tokenizer_config.json`` (a string, or a list of ``{"name", "template"}`` where ``"default"`` is used);
without one, a ChatML template (``<|im_start|>role\\ncontent<|im_end|>\\n``) is used. Templates run in
Jinja's immutable sandbox with ``trim_blocks``/``lstrip_blocks`` and the ``loopcontrols`` extension, and
see what HF templates expect: ``messages``, ``add_generation_prompt``, the special-token strings
(``bos_token``, ``eos_token``, ...), ``raise_exception(msg)``, ``strftime_now(fmt)`` and a ``tojson``
filter that does not HTML-escape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from functools import lru_cache
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from omniduplex.models.cascade.tool_prompt import ToolSet, inline_tools, template_renders_tools

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
"""The fallback for checkpoints without a template."""

_SPECIAL_KEYS = ("bos_token", "eos_token", "pad_token", "unk_token")


class ChatTemplateError(ValueError):
    """A template that does not compile, or one that rejects the conversation (``raise_exception``)."""


def _raise_exception(message: str):
    raise ChatTemplateError(f"chat template: {message}")


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateError as e:
        raise ChatTemplateError(f"chat template does not compile: {e}") from e


@dataclass(frozen=True)
class ChatTemplate:
    """A checkpoint's chat template and the special-token strings it may reference.

    Attributes:
        source: the Jinja source.
        special_tokens: ``bos_token``/``eos_token``/``pad_token``/``unk_token`` strings (those present).
        is_fallback: True when the checkpoint had no template and ChatML is used.
    """

    source: str
    special_tokens: dict[str, str]
    is_fallback: bool = False

    @property
    def renders_tools(self) -> bool:
        """Whether the template renders function tools and calls itself, in the Hermes ``<tool_call>`` format
        (:mod:`.tool_prompt`; Qwen2.5's does, SmolLM2's and the ChatML fallback do not)."""
        return template_renders_tools(self.source)

    def render(
        self, messages: list[dict], add_generation_prompt: bool = True, tools: ToolSet | None = None
    ) -> str:
        """The prompt text of ``messages``, in order: each ``{"role": str, "content": str}``, or an assistant
        message with ``tool_calls`` (``content`` may then be empty) or a ``tool`` message (a call's output),
        as :func:`.tool_prompt.chat_messages` makes them. ``tools``: the functions the model may call (none
        rendered unless :attr:`ToolSet.active`); a template that does not render tools itself gets them and
        the calls written into plain messages (:func:`.tool_prompt.inline_tools`).

        Raises:
            ValueError: a message that is not a dict with string ``role`` and ``content``.
            ChatTemplateError: the template does not compile or rejects the conversation.
        """
        for i, m in enumerate(messages):
            ok = isinstance(m, dict) and isinstance(m.get("role"), str)
            if not ok or not (isinstance(m.get("content"), str) or m.get("tool_calls")):
                raise ValueError(f"message {i} must be a dict with str 'role' and 'content', got {m!r}")
        context = dict(self.special_tokens)
        if self.renders_tools:
            if tools is not None and tools.active:
                context["tools"] = [t.signature() for t in tools.tools]
        elif tools is not None or any(m.get("tool_calls") or m["role"] == "tool" for m in messages):
            messages = inline_tools(messages, tools)
        try:
            return _compile(self.source).render(
                messages=messages, add_generation_prompt=add_generation_prompt, **context
            )
        except ChatTemplateError:
            raise
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"chat template failed: {e}") from e


def _token_string(v) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):  # serialised AddedToken
        return v["content"]
    return None


def load_chat_template(model_dir: str | Path) -> ChatTemplate:
    """The chat template of a checkpoint folder (see the module docstring for where it is looked up).

    Raises:
        ChatTemplateError: ``tokenizer_config.json`` is not valid JSON.
    """
    d = Path(model_dir)
    cfg: dict = {}
    path = d / "tokenizer_config.json"
    if path.is_file():
        try:
            cfg = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ChatTemplateError(f"{path}: invalid JSON ({e})") from e
    specials = {k: s for k in _SPECIAL_KEYS if (s := _token_string(cfg.get(k))) is not None}
    source = cfg.get("chat_template")
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    jinja_file = d / "chat_template.jinja"
    if jinja_file.is_file():
        source = jinja_file.read_text()
    if not isinstance(source, str) or not source:
        return ChatTemplate(CHATML_TEMPLATE, specials, is_fallback=True)
    return ChatTemplate(source, specials)


def render_chat(model_dir: str | Path, messages: list[dict], add_generation_prompt: bool = True) -> str:
    """Render ``messages`` (``[{"role", "content"}, ...]``) with the template of ``model_dir``.

    Raises:
        ValueError / ChatTemplateError: see :meth:`ChatTemplate.render`.
    """
    return load_chat_template(model_dir).render(messages, add_generation_prompt)


def encode_chat(
    tokenizer,
    template: ChatTemplate,
    messages: list[dict],
    add_generation_prompt: bool = True,
    tools: ToolSet | None = None,
):
    """Token ids (``list[int]``) of the rendered prompt (``tools``: see :meth:`ChatTemplate.render`), encoded
    with a ``tokenizers.Tokenizer``.

    The template writes every special token itself, so the tokenizer adds none (``add_special_tokens=
    False``, as ``transformers``' ``apply_chat_template`` does).
    """
    text = template.render(messages, add_generation_prompt, tools)
    return tokenizer.encode(text, add_special_tokens=False).ids
