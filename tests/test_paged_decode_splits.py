"""Split-KV of the Triton paged decode kernel sized from the real context lengths (issue 41):
:func:`choose_split_plan` (pure) and the kernel run with its plan, under the Triton interpreter on CPU
(compiled on a GPU with ``TRITON_INTERPRET=0``, as in ``test_paged_decode_triton.py``, whose case builder
and float64 reference this module shares).

Interpreter cost is per program and tile, so head dims are 16 (the shape does not matter for the split
logic) and plans are made for a few "SMs" (``NUM_SMS``): the same binary search as on a 132-SM GPU, at a
scale where a test takes seconds. Lengths cross the 16-token KV block, the 128-token tile of the default
head-16 config and the plan's split length.
"""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from test_paged_decode_triton import DEVICE, assert_matches, decode_case, run  # noqa: E402

from omniduplex.kernels.paged_attention_ref import write_kv_cache  # noqa: E402
from omniduplex.kernels.paged_decode_config import (  # noqa: E402
    PROGRAMS_PER_SM,
    choose_config,
    choose_split_plan,
    split_workspace_numel,
)

NUM_SMS = 4  # a plan for 16 resident programs per KV head's worth of work (see module docstring)
TILE = 128  # choose_config's block_n at head_dim 16 (any dtype, group <= 16)


@pytest.fixture(scope="module")
def decode():
    pytest.importorskip("triton")
    from test_paged_decode_triton import INTERPRET

    if DEVICE == "cpu" and not INTERPRET:
        pytest.skip("TRITON_INTERPRET is not 1 and there is no CUDA device")
    from omniduplex.kernels import paged_decode_attention as module

    return module.paged_decode_attention_triton


def planned(decode, case, num_sms=NUM_SMS, plan_lens=None, **kw):
    """Run ``case`` with the plan :func:`choose_split_plan` makes from ``plan_lens`` (default: the case's
    own lengths), as the launcher does from ``seq_lens_host`` on a ``num_sms`` GPU; returns (out, plan)."""
    num_kv_heads, head_dim = case["k_cache"].shape[2], case["q"].shape[2]
    group = case["q"].shape[1] // num_kv_heads
    assert choose_config(head_dim, group, case["q"].dtype, None).block_n == TILE
    lens = case["seq_lens"].tolist() if plan_lens is None else plan_lens
    num_splits, split_len = choose_split_plan(lens, num_kv_heads, TILE, num_sms)
    extra = dict(split_len=split_len) if split_len else {}
    return run(decode, case, num_splits=num_splits, **extra, **kw), (num_splits, split_len)


def test_plan_h100_examples():
    """The docstring's figures: 132 SMs, 8 KV heads, 64-token tiles (bf16 x 128)."""
    assert choose_split_plan([4096], 8, 64, 132) == (64, 64)  # one tile a split, 512 programs
    assert choose_split_plan([4096] * 8, 8, 64, 132) == (8, 512)
    assert choose_split_plan([1024] * 32, 8, 64, 132) == (2, 512)
    assert choose_split_plan([4096] * 64, 8, 64, 132) == (1, 0)  # the batch fills the wave alone
    # ragged: the long sequence gets 32 splits of 2 tiles, each short one a single split
    assert choose_split_plan([4096] + [100] * 7, 8, 64, 132) == (32, 128)
    assert choose_split_plan([4096], 8, 64, 132, max_splits=16) == (16, 256)
    assert choose_split_plan([64, 1, 0], 8, 64, 132) == (1, 0)  # nothing longer than a tile
    assert choose_split_plan([0, -1], 8, 64, 132) == (1, 0)
    assert choose_split_plan([], 8, 64, 132) == (1, 0)


