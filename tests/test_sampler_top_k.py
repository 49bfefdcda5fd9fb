"""The sampler's top-k draw (every row keeps at most vocab/4 ids) picks the same ids as the full-vocabulary
draw: the same candidates, nucleus and per-id noise, without sorting the vocabulary."""

from __future__ import annotations

import torch

from omniduplex.pipeline.engine import sampler as S


def _full_draw(logits: torch.Tensor, b: S.SamplingBatch) -> torch.Tensor:
    scaled = S._top_k_top_p(logits / b.temperature[:, None], b.top_k, b.top_p)
    u = S.counter_uniform(b.seeds, b.counters, logits.shape[-1])
    return (scaled.double() - torch.log(-torch.log(u))).argmax(dim=-1)


def test_top_k_draw_equals_full_draw():
    g = torch.Generator().manual_seed(0)
    rows, vocab = 8, 2048
    for trial in range(100):
        logits = torch.randn(rows, vocab, generator=g) * (1 + trial % 5)  # flat to peaked
        b = S.SamplingBatch(
            temperature=torch.full((rows,), 0.9),
            top_k=torch.randint(1, 100, (rows,), generator=g),
            top_p=torch.rand(rows, generator=g) * 0.9 + 0.1,
            repetition_penalty=torch.ones(rows),
            seeds=torch.randint(0, 1 << 40, (rows,), generator=g),
            counters=torch.randint(0, 1000, (rows,), generator=g),
        )
        assert int(b.top_k.max()) <= vocab // S.TOP_K_FAST_FRACTION  # the fast path is taken
        assert torch.equal(S.sample(logits, b), _full_draw(logits, b)), trial


def test_top_k_draw_keeps_greedy_rows_and_noise_by_index():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(3, 512, generator=g)
    b = S.SamplingBatch(
        temperature=torch.tensor([0.0, 1.0, 1.0]),
        top_k=torch.tensor([5, 5, 1]),
        top_p=torch.ones(3),
        repetition_penalty=torch.ones(3),
        seeds=torch.tensor([1, 2, 3]),
        counters=torch.tensor([7, 7, 7]),
    )
    out = S.sample(logits, b)
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()  # greedy row; top_k=1 row
    assert out[1] in logits[1].topk(5).indices
    idx = torch.tensor([[3, 400], [0, 511], [9, 9]])
    full = S.counter_uniform(b.seeds, b.counters, 512)
    assert torch.equal(S.counter_uniform(b.seeds, b.counters, 2, idx), full.gather(1, idx))
