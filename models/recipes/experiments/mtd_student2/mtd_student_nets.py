"""Networks of the ``mtd-student`` recipe: the two-scale patch description network, the scoring
module and the training loops.

The patch description network (PDN) follows EfficientAD (Batzner et al., "EfficientAD: Accurate
Visual Anomaly Detection at Millisecond-Level Latencies", WACV 2024: plain convolutions, ReLU, no
normalisation layers) with a second, coarser branch: a 4x4/4 stem and 3x3 convolutions down to a
16 x 16 grid (stride 16), one more 3x3/2 pair at stride 32 whose output is upsampled (nearest) and
concatenated back, then a 1x1 projection to the trunk's 152 channels. The coarse branch widens
the receptive field from about 76 px to about 170 px: the trunk's block 10, which carries most
of what separates flaws in its features, sees most of a 256-px image, and a 60-px network
reproduced only a quarter of its variance.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Widths: stem, stride-8 convolutions, stride-16 convolutions, stride-32 convolutions.
CHANNELS = (32, 48, 96, 128)
#: Output channels: the trunk's patch vector (EfficientNet-Lite0 blocks 4 + 10: 40 + 112).
OUT = 152


def pdn(channels: tuple[int, ...] = CHANNELS, out: int = OUT) -> Any:
    """Two-scale PDN: ``(B, 1, S, S)`` float32 -> ``(B, out, S/16, S/16)`` (S a multiple of 32)."""
    import torch  # noqa: PLC0415
    import torch.nn.functional as F  # noqa: PLC0415, N812
    from torch import nn  # noqa: PLC0415

    a, b, c, d = channels

    class PDN(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.f16 = nn.Sequential(
                nn.Conv2d(1, a, 4, 4), nn.ReLU(),
                nn.Conv2d(a, b, 3, 2, 1), nn.ReLU(), nn.Conv2d(b, b, 3, 1, 1), nn.ReLU(),
                nn.Conv2d(b, c, 3, 2, 1), nn.ReLU(), nn.Conv2d(c, c, 3, 1, 1), nn.ReLU())
            self.f32 = nn.Sequential(nn.Conv2d(c, d, 3, 2, 1), nn.ReLU(),
                                     nn.Conv2d(d, d, 3, 1, 1), nn.ReLU())
            self.head = nn.Conv2d(c + d, out, 1)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            f = self.f16(x)
            g = F.interpolate(self.f32(f), scale_factor=2.0, mode="nearest")
            return self.head(torch.cat([f, g], 1))

    return PDN()


def student_model(teacher: Any, student: Any, qa: float, qb: float, top_k: int) -> Any:
    """T and S as one module: ``(B, 1, S, S)`` -> ``(B,)`` score, the mean of the ``top_k``
    largest cells of the normalised discrepancy map (``top_k`` = 1: ``ReduceMax``).

    Map cell = mean over channels of ``(T - S)^2``, normalised as EfficientAD does:
    ``(cell - q_a) / (q_b - q_a)``, so the tensor before the reduction is the map in score units
    (:mod:`agent.inference.patch_map` reads it for snapshot heatmaps)."""
    import torch  # noqa: PLC0415

    class StudentTeacher(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.teacher = teacher
            self.student = student
            self.register_buffer("qa", torch.tensor(float(qa)))
            self.register_buffer("inv", torch.tensor(1.0 / max(float(qb - qa), 1e-12)))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            d = self.teacher(x) - self.student(x)
            m = ((d * d).mean(1).flatten(1) - self.qa) * self.inv  # (B, P): the map
            if top_k == 1:
                return m.amax(1)
            return torch.topk(m, top_k, dim=1).values.mean(1)

    return StudentTeacher().eval()


def anomaly_maps(teacher: Any, student: Any, x: np.ndarray) -> np.ndarray:
    """``(N, P)`` float32 maps (mean over channels of ``(T - S)^2`` per cell), torch FP32."""
    import torch  # noqa: PLC0415

    out = []
    with torch.inference_mode():
        for i in range(0, len(x), 32):
            b = torch.from_numpy(x[i : i + 32])
            d = teacher(b) - student(b)
            out.append((d * d).mean(1).flatten(1).numpy())
    return np.concatenate(out)


def top_k_scores(maps: np.ndarray, k: int) -> np.ndarray:
    """``(N,)``: the mean of the ``k`` largest cells of each map row."""
    return np.sort(maps, axis=1)[:, -k:].mean(1)


def paired_flips(a: np.ndarray, b: np.ndarray, rng: np.random.Generator
                 ) -> tuple[np.ndarray, np.ndarray]:
    """The same random 90-degree turn and flip applied to ``a[i]`` and ``b[i]``."""
    oa, ob = np.empty_like(a), np.empty_like(b)
    for i in range(len(a)):
        k, flip = int(rng.integers(4)), bool(rng.random() < 0.5)
        x, y = np.rot90(a[i], k), np.rot90(b[i], k)
        oa[i], ob[i] = (x[:, ::-1], y[:, ::-1]) if flip else (x, y)
    return oa, ob


def train(net: Any, x8: np.ndarray, steps: int, batch: int, lr: float, seed: int, desc: str, *,
          targets: np.ndarray | None = None, teacher: Any = None, hard_q: float = 0.0,
          flip: bool = False, clean: np.ndarray | None = None) -> Any:
    """Fit ``net`` on whole images ``x8`` (uint8 ``(N, S, S)``), Adam + cosine schedule, one
    seeded batch draw per step, a tqdm progress bar.

    Target per batch: ``targets[idx]`` (float16/32 ``(N, C, G, G)``: the teacher's trunk
    features), or the frozen ``teacher``'s output on the same (augmented) images. Loss: MSE, plus
    EfficientAD's hard-feature term (the mean of the squared errors at or above their
    ``hard_q`` quantile) when ``hard_q`` > 0. ``flip``: random flips and 90-degree turns
    (only with ``teacher``: precomputed targets belong to the unturned image). ``clean``
    (with ``teacher``): uint8 images like ``x8`` without their synthetic flaws; the target of
    ``x8[i]`` is then the teacher's output on ``clean[i]`` (the student learns to see through
    flaws: what the teacher says of the flawless surface)."""
    import torch  # noqa: PLC0415
    from mtd_padim import normalise  # noqa: PLC0415
    from tqdm import tqdm  # noqa: PLC0415

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=1e-5)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    if teacher is not None:
        for p in teacher.parameters():
            p.requires_grad_(False)
    bar = tqdm(range(steps), desc=desc, unit="step", mininterval=2.0)
    for _ in bar:
        idx = rng.integers(0, len(x8), batch)
        cb8 = clean[idx] if clean is not None else x8[idx]
        if flip:
            xb8, cb8 = paired_flips(x8[idx], cb8, rng)
        else:
            xb8 = x8[idx]
        xb = torch.from_numpy(normalise(xb8))
        if teacher is not None:
            with torch.no_grad():
                y = teacher(torch.from_numpy(normalise(cb8)))
        else:
            assert targets is not None
            y = torch.from_numpy(targets[idx].astype(np.float32))
        d = (net(xb) - y) ** 2
        loss = d.mean()
        if hard_q > 0:
            loss = loss + d[d >= torch.quantile(d.flatten()[::7], hard_q)].mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        bar.set_postfix(loss=f"{loss.item():.4f}", refresh=False)
    return net.eval()
