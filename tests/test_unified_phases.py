"""Phase rules of the unified LM on crafted logits (no model): transitions, masks, delay, CFG merge."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from omniduplex.models.unified.delay_pattern import deinterleave, validity_mask
from omniduplex.models.unified.model import UnifiedConfig
from omniduplex.models.unified.phases import (
    AUDIO,
    DONE,
    DRAIN,
    TEXT,
    TRANSITION,
    PhaseState,
    PhaseTables,
    cfg_active,
    decode_step,
    merge_cfg,
)
from omniduplex.models.unified.presets import unified_config

CFG = UnifiedConfig.from_dict(unified_config("tiny"))  # S=4, text 288, 66 ids per stream
T = PhaseTables.from_config(CFG)
S, V = CFG.num_streams, CFG.vocab_size
OFF = [CFG.stream_offset(i) for i in range(S)]
PAD = [CFG.audio_pad_id(i) for i in range(S)]
EOS0 = CFG.audio_eos_id(0)
BRIDGE = CFG.bridge_token_ids


def _logits(targets: list[int | None]) -> torch.Tensor:
    """``[1, S, V]`` zeros with +10 at each stream's target id (``None``: flat)."""
    x = torch.zeros(1, S, V)
    for i, t in enumerate(targets):
        if t is not None:
            x[0, i, t] = 10.0
    return x


def _run(state: PhaseState, script: list[list[int | None]]):
    phases, tokens = [], []
    for targets in script:
        res = decode_step(state, _logits(targets), T)
        phases.append(int(res.step.phase))
        tokens.append(res.tokens[0].tolist())
        state = res.state
    return phases, tokens, state


def test_full_turn_text_bridge_audio_drain():
    state = PhaseState.initial(1, max_text_tokens=10, max_audio_frames=10)
    script = [
        [104, None, None, None],  # text 'h'
        [OFF[2] + 5, None, None, None],  # argmax in an audio region (any stream) → transition
        [104, None, None, None],  # bridge 1 is forced whatever the logits say
        *[[OFF[i] + 10 * (f + 1) + i for i in range(S)] for f in range(3)],  # frames 0..2
        [EOS0, *[OFF[i] + 40 + i for i in range(1, S)]],  # stream-0 EOS → drain
        [None, *[OFF[i] + 50 + i for i in range(1, S)]],
        [None, *[OFF[i] + 60 + i for i in range(1, S)]],
    ]
    phases, tokens, state = _run(state, script)
    assert phases == [TEXT, TRANSITION, TRANSITION, AUDIO, AUDIO, AUDIO, DRAIN, DRAIN, DRAIN]
    assert int(state.phase) == DONE and int(state.frames) == 3
    assert tokens[:3] == [[104, -1, -1, -1], [BRIDGE[0], -1, -1, -1], [BRIDGE[1], -1, -1, -1]]
    assert tokens[3:] == [
        [OFF[0] + 10, PAD[1], PAD[2], PAD[3]],
        [OFF[0] + 20, OFF[1] + 21, PAD[2], PAD[3]],
        [OFF[0] + 30, OFF[1] + 31, OFF[2] + 32, PAD[3]],
        [EOS0, OFF[1] + 41, OFF[2] + 42, OFF[3] + 43],
        [PAD[0], PAD[1], OFF[2] + 52, OFF[3] + 53],
        [PAD[0], PAD[1], PAD[2], OFF[3] + 63],
    ]
    local = torch.tensor(tokens[3:]).T - torch.tensor(OFF)[:, None]
    assert deinterleave(local).tolist() == [[10, 20, 30], [21, 31, 41], [32, 42, 52], [43, 53, 63]]


