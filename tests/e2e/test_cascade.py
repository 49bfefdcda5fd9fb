"""The default graph end to end: Moonshine ASR → SmolLM2 on our engine → Piper TTS, on the packaged real
weights, in three stage processes joined by the relay. The assistant hears, answers and speaks for real."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest
import soxr
from speech import wer, words_of

from omniduplex.app.host.pipeline import CASCADE_SYSTEM_PROMPT, default_model, new_orchestrator
from omniduplex.models.cascade.moonshine import MoonshineASR
from omniduplex.models.cascade.tts import PiperTTS
from omniduplex.models.weights import PIPER_JOE, PIPER_JOE_CONFIG, locate, locate_moonshine_base
from omniduplex.pipeline.audio_io import load_audio
from omniduplex.pipeline.config import load_graph
from omniduplex.pipeline.messages import TurnOptions

pytestmark = pytest.mark.slow
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
QUESTION = EXAMPLES / "question.wav"  # "... what the weather will be like tomorrow in Paris?"
GREEN_TEA = EXAMPLES / "green_tea.wav"  # "How do I make a cup of green tea?" (the README's first command)
GREEDY = {"max_tokens": 40, "temperature": 0.0}


@pytest.fixture(scope="module")
def orch():
    """The default cascade in stage processes, shared by the module's tests (one event loop per test)."""
    pcfg = load_graph(None)
    pcfg.model = str(default_model())
    o = new_orchestrator(pcfg, processes=True)
    yield o  # started by the first test (the orchestrator binds to a running event loop)
    if o.loop is not None:
        o.backend.stop()


async def turn(o, wav: np.ndarray, history=(), **meta) -> dict:
    """One turn; returns its transcript, reply text, aligned chunk texts, pcm (24 kHz) and metrics."""
    rid = o.submit(
        wav,
        TurnOptions(sampling=GREEDY, system_prompt=CASCADE_SYSTEM_PROMPT, history=list(history), **meta),
    )
    out = {"transcript": None, "text": "", "chunks": [], "pcm": [], "metrics": None, "error": None}
    async for ev in o.events(rid):
        if ev.kind == "transcript":
            out["transcript"] = ev.text
        elif ev.kind == "text":
            out["text"] += ev.text
        elif ev.kind == "audio":
            out["pcm"].append(ev.pcm)
            out["chunks"].append(ev.text)
        elif ev.kind == "done":
            out["metrics"] = ev.metrics
        else:
            out["error"] = ev.error
    out["pcm"] = np.concatenate(out["pcm"]) if out["pcm"] else np.zeros(0, np.float32)
    return out


def run(o, coro_fn):
    """Start the orchestrator's backend once, then run ``coro_fn(o)`` on a fresh event loop."""

    async def main():
        if o.loop is None:
            await o.start()
        o.loop = asyncio.get_running_loop()
        return await coro_fn(o)

    return asyncio.run(main())


@pytest.fixture(scope="module")
def asr():
    """The listener of the intelligibility round trip: Moonshine base (the default ASR; Whisper tiny.en
    mishears Piper's clause-by-clause speech more often, e.g. "in" as "and")."""
    return MoonshineASR(locate_moonshine_base())


