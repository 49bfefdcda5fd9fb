"""The Piper voice split at its decoder (real en_US joe voice): pieces decoded with context are the
whole-sentence audio, the first piece is short, and a graph that cannot be split is spoken whole."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from omniduplex.models.cascade.piper_stream import (
    CONTEXT_FRAMES,
    DECODER_NODE,
    FIRST_PIECE_FRAMES,
    PIECE_FRAMES,
    SplitVoice,
)
from omniduplex.models.cascade.tts import PiperTTS
from omniduplex.models.weights import PIPER_JOE, PIPER_JOE_CONFIG, locate

TEXT = "1. Boil water in a kettle. Then pour it slowly over the tea leaves and wait for three minutes."
HOP = 256  # joe medium: samples per latent frame at 22.05 kHz


def quiet(tts: PiperTTS) -> PiperTTS:
    """No sampling noise (noise and noise_w scales 0): the same text gives the same audio every call."""
    tts.scales = np.array([0.0, tts.scales[1], 0.0], np.float32)
    return tts


@pytest.fixture(scope="module")
def tts() -> PiperTTS:
    return quiet(PiperTTS(locate(PIPER_JOE), locate(PIPER_JOE_CONFIG), threads=1))


def test_pieces_join_into_the_whole_sentences(tts):
    assert tts.split is not None
    whole = tts.synthesize(TEXT)
    pieces = list(tts.stream(TEXT))
    assert [p.last for p in pieces] == [False] * (len(pieces) - 1) + [True]
    assert pieces[0].pcm.size == FIRST_PIECE_FRAMES * HOP or pieces[0].last
    assert all(p.pcm.size <= PIECE_FRAMES * HOP for p in pieces)
    joined = np.concatenate([p.pcm for p in pieces])
    assert joined.dtype == np.float32 and joined.size == whole.size
    np.testing.assert_allclose(joined, whole, atol=1e-5)
    assert np.abs(whole).max() > 0.05


def test_window_decode_with_context_equals_the_whole_decode(tts):
    """On sampled latents (noise on): every window decoded with CONTEXT_FRAMES each side is the whole
    decode's samples there; with no context it is not (the context is needed, not decorative)."""
    tts.scales[0], tts.scales[2] = 0.667, 0.8
    try:
        (args,) = [tts._inputs(ph) for ph in tts.voice.phonemize("The capital of France is Paris.")]
        split = tts.split
        z = split.latents(args)
        frames = z.shape[2]
        assert frames > 3 * CONTEXT_FRAMES
        whole = split.decode(z, 0, frames, args)
        assert whole.size == frames * HOP
        for start, end in [(0, 24), (24, 70), (70, frames), (5, 6)]:
            np.testing.assert_allclose(
                split.decode(z, start, end, args), whole[start * HOP : end * HOP], atol=1e-4
            )
        bare = split.decoder.run(None, {split.z_name: np.ascontiguousarray(z[:, :, 24:70])})[0].reshape(-1)
        assert np.abs(bare - whole[24 * HOP : 70 * HOP]).max() > 1e-3
    finally:
        quiet(tts)


def test_nothing_to_pronounce_is_one_empty_last_piece(tts):
    (p,) = list(tts.stream("..."))
    assert p.last and p.pcm.size == 0
    assert tts.synthesize("").size == 0


def test_a_graph_that_cannot_be_split_is_spoken_whole(tmp_path, tts):
    model = onnx.load(str(locate(PIPER_JOE)))
    for node in model.graph.node:
        if node.name == DECODER_NODE:
            node.name = "renamed"
    with pytest.raises(ValueError, match="not a Piper VITS graph"):
        SplitVoice(model, None)
    path = tmp_path / "voice.onnx"
    onnx.save(model, str(path))
    whole = quiet(PiperTTS(path, locate(PIPER_JOE_CONFIG), threads=1))
    assert whole.split is None
    pieces = list(whole.stream(TEXT))
    assert len(pieces) == len(tts.voice.phonemize(TEXT)) == 3 and pieces[-1].last  # one per sentence
    np.testing.assert_allclose(np.concatenate([p.pcm for p in pieces]), tts.synthesize(TEXT), atol=1e-5)