def test_short_clip_keeps_the_leading_delay_during_drain():
    # F = 1 < S − 1: at drain step k stream i is real iff k < i and F + k >= i
    state = PhaseState.initial(1, 0, 10)
    script = [[None] * S, [None] * S, [OFF[i] + 7 for i in range(S)]] + [
        [EOS0] + [OFF[i] + 9 for i in range(1, S)]
    ] * 3
    phases, tokens, _ = _run(state, script)
    assert phases == [TRANSITION, TRANSITION, AUDIO, DRAIN, DRAIN, DRAIN]
    assert tokens[3:] == [
        [EOS0, OFF[1] + 9, PAD[2], PAD[3]],
        [PAD[0], PAD[1], OFF[2] + 9, PAD[3]],
        [PAD[0], PAD[1], PAD[2], OFF[3] + 9],
    ]
    audio = torch.tensor(tokens[2:])
    real = audio != torch.tensor(PAD)[None]
    real[:, 0] &= audio[:, 0] != EOS0
    assert torch.equal(real.T, validity_mask(1, S))


def test_text_eos_ends_without_audio_and_masks_hold():
    state = PhaseState.initial(1, 10, 10)
    phases, tokens, state = _run(state, [[CFG.bos_token_id] + [None] * 3, [CFG.eos_token_id] + [None] * 3])
    # bos is forced-only: never sampled, yet not a trigger either
    assert phases == [TEXT, TEXT] and tokens[0][0] not in (CFG.bos_token_id, CFG.null_prompt_id)
    assert tokens[1] == [CFG.eos_token_id, -1, -1, -1] and int(state.phase) == DONE
    # a DONE request emits nothing
    res = decode_step(state, _logits([104] * S), T)
    assert res.tokens.tolist() == [[-1] * S] and int(res.state.phase) == DONE


def test_speech_start_triggers_and_budgets_force():
    _, _, st_ = _run(PhaseState.initial(1, 10, 10), [[CFG.speech_start_token_id] + [None] * 3])
    assert int(st_.phase) == TRANSITION
    phases, _, _ = _run(PhaseState.initial(1, 2, 10), [[104] + [None] * 3] * 3)
    assert phases == [TEXT, TEXT, TRANSITION]  # max_text_tokens forces the transition
    # in AUDIO a text argmax is not a stop signal; the frame budget is
    state = PhaseState.initial(1, 0, 2)
    phases, tokens, _ = _run(state, [[104] * S] * 6)
    assert phases == [TRANSITION, TRANSITION, AUDIO, AUDIO, DRAIN, DRAIN]
    assert tokens[2][0] == OFF[0]  # masked argmax over stream 0's codebook (all tied → first code)
    assert tokens[4][0] == EOS0  # forced EOS at the budget


def test_single_stream_has_no_drain():
    d = unified_config("tiny")
    d.update(num_streams=1, vocab_size=288 + 66)
    d["codec_config"]["n_codebooks"] = 1
    cfg = UnifiedConfig.from_dict(d)
    tables = PhaseTables.from_config(cfg)
    state = PhaseState.initial(1, 0, 5)
    for _ in range(3):
        res = decode_step(state, torch.zeros(1, 1, cfg.vocab_size), tables)
        state = res.state
    assert int(state.phase) == AUDIO and int(state.frames) == 1
    x = torch.zeros(1, 1, cfg.vocab_size)
    x[0, 0, cfg.audio_eos_id(0)] = 1.0
    res = decode_step(state, x, tables)
    assert int(res.step.phase) == DONE and res.tokens.tolist() == [[-1]]


def test_cfg_merge_only_where_active():
    cond, uncond = torch.randn(3, S, V), torch.randn(3, S, V)
    state = PhaseState.initial(3, 5, 5).replace(phase=torch.tensor([TEXT, AUDIO, DRAIN]))
    active = cfg_active(state)
    assert active.tolist() == [False, True, True]
    out = merge_cfg(cond, uncond, 3.0, active)
    torch.testing.assert_close(out[0], cond[0])
    torch.testing.assert_close(out[1:], 3.0 * cond[1:] - 2.0 * uncond[1:])


