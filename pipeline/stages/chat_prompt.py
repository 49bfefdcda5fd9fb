"""The turn → prompt half of the cascade's LLM stage, shared by its backends (our engine, :mod:`.llm`;
vLLM, :mod:`.vllm_llm`; the OpenAI-compatible client, :mod:`.openai_llm`, for the limits): a turn's meta
(transcript, system prompt, history, tools, sampling) becomes the chat prompt's token ids, its decoding
controls and the arguments of its reply stream, and a partial transcript becomes a prefill hint's ids
(:mod:`.llm`'s module docstring says what each key means).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
from tokenizers import Tokenizer

from omniduplex.models.cascade.chat_template import ChatTemplate, encode_chat, load_chat_template
from omniduplex.models.cascade.tool_prompt import (
    CALL_OPEN,
    ToolSet,
    answered_since_user,
    calls_since_user,
    chat_messages,
    history_item,
    tool_set,
)
from omniduplex.models.checkpoint import CheckpointError
from omniduplex.pipeline.engine.request import SamplingParams
from omniduplex.pipeline.messages import DecoderOutput, StageMessage, Transcript, TurnOptions
from omniduplex.pipeline.stages.tool_calls import call_key
from omniduplex.pipeline.text.spoken import sentence_budget

EXTRA_STOP_TOKENS = ("<|endoftext|>",)
"""Stop tokens besides the tokenizer's eos, when the vocabulary has them."""
_PROBE = " and then"
"""Words appended to a partial transcript to find the tokens a longer transcript keeps
(:meth:`ChatPrompter.hint_ids`)."""
MAX_TOOL_CALLS = 4
"""Default most tool calls per user turn (the call loop is cut there: ``max_tool_calls`` of the stage)."""
SENTENCE_GRACE_TOKENS = 32
"""Tokens a spoken reply may run past its ``max_tokens`` to finish the sentence it is saying (then it ends:
:class:`~omniduplex.pipeline.text.reply_text.ReplyStream` ``finish_sentence``)."""
CALL_TOKENS = 128
"""Tokens a reply may spend per tool call beyond its text budget (``max_tokens`` counts text only)."""


def has_words(text: str) -> bool:
    return any(ch.isalnum() for ch in text)


@dataclass
class ChatTurn:
    """A turn ready for an engine: ``ids`` the chat prompt's token ids, ``sampling`` its decoding controls
    (the stop ids included), ``turn`` the turn's options to hand on (without ``sampling``/``tools``/
    ``tool_choice``), ``tools`` what the reply may call (the call limit applied), ``reply`` the
    :class:`~omniduplex.pipeline.text.reply_text.ReplyStream` arguments of its output, ``call_gate``
    whether the reply's first token decides call or words by the calibrated rule
    (:mod:`omniduplex.pipeline.engine.call_gate`): a turn's first reply under ``tool_choice: auto``; a
    continuation after tool results is left to the model, so that the gate never pushes a second call."""

    ids: list[int]
    sampling: SamplingParams
    turn: TurnOptions
    tools: ToolSet = field(default_factory=lambda: ToolSet((), "auto"))
    reply: dict = field(default_factory=dict)
    call_gate: bool = False


