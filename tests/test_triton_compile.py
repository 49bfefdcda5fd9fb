"""Our Triton kernels compile for NVIDIA GPUs without one: ahead-of-time ``triton.compile`` to a cubin for
sm80 (A100) and sm90 (H100/H200) with the ptxas bundled in the triton wheel, for the configs
:func:`~omniduplex.kernels.paged_decode_config.choose_config` picks. The interpreter runs the kernels' Python;
this runs the compiler's lowering (tensor-core dots in the cache dtype, layouts, software pipelining), so a
kernel that only the GPU would reject fails here first. Shared memory must fit the target's per-block limit
(else the first launch would raise ``OutOfResources``).

Needs a process where ``TRITON_INTERPRET`` is unset (the interpreter replaces ``tl`` functions at import), so
it runs in a subprocess.
"""

import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("triton")

SCRIPT = textwrap.dedent(
    """
    import torch, triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from omniduplex.kernels import paged_decode_kernels as pda, triton_ops as tops
    from omniduplex.kernels.paged_decode_config import choose_config
    pda.kernels(); tops._kernels()
    SMEM = {80: 163 * 1024, 90: 227 * 1024}

    def build(fn, args, arch, num_warps, num_stages):
        sig, consts, attrs = {}, {}, {}
        for i, name in enumerate(fn.arg_names):
            kind, val = args[name]
            if kind == "c":
                sig[name], consts[(i,)] = "constexpr", val
            else:
                sig[name] = kind
                if val == 16:
                    attrs[(i,)] = [["tt.divisibility", 16]]
        k = triton.compile(ASTSource(fn, sig, consts, attrs), target=GPUTarget("cuda", arch, 32),
                           options={"num_warps": num_warps, "num_stages": num_stages})
        assert k.metadata.shared <= SMEM[arch], (fn.__name__, k.metadata.shared)
        return k

    P = lambda t: (t, 16)
    I16, I = ("i32", 16), ("i32", None)
    CASES = [(90, "bf16", False), (90, "bf16", True), (90, "fp32", False), (80, "bf16", False)]
    STRIDES = ["stride_qs", "stride_qh", "stride_kb", "stride_kt", "stride_kh", "stride_vb", "stride_vt",
               "stride_vh", "stride_bt", "stride_os", "stride_oh", "num_q_heads"]
    for arch, dtype, split in CASES:
        tdt = {"bf16": torch.bfloat16, "fp32": torch.float32}[dtype]
        cfg = choose_config(128, 2, tdt, (arch // 10, arch % 10))
        a = {n: P("*" + dtype) for n in ["q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr"]}
        a.update({n: P("*i32") for n in ["block_tables_ptr", "seq_lens_ptr"]})
        a.update({n: P("*fp32") for n in ["part_m_ptr", "part_l_ptr", "part_acc_ptr"]})
        a.update({n: I16 for n in STRIDES})
        a.update(qk_scale=("fp32", None), num_splits=I, split_len=I, GROUP=("c", 2), BLOCK_G=("c", 16),
                 HEAD_DIM=("c", 128), BLOCK_D=("c", 128), BLOCK_SIZE=("c", 16), BLOCK_N=("c", cfg.block_n),
                 UPCAST=("c", dtype == "fp32"), IS_SPLIT=("c", split))
        k = build(pda._compiled["decode"], a, arch, cfg.num_warps, cfg.num_stages)
        assert dtype == "fp32" or "mma.sync" in k.asm["ptx"], "bf16 dots must run on tensor cores"
    a = dict(part_m_ptr=P("*fp32"), part_l_ptr=P("*fp32"), part_acc_ptr=P("*fp32"), out_ptr=P("*bf16"),
             seq_lens_ptr=P("*i32"), stride_os=I16, stride_oh=I16, num_splits=I, split_len=I,
             HEAD_DIM=("c", 128), BLOCK_D=("c", 128), BLOCK_P=("c", 64), BLOCK_N=("c", 64))
    build(pda._compiled["combine"], a, 90, 4, 1)
    a = dict(x_ptr=P("*bf16"), delta_ptr=P("*bf16"), res_ptr=P("*bf16"), w_ptr=P("*bf16"), y_ptr=P("*bf16"),
             stride_x=I16, stride_d=I16, stride_r=I16, stride_y=I16, eps=("fp32", None), H=("c", 1024),
             BLOCK_H=("c", 1024), ADD=("c", True))
    build(tops._compiled["rms"], a, 90, 4, 1)
    a = dict(q_ptr=P("*bf16"), k_ptr=P("*bf16"), cos_ptr=P("*fp32"), sin_ptr=P("*fp32"), qw_ptr=P("*bf16"),
             kw_ptr=P("*bf16"), stride_qt=I16, stride_qh=I16, stride_kt=I16, stride_kh=I16, stride_ct=I16,
             stride_st=I16, num_q_heads=I16, num_k_heads=I, eps=("fp32", None), HALF=("c", 64),
             BLOCK_HALF=("c", 64), BLOCK_HEADS=("c", 32), NORM=("c", True))
    build(tops._compiled["rope"], a, 90, 4, 1)
    a = dict(x_ptr=P("*bf16"), y_ptr=P("*bf16"), stride_x=I16, stride_y=I16, inter=I16, BLOCK=("c", 1024))
    build(tops._compiled["silu"], a, 90, 4, 1)
    print("COMPILED")
    """
)


@pytest.mark.slow
def test_kernels_compile_for_sm80_and_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    cmd = [sys.executable, "-c", SCRIPT]
    result = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("COMPILED")