@settings(max_examples=60, deadline=None)
@given(
    lens=st.lists(st.integers(-1, 9000), min_size=1, max_size=40),
    num_kv_heads=st.sampled_from([1, 2, 4, 8]),
    block_n=st.sampled_from([32, 64, 128]),
    num_sms=st.sampled_from([4, 108, 132]),
    max_splits=st.sampled_from([8, 64]),
)
def test_plan_is_the_smallest_split_within_one_wave(lens, num_kv_heads, block_n, num_sms, max_splits):
    num_splits, split_len = choose_split_plan(lens, num_kv_heads, block_n, num_sms, max_splits)
    tiles = [max(0, -(-n // block_n)) for n in lens]
    budget = PROGRAMS_PER_SM * num_sms // num_kv_heads
    if num_splits == 1:
        assert split_len == 0
        longest = max(tiles)  # no split: even the largest split length short of the longest overflows
        assert longest <= 1 or len(lens) >= budget or sum(-(-n // (longest - 1)) for n in tiles) > budget
        return
    assert split_len % block_n == 0 and 1 < num_splits <= max_splits
    per = split_len // block_n
    assert num_splits == -(-max(tiles) // per)  # the grid covers the longest sequence exactly
    assert sum(-(-n // per) for n in tiles) <= budget  # used programs within one resident wave
    if per > 1:  # one tile less per split would overflow the wave or max_splits
        fewer = per - 1
        assert sum(-(-n // fewer) for n in tiles) > budget or -(-max(tiles) // fewer) > max_splits


LONG = [4096, 1, 255, 256, 257]  # a long sequence beside lengths at the 256-token split edge


@pytest.mark.parametrize(
    "lens,num_kv_heads,ratio,dtype",
    [
        (LONG, 1, 1, torch.float32),
        ([4095, 129], 2, 4, torch.float16),
        ([1, 15, 16, 17, 127, 128, 129, 600], 1, 8, torch.bfloat16),
        ([2049], 1, 2, torch.bfloat16),
    ],
)
def test_ragged_lengths_with_the_plan(decode, lens, num_kv_heads, ratio, dtype):
    """Every dtype and GQA ratio 1/2/4/8 through the plan's fixed split length, lengths crossing block,
    tile and split edges (ragged batches are where the plan differs from the bound's even cut)."""
    case = decode_case(lens, num_kv_heads * ratio, num_kv_heads, 16, dtype, seed=len(lens) + ratio)
    out, (num_splits, split_len) = planned(decode, case)
    assert num_splits > 1 and split_len > 0  # the split path ran
    assert_matches(out, case)


@pytest.mark.parametrize("batch", [1, 2, 8, 33])
def test_batch_sizes(decode, batch):
    """Batch 1, 2, 8 and 33 (the last past the wave: a single pass), random ragged lengths 1..1100."""
    lens = torch.randint(1, 1100, (batch,), generator=torch.Generator().manual_seed(batch)).tolist()
    case = decode_case(lens, 4, 2, 16, torch.float16, seed=batch)
    out, (num_splits, _) = planned(decode, case, num_sms=8 if batch < 33 else 4)
    assert (num_splits > 1) == (batch < 33)
    assert_matches(out, case)


def test_plan_of_other_lengths_is_still_exact(decode):
    """A plan made for short lengths (a CUDA graph captured at one step, replayed at a later one): the
    longer sequences' tiles are cut evenly over the grid's splits on the device, never dropped."""
    case = decode_case([1500, 700, 3], 2, 1, 16, torch.float32, seed=21)
    out, plan = planned(decode, case, plan_lens=[300, 200, 3])
    assert plan == (3, 128)  # 3 splits of one tile: far too few for 1500 tokens at that length
    assert_matches(out, case)


def test_padded_and_single_splits_store_nothing(decode):
    """Splits past a sequence's used count store no partials, and a sequence with one used split writes
    its output directly (no partials either): the NaN-poisoned workspace keeps its NaN there."""
    lens = [1000, 100, 0]
    case = decode_case(lens, 2, 1, 16, torch.float32, seed=22)
    num_splits, split_len = 8, 256  # the 1000-token row uses 4 splits, the others 1
    ws = torch.full((split_workspace_numel(3, 2, num_splits, 16),), float("nan"), device=DEVICE)
    out = run(decode, case, num_splits=num_splits, split_len=split_len, workspace=ws)
    assert_matches(out, case)
    parts = 3 * 2 * num_splits
    part_m = ws[parts * 16 : parts * 17].view(3, 2, num_splits).cpu()
    assert torch.isfinite(part_m[0, :, :4]).all() and torch.isnan(part_m[0, :, 4:]).all()
    assert torch.isnan(part_m[1:]).all()
    assert torch.isnan(ws[: parts * 16].view(3, 2, num_splits, 16)[1:].cpu()).all()


def test_cuda_graph_padding_rows(decode):
    """Rows padded into a CUDA-graph bucket the engine's way: slot -1 (no KV write), one cached token read
    from block 0, beside real rows split by the plan: real rows exact, padding rows finite."""
    case = decode_case([900, 130, 5], 4, 2, 16, torch.bfloat16, seed=23)
    k_new = torch.full((2, 2, 16), 7.0, dtype=torch.bfloat16, device=DEVICE)
    before = case["k_cache"].clone()
    write_kv_cache(case["k_cache"], case["v_cache"], k_new, k_new, torch.tensor([-1, -1], device=DEVICE))
    assert torch.equal(case["k_cache"], before)  # slot -1 writes nothing
    pad = 2
    for name in ("q", "block_tables"):
        case[name] = torch.cat([case[name], case[name][:pad].clone()])
    case["block_tables"][-pad:] = 0
    case["seq_lens"] = torch.cat([case["seq_lens"], torch.ones(pad, dtype=torch.int32, device=DEVICE)])
    out, (num_splits, _) = planned(decode, case)
    assert num_splits > 1
    assert torch.isfinite(out[-pad:].float()).all()
    assert_matches(out, case)  # the padding rows too: attention over block 0's first row


def test_seq_lens_host_plan_through_the_launcher(decode):
    """``seq_lens_host`` (a CPU tensor or ints) plans the launch on this device; a length count that does
    not match the batch is refused; a split length off the tile is refused."""
    case = decode_case([700, 3, 64], 4, 2, 16, torch.float16, seed=24)
    for host in (case["seq_lens"].cpu(), [700, 3, 64]):
        assert_matches(run(decode, case, seq_lens_host=host), case)
    with pytest.raises(ValueError, match="seq_lens_host"):
        decode(**case, seq_lens_host=[700, 3])
    with pytest.raises(ValueError, match="split_len"):
        decode(**case, num_splits=2, split_len=TILE + 16)


@settings(max_examples=8, deadline=None)
@given(
    seq_lens=st.lists(st.integers(0, 700), min_size=1, max_size=5),
    ratio=st.sampled_from([1, 2, 4, 8]),
    num_splits=st.integers(1, 6),
    split_tiles=st.integers(1, 3),
    dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]),
    seed=st.integers(0, 2**16),
)
def test_random_split_lengths(decode, seq_lens, ratio, num_splits, split_tiles, dtype, seed):
    """Any grid of splits and any split length, whether it covers the batch (padded splits) or not (the
    device stretches the split): exact."""
    case = decode_case(seq_lens, ratio, 1, 16, dtype, seed)
    assert_matches(run(decode, case, num_splits=num_splits, split_len=split_tiles * TILE), case)