class ChatPrompter:
    """The turn → prompt half of the LLM stage, shared by both backends (:class:`LLMWorker`, our engine;
    :class:`~.vllm_llm.VLLMLLMWorker`, vLLM), so both feed their engine the same ids.

    Args:
        path: the checkpoint folder: ``tokenizer.json`` and optionally a chat template
            (else ChatML, see :mod:`.chat_template`).
        raw_config: its ``config.json`` (``eos_token_id`` when the tokenizer names no eos token).
        max_tool_calls: most tool calls per user turn (:data:`MAX_TOOL_CALLS`).

    Raises:
        CheckpointError: no ``tokenizer.json`` or no eos token.
    """

    def __init__(self, path: Path, raw_config: dict, max_tool_calls: int = MAX_TOOL_CALLS) -> None:
        self.max_tool_calls = max_tool_calls
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise CheckpointError(f"{path}: no tokenizer.json (the LLM stage detokenizes itself)")
        self.path = path
        self.tokenizer = Tokenizer.from_file(str(tok_file))
        self.template: ChatTemplate = load_chat_template(path)
        self.stop_ids = self._stop_ids(raw_config)
        self._json_ids: tuple[int, ...] | None = None

    def _stop_ids(self, raw_config: dict) -> tuple[int, ...]:
        eos = self.template.special_tokens.get("eos_token")
        ids = [self.tokenizer.token_to_id(eos)] if eos else []
        if not ids or ids[0] is None:
            raw = raw_config.get("eos_token_id")
            ids = list(raw) if isinstance(raw, list) else [raw]
        ids += [self.tokenizer.token_to_id(t) for t in EXTRA_STOP_TOKENS]
        out = tuple(dict.fromkeys(i for i in ids if isinstance(i, int)))
        if not out:
            raise CheckpointError(f"{self.path}: no eos token in tokenizer_config.json or config.json")
        return out

    @property
    def json_token_ids(self) -> tuple[int, ...]:
        """Ids of the vocabulary's tokens holding a brace or a backtick: never said (the speakable-text
        stage drops them), so a spoken reply that may not call is decoded without them and the model says
        a tool's result in words instead of writing JSON or a code fence (``bench tools``)."""
        if self._json_ids is None:
            vocab = self.tokenizer.get_vocab(with_added_tokens=False)
            self._json_ids = tuple(sorted(i for t, i in vocab.items() if any(c in t for c in "{}`")))
        return self._json_ids

    def messages(self, rid: str, opts: TurnOptions, transcript: str) -> list[dict]:
        """The chat of a turn: system prompt, history (``[role, text]`` pairs and function_call /
        function_call_output items, :mod:`~omniduplex.models.cascade.tool_prompt`), then the transcript as the
        user's message.

        Raises:
            ValueError: a history entry of neither form.
        """
        out = []
        if opts.system_prompt is not None:
            out.append({"role": "system", "content": opts.system_prompt})
        history = opts.history or []
        where = f"turn {rid}: history"
        out += chat_messages([history_item(i, item, where) for i, item in enumerate(history)])
        if transcript:  # "" for a typed turn, or a response after tool outputs
            out.append({"role": "user", "content": transcript})
        return out

    def tools(self, rid: str, opts: TurnOptions, messages: list[dict]) -> ToolSet:
        """The turn's :class:`ToolSet` (``tools``, ``tool_choice``), with no tool left to call once the
        turn has made :attr:`max_tool_calls` calls (the call loop is cut).

        Raises:
            ValueError: a bad tool or choice, naming the field (``turn 7: tools[1].parameters: ...``).
        """
        try:
            tools = tool_set(opts.tools, opts.tool_choice)
        except ValueError as e:
            raise ValueError(f"turn {rid}: {e}") from None
        if tools.active and calls_since_user(messages_items(messages)) >= self.max_tool_calls:
            return ToolSet(tools.tools, "none")
        return tools

    def hint_ids(self, rid: str, opts: TurnOptions, transcript: str) -> list[int]:
        """The prompt ids of a turn whose transcript so far is ``transcript`` that the finished turn's prompt
        will most likely start with: the chat rendered with that transcript, cut before the first token that
        changes when more words follow (BPE merges at the end of the text, the template's closing tokens).
        Empty when the transcript has no words.

        Raises:
            ValueError: as :meth:`messages`.
        """
        if not has_words(transcript):
            return []
        messages = self.messages(rid, opts, transcript)
        tools = self.tools(rid, opts, messages)
        ids = encode_chat(self.tokenizer, self.template, messages, tools=tools)
        longer = self.messages(rid, opts, transcript + _PROBE)
        other = encode_chat(self.tokenizer, self.template, longer, tools=tools)
        n = 0
        while n < min(len(ids), len(other)) and ids[n] == other[n]:
            n += 1
        return ids[:n]

    def sampling(self, rid: str, raw: dict | None) -> SamplingParams:
        """The turn's :class:`SamplingParams` from its ``sampling`` meta, with this model's stop ids added.

        Raises:
            ValueError: an unknown field or an invalid value.
        """
        sp = dict(raw or {})
        if "grammar" in sp:
            raise ValueError(f"turn {rid}: bad sampling parameters (grammar is set by the stage, from tools)")
        sp["stop_token_ids"] = tuple(dict.fromkeys((*sp.get("stop_token_ids", ()), *self.stop_ids)))
        sp["suppress_token_ids"] = tuple(sp.get("suppress_token_ids", ()))
        try:
            return SamplingParams(**sp)
        except TypeError as e:
            raise ValueError(f"turn {rid}: bad sampling parameters ({e})") from e

    def prepare(self, msg: StageMessage) -> ChatTurn | StageMessage:
        """A :class:`ChatTurn` for the engine, or, for a spoken turn without words, the one message that
        answers it (see the module docstring).

        Raises:
            ValueError: not a :class:`~omniduplex.pipeline.messages.Transcript`, malformed ``history`` or
                ``sampling``, or a template that rejects the chat.
        """
        rid, meta = msg.request_id, msg.meta
        if not isinstance(meta, Transcript):
            raise ValueError(f"turn {rid}: the LLM stage takes a Transcript, got {type(meta).__name__}")
        opts, transcript = meta.options, meta.transcript
        turn = handed_on(opts)
        if opts.say is not None:  # said as written, not generated: a call's filler or apology
            said = DecoderOutput(turn=turn, text=opts.say)
            return StageMessage(rid, {"token": torch.zeros(0, dtype=torch.int64)}, said, last=True)
        typed = opts.user_text is not None  # typed turns are answered even when empty
        if not typed and not has_words(transcript):
            skipped = DecoderOutput(turn=turn, text="", skipped="empty transcript")
            return StageMessage(rid, {"token": torch.zeros(0, dtype=torch.int64)}, skipped, last=True)
        sampling = self.sampling(rid, opts.sampling)
        messages = self.messages(rid, opts, transcript)
        tools = self.tools(rid, opts, messages)
        ids = encode_chat(self.tokenizer, self.template, messages, tools=tools)
        reply = {"speech": opts.spoken is not False, "calls": bool(tools.tools)}
        # a few sentences unless the user asked for more, each said whole (not for a fixed-length reply: a
        # benchmark's ``ignore_eos``)
        if reply["speech"] and not sampling.ignore_eos:
            reply["max_sentences"] = sentence_budget(transcript or _last_user_text(messages))
            reply.update(text_budget=sampling.max_tokens, finish_sentence=True)
            sampling = replace(sampling, max_tokens=sampling.max_tokens + SENTENCE_GRACE_TOKENS)
        gate = False
        if tools.active:  # the calls left to the turn, and their tokens beyond the text budget
            left = self.max_tool_calls - calls_since_user(messages_items(messages))
            gate = tools.choice == "auto" and left == self.max_tool_calls
            reply.update(max_calls=left, made=calls_made(messages), answered=answered_since_user(messages))
            if reply["speech"] and opts.call_filler:  # said as a server-run call opens (ReplyStream)
                here = frozenset(opts.call_filler_tools or ())
                every = {t.name for t in tools.tools} <= here  # then said at the opener, before the name
                reply.update(filler=opts.call_filler, filler_for=None if every else here)
            reply.setdefault("text_budget", sampling.max_tokens)
            sampling = replace(sampling, max_tokens=sampling.max_tokens + CALL_TOKENS * left)
        elif tools.tools:  # tool_choice none, or the call limit reached: no call
            reply["max_calls"] = 0
            banned = [t] if (t := self.tokenizer.token_to_id(CALL_OPEN)) is not None else []
            if reply["speech"]:  # words, not a call written as JSON text (a small model after a result)
                banned += self.json_token_ids
            sampling = replace(sampling, suppress_token_ids=(*sampling.suppress_token_ids, *banned))
        return ChatTurn(ids, sampling, turn, tools, reply, gate)