def test_batched_step_equals_per_request():
    g = torch.Generator().manual_seed(0)
    b = 32
    state = PhaseState(
        phase=torch.randint(0, 5, (b,), generator=g),
        count=torch.randint(0, 4, (b,), generator=g),
        frames=torch.randint(0, 6, (b,), generator=g),
        max_text=torch.randint(0, 5, (b,), generator=g),
        max_frames=torch.randint(0, 6, (b,), generator=g),
    )
    # keep counts inside each phase's range
    state.count = torch.where(state.phase == TRANSITION, state.count % len(BRIDGE), state.count)
    state.count = torch.where(state.phase == DRAIN, state.count % (S - 1), state.count)
    logits = torch.randn(b, S, V, generator=g)
    logits[: b // 2, 0, EOS0] += 10  # half of them see an audio EOS argmax
    res = decode_step(state, logits, T)
    for r in range(b):
        one = PhaseState(**{k: v[r : r + 1] for k, v in dataclasses.asdict(state).items()})
        single = decode_step(one, logits[r : r + 1], T)
        assert torch.equal(single.tokens[0], res.tokens[r])
        for k, v in dataclasses.asdict(single.state).items():
            assert torch.equal(v[0], getattr(res.state, k)[r]), k


@settings(max_examples=40, deadline=None)
@given(
    script=st.lists(
        st.sampled_from(["text", "audio", "speech", "eos_text", "eos_audio", "code"]), min_size=1, max_size=40
    ),
    max_text=st.integers(0, 6),
    max_frames=st.integers(0, 8),
)
def test_any_script_yields_text_then_complete_codes(script, max_text, max_frames):
    ids = {
        "text": 104,
        "audio": OFF[1] + 3,
        "speech": CFG.speech_start_token_id,
        "eos_text": CFG.eos_token_id,
        "eos_audio": EOS0,
        "code": OFF[0] + 11,
    }
    state = PhaseState.initial(1, max_text, max_frames)
    phases, tokens = [], []
    for k in range(len(script) + max_text + max_frames + 8):  # enough steps to always finish
        if int(state.phase) == DONE:
            break
        res = decode_step(
            state, _logits([ids[script[k % len(script)]]] + [OFF[i] + 1 for i in range(1, S)]), T
        )
        phases.append(int(res.step.phase))
        tokens.append(res.tokens[0])
        state = res.state
    assert int(state.phase) == DONE
    assert phases == sorted(phases)  # TEXT* TRANSITION* AUDIO* DRAIN*
    n_text = phases.count(TEXT)
    assert n_text <= max_text + 1
    if TRANSITION in phases:
        f = phases.count(AUDIO)
        assert phases.count(TRANSITION) == len(BRIDGE) and phases.count(DRAIN) == S - 1 and f <= max_frames
        audio = torch.stack(tokens[n_text + len(BRIDGE) :]).T  # [S, F + S − 1]
        is_code = (audio >= torch.tensor(OFF)[:, None]) & (
            audio < torch.tensor(OFF)[:, None] + CFG.codebook_size
        )
        assert torch.equal(is_code, validity_mask(f, S))
    else:
        assert tokens[-1][0] == CFG.eos_token_id


@pytest.mark.parametrize("phase", [TEXT, TRANSITION, AUDIO, DRAIN, DONE])
def test_phase_tables_shape(phase):
    assert T.allowed.shape == (5, S, V)
    assert (
        T.sampled[phase].tolist()
        == {
            TEXT: [True, False, False, False],
            TRANSITION: [False] * S,
            AUDIO: [True] * S,
            DRAIN: [False, True, True, True],
            DONE: [False] * S,
        }[phase]
    )
    # sampling never produces a pad, an EOS, a bridge or the null prompt
    forbidden = PAD + [EOS0, *BRIDGE, CFG.null_prompt_id, CFG.bos_token_id]
    assert not T.allowed[phase][:, forbidden].any()
