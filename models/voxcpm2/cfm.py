"""The conditional flow-matching decode of one patch per row: Euler steps with classifier-free guidance.

From noise at ``t = 1`` to a latent patch at ``t = 0`` along the velocity the LocDiT estimates
(flow matching, Lipman et al. 2023; VoxCPM, arXiv 2509.24650), as ``UnifiedCFM.forward`` /
``solve_euler`` of ``voxcpm`` 2.0.3 run it:

- time grid: ``linspace(1, 0, n + 1)`` warped by sway sampling (F5-TTS, Chen et al. 2024) with
  coefficient 1: ``t + (cos(π/2 · t) − 1 + t)``;
- guidance: each step runs the estimator on ``2B`` rows, the conditional ones (``mu``) and the
  unconditional ones (``mu = 0``, VoiceBox-style CFG), combined with CFG-Zero* (Fan et al. 2025): the
  unconditional velocity is scaled by ``s* = <v_c, v_u> / (‖v_u‖² + 1e-8)`` per row, ``v = s*·v_u +
  cfg · (v_c − s*·v_u)``, and the first ``max(1, ⌊0.04 · (n + 1)⌋)`` steps use ``v = 0``;
- ``t`` advances by subtraction (``t ← t − dt``, ``dt ← t − grid[k + 1]``), the reference's recurrence.

:func:`solve` takes the noise as an argument (``[B, D, P]``), so each request draws its own (from its
seeded generator): a row's result does not depend on its batch-mates, and the reference's global-RNG draw
can be reproduced exactly in tests. All requests due in an engine step go through one call (the serving
lever): ``n`` estimator forwards over ``2B`` rows instead of ``B`` solver runs.
"""

from __future__ import annotations

import math

import torch

from omniduplex.models.voxcpm2.local import LocDiT

SWAY_COEF = 1.0
"""``sway_sampling_coef`` of ``UnifiedCFM.forward`` (its default, which ``VoxCPM2Model`` uses)."""


def time_grid(n: int, dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """The ``n + 1`` sway-warped times from 1 to 0 (module docstring). Raises ValueError for ``n < 1``."""
    if n < 1:
        raise ValueError(f"inference_timesteps must be >= 1, got {n}")
    t = torch.linspace(1, 0, n + 1, device=device, dtype=dtype)
    return t + SWAY_COEF * (torch.cos(math.pi / 2 * t) - 1 + t)


@torch.no_grad()
def solve(
    estimator: LocDiT,
    noise: torch.Tensor,
    mu: torch.Tensor,
    cond: torch.Tensor,
    cfg_value: torch.Tensor,
    n_steps: int,
    mean_mode: bool = False,
) -> torch.Tensor:
    """Euler-solve ``B`` patches at once.

    Args:
        estimator: the LocDiT.
        noise: ``[B, D, P]`` the starting point (standard normal, drawn by the caller).
        mu: ``[B, 2·Hd]`` the LM conditioning (base- and residual-LM projections side by side).
        cond: ``[B, D, P']`` the previous patch of each row.
        cfg_value: ``[B]`` guidance scale per row (the reference's ``cfg_value``, 2.0 by default).
        n_steps: Euler steps (``inference_timesteps``, 10 by default).
        mean_mode: feed the step size to the estimator's ``dt`` input (``dit_mean_mode``; else zeros).

    Returns:
        ``[B, D, P]`` latent patches, in ``noise``'s dtype.

    Raises:
        ValueError: ``n_steps < 1`` or mismatched batch sizes.
    """
    b = noise.shape[0]
    if mu.shape[0] != b or cond.shape[0] != b or cfg_value.shape[0] != b:
        raise ValueError(f"solve: batch sizes differ (noise {b}, mu {mu.shape[0]}, cond {cond.shape[0]})")
    grid = time_grid(n_steps, noise.dtype, noise.device)
    t, dt = grid[0], grid[0] - grid[1]
    zero_init = max(1, int((n_steps + 1) * 0.04))
    mu_in = torch.cat((mu, torch.zeros_like(mu)))
    cond_in = torch.cat((cond, cond))
    cfg = cfg_value.to(noise.dtype).reshape(b, 1, 1)
    x = noise
    for step in range(1, n_steps + 1):
        if step > zero_init:
            t_in = t.expand(2 * b)
            dt_in = dt.expand(2 * b) if mean_mode else torch.zeros_like(t_in)
            v = estimator(torch.cat((x, x)), mu_in, t_in, cond_in, dt_in)
            v_c, v_u = v[:b], v[b:]
            dot = torch.sum(v_c.reshape(b, -1) * v_u.reshape(b, -1), dim=1, keepdim=True)
            s = (dot / (torch.sum(v_u.reshape(b, -1) ** 2, dim=1, keepdim=True) + 1e-8)).reshape(b, 1, 1)
            x = x - dt * (v_u * s + cfg * (v_c - v_u * s))
        # steps within the zero-velocity start leave x as it is (x − dt·0)
        t = t - dt
        if step < n_steps:
            dt = t - grid[step + 1]
    return x