def handed_on(opts: TurnOptions) -> TurnOptions:
    """The turn's options the LLM stage hands on to the TTS stage: all but its own (``sampling``, ``tools``,
    ``tool_choice``)."""
    return opts.model_copy(update={"sampling": None, "tools": None, "tool_choice": None})


def _last_user_text(messages: list[dict]) -> str:
    return next((m.get("content") or "" for m in reversed(messages) if m.get("role") == "user"), "")


def calls_made(messages: list[dict]) -> set[tuple[str, str]]:
    """:func:`~.tool_calls.call_key` of the calls in ``messages`` after the last user message (the calls
    of the turn in progress: a continuation must not repeat them)."""
    out: set[tuple[str, str]] = set()
    for m in reversed(messages):
        if m.get("role") == "user":
            break
        for c in m.get("tool_calls") or ():
            fn = c.get("function", c)
            out.add(call_key(fn["name"], fn["arguments"]))
    return out


def messages_items(messages: list[dict]) -> list[dict]:
    """Chat messages as history items for :func:`~omniduplex.models.cascade.tool_prompt.calls_since_user`:
    each tool call of an assistant message counts as one ``function_call``."""
    out: list[dict] = []
    for m in messages:
        out.append(m)
        out += [{"type": "function_call"} for _ in m.get("tool_calls") or ()]
    return out