def test_spoken_question_is_heard_answered_and_spoken_intelligibly(orch, asr):
    r = run(orch, lambda o: turn(o, load_audio(GREEN_TEA)))
    assert r["error"] is None
    heard = words_of(r["transcript"])
    assert {"make", "cup", "green", "tea"} <= set(heard)
    assert len(words_of(r["text"])) >= 4, r["text"]  # a reply in real words
    # every spoken clause is part of the reply text, in order (the TTS alignment)
    spoken = " ".join(c for c in r["chunks"] if c)
    assert words_of(spoken) == words_of(r["text"])[: len(words_of(spoken))] and spoken
    audio_s = r["pcm"].size / 24000
    assert audio_s > 1.0 and abs(r["metrics"]["audio_s"] - audio_s) < 1e-6
    # intelligibility round trip: the reply audio, transcribed by the ASR model, matches its text. The greedy
    # reply differs between CPUs (an AVX-512 build sums in another order); a list reply ("1. Boil the green
    # tea ...") is heard as "One oil the green tea": Piper's "one. Boil" runs together, so up to 15% of the
    # words may be misheard (garbled or misaligned audio scores far above that)
    back = asr.transcribe(soxr.resample(r["pcm"], 24000, 16000).astype(np.float32)).text
    assert wer(spoken, back) <= 0.15, (spoken, back)
    m = r["metrics"]
    assert 0 < m["ttfp_ms"] <= m["e2el_ms"]
    split_keys = {"asr_ms", "llm_first_token_ms", "llm_first_clause_ms", "tts_wait_ms", "tts_first_chunk_ms"}
    assert split_keys <= set(m)
    assert m["llm_first_token_ms"] <= m["llm_first_clause_ms"] + m["tts_wait_ms"] + m["tts_first_chunk_ms"]
    split = orch.ttfp_splits[-1]  # what bench phone reads: the same split, taken at the first audio
    assert split["ttfp_ms"] == pytest.approx(m["ttfp_ms"]) and split["asr_ms"] == m["asr_ms"]


def piper_16k(text: str) -> np.ndarray:
    """``text`` spoken by the packaged Piper voice, at 16 kHz (clearer than espeak-ng for names)."""
    tts = PiperTTS(locate(PIPER_JOE), locate(PIPER_JOE_CONFIG))
    pcm = tts.synthesize(text)
    silence = np.zeros(8000, np.float32)
    return np.concatenate([silence, soxr.resample(pcm, tts.sample_rate, 16000).astype(np.float32), silence])


def test_second_turn_uses_the_first_turns_transcript(orch):
    # (a 135M model: "what is my name?" defeats it; the dog's name it carries over. "What is my dog called?"
    # is a near-tie for it: a 1-ulp change of RMSNorm flips its greedy reply to "I'm not a dog-specific AI")
    first = piper_16k("I have a dog called Max.")
    second = piper_16k("What is the name of my dog?")

    async def two_turns(o):
        r1 = await turn(o, first)
        history = [["user", r1["transcript"]], ["assistant", r1["text"]]]
        r2 = await turn(o, second, history)
        return r1, r2

    r1, r2 = run(orch, two_turns)
    assert {"dog", "max"} <= set(words_of(r1["transcript"]))
    assert {"what", "dog"} <= set(words_of(r2["transcript"]))
    assert "max" in words_of(r2["text"]), r2["text"]  # the reply draws on the first turn


def test_silence_gets_no_reply_and_a_typed_turn_gets_a_spoken_one(orch):
    async def both(o):
        quiet = await turn(o, np.zeros(16000 * 2, np.float32))
        typed = await turn(o, np.zeros(0, np.float32), user_text="Say hello to me.")
        return quiet, typed

    quiet, typed = run(orch, both)
    assert quiet["error"] is None and quiet["transcript"] == "" and quiet["text"] == ""
    assert quiet["pcm"].size == 0 and quiet["metrics"]["audio_s"] == 0
    assert typed["transcript"] == "Say hello to me." and typed["pcm"].size > 24000 // 2
    assert "hello" in words_of(typed["text"]), typed["text"]


def test_cancel_mid_reply_ends_the_turn_in_every_stage(orch):
    async def cancel(o):
        rid = o.submit(
            load_audio(QUESTION),
            TurnOptions(sampling={"max_tokens": 200, "temperature": 0.0, "ignore_eos": True}, history=[]),
        )
        kinds = []
        async for ev in o.events(rid):
            kinds.append(ev.kind)
            if ev.kind == "audio" and kinds.count("audio") == 1:
                o.cancel(rid)
        for _ in range(100):  # the backend thread forgets the turn and tells every stage to abort it
            if not o.backend.inflight:
                break
            await asyncio.sleep(0.05)
        forgotten = not o.backend.inflight
        # the next turn runs normally on the same stages, and hears its question
        after = await turn(o, load_audio(GREEN_TEA))
        return kinds, forgotten, after

    kinds, forgotten, after = run(orch, cancel)
    assert kinds[-1] == "error" and "done" not in kinds and forgotten
    assert after["error"] is None and after["pcm"].size > 0
    assert {"make", "cup", "green", "tea"} <= set(words_of(after["transcript"]))

