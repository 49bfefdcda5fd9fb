"""Device-check part ``real_shapes`` (issue 41): each real-size preset built on the GPU, one short decode.

``python3 scripts/device_real.py --json PATH [--depth N] [--device cuda]``: for Qwen3-0.6B, Qwen2.5-7B,
Qwen3-TTS-12Hz-1.7B and Qwen3-Omni-30B-A3B (bf16, random weights built on the device from the config, no
checkpoint): build seconds, GPU memory allocated after the build (GiB), and for the text LMs and the Thinker
our engine's tok/s at c = 1 and 32 (16 new tokens, greedy; eager, a first look: ``bench engine`` measures
properly). ``--fp8``: Qwen3-Omni once more with the Thinker's LM in e4m3 (``kernels/fp8_linear.py``:
``torch._scaled_mm``, eager), its memory and tok/s beside bf16's. The JSON is rewritten after every preset,
so a run cut short keeps what it measured. Without CUDA
(and no ``--device cpu``) it exits 3 with one line; ``--device cpu --depth 1`` is the dry run of every path.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import tempfile
import time
from pathlib import Path

import torch

ORDER = ("qwen3-0.6b", "qwen3-tts-12hz-1.7b", "qwen2.5-7b", "qwen3-omni-30b-a3b")


def _tok_s(lm, c: int, device: torch.device, new: int = 16, graphs: str = "auto") -> float:
    from omniduplex.pipeline.engine.adapters import DecoderLMAdapter
    from omniduplex.pipeline.engine.engine import Engine
    from omniduplex.pipeline.engine.request import Request, SamplingParams

    engine = Engine(
        DecoderLMAdapter(lm),
        num_blocks=c * 4 + 8,
        max_num_seqs=c,
        dtype=torch.bfloat16,
        device=device,
        graphs=graphs,
    )
    sp = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True)
    for i in range(c):
        engine.add_request(Request(f"r{i}", [1 + i, 2, 3, 4], sp))
    n, t0 = 0, time.perf_counter()
    with torch.inference_mode():
        while engine.has_unfinished():
            n += sum(len(o.new_token_ids) for o in engine.step())
    return n / (time.perf_counter() - t0)


def one(name: str, depth: int | None, device: torch.device, work: Path, fp8: bool = False) -> dict:
    """Build ``name`` on ``device`` (bf16; ``fp8``: its Thinker's LM then converted to e4m3) and run its LM;
    the row of the JSON."""
    from omniduplex.models.qwen3_tts.model import load_qwen3_tts
    from omniduplex.models.real_shapes import parameter_counts, write_real_dir
    from omniduplex.models.registry import load_model

    d = write_real_dir(work / name, name, depth)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t0 = time.perf_counter()
    if name == "qwen3-tts-12hz-1.7b":
        m = load_qwen3_tts(d, parts=("talker", "codec"), dtype=torch.bfloat16, device=device)
        lm = None
    else:
        m = load_model(d, dtype=torch.bfloat16, device=device)
        lm = m.thinker
        if fp8:
            from omniduplex.kernels.fp8_linear import quantize_fp8_

            quantize_fp8_(lm.model)
            if device.type == "cuda":
                torch.cuda.empty_cache()
    label = name + (" fp8" if fp8 else "")
    row = {"preset": label, "depth": depth, "build_s": round(time.perf_counter() - t0, 2)}
    row["parameters"] = parameter_counts(name, depth)["total"]
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        row["allocated_gib"] = round(torch.cuda.memory_allocated(device) / 2**30, 2)
    if lm is not None:
        graphs = "off" if fp8 else "auto"  # the e4m3 experts read their ids on the host: eager only
        row["tok_s"] = {str(c): round(_tok_s(lm, c, device, graphs=graphs), 1) for c in (1, 32)}
    del m, lm
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--depth", type=int, default=None, help="cap every stack (dry runs on the CPU)")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--fp8", action="store_true", help="also Qwen3-Omni with an e4m3 Thinker LM (last)")
    args = ap.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(f"real_shapes: torch {torch.__version__} sees no CUDA GPU (dry run: --device cpu --depth 1)")
        return 3
    rows: list[dict] = []
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        for name, fp8 in [(n, False) for n in ORDER] + ([(ORDER[-1], True)] if args.fp8 else []):
            try:
                rows.append(one(name, args.depth, device, Path(tmp), fp8))
            except Exception as e:  # one preset's failure (e.g. out of memory) does not hide the others'
                rows.append({"preset": name, "error": f"{type(e).__name__}: {e}"[:300]})
                failed = True
            print(json.dumps(rows[-1]), flush=True)
            args.json.write_text(json.dumps({"device": str(device), "rows": rows}, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
