"""BiSeNetV2: a real-time segmentation network that trains well from scratch.

Yu, Gao, Wang, Yu, Shen and Sang, "BiSeNet V2: Bilateral Network with Guided Aggregation for
Real-time Semantic Segmentation", IJCV 2021, arXiv:2004.02147. Trained from scratch (no ImageNet
weights, which cannot be downloaded here) it reaches 73.4 mIoU on Cityscapes val (72.6 test) at
156 FPS for 512x1024 on a GTX 1080 Ti, with about 3.4 M parameters at inference.

Two branches: a wide, shallow *detail* branch at 1/8 resolution keeps boundaries; a narrow, deep
*semantic* branch down to 1/32 gathers context; *bilateral guided aggregation* lets each guide the
other. During training, auxiliary heads on the semantic stages add deep supervision ("booster"),
and they cost nothing at inference (they are not even built with `aux=False`).

`width` scales every channel count, so tests and the offline run use a small variant
(`width=0.25` has about 1/16 of the parameters); `width=1.0` is the paper's network.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F  # noqa: N812 (the universal spelling)
from torch import nn

from trainer.metrics import IGNORE_INDEX

# The paper's channel counts at width 1.0.
DETAIL_CHANNELS = (64, 64, 128)
SEMANTIC_CHANNELS = (16, 32, 64, 128)
HEAD_CHANNELS = 1024
# The booster heads' hidden widths, one per semantic stage (stem, S3, S4, S5).
AUX_HEAD_CHANNELS = (16, 64, 256, 1024)
EXPANSION = 6


def scaled(channels: int, width: float, minimum: int = 4) -> int:
    """`channels * width` rounded to a multiple of 4 (kernel-friendly), at least `minimum`."""
    return max(minimum, round(channels * width / 4) * 4)


class ConvBNReLU(nn.Sequential):
    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel: int = 3,
        *,
        stride: int = 1,
        groups: int = 1,
        relu: bool = True,
    ) -> None:
        layers: list[nn.Module] = [
            nn.Conv2d(
                in_channels,
                out_channels,
                kernel,
                stride=stride,
                padding=kernel // 2,
                groups=groups,
                bias=False,
            ),
            nn.BatchNorm2d(out_channels),
        ]
        if relu:
            layers.append(nn.ReLU(inplace=True))
        super().__init__(*layers)


class DetailBranch(nn.Module):
    """Three stages of plain 3x3 convolutions down to 1/8: wide channels, spatial detail."""

    def __init__(self, channels: tuple[int, int, int]) -> None:
        super().__init__()
        c1, c2, c3 = channels
        self.layers = nn.Sequential(
            ConvBNReLU(3, c1, stride=2),
            ConvBNReLU(c1, c1),
            ConvBNReLU(c1, c2, stride=2),
            ConvBNReLU(c2, c2),
            ConvBNReLU(c2, c2),
            ConvBNReLU(c2, c3, stride=2),
            ConvBNReLU(c3, c3),
            ConvBNReLU(c3, c3),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        result: torch.Tensor = self.layers(x)
        return result


class StemBlock(nn.Module):
    """Down to 1/4 fast: a strided conv, then a conv path and a max-pool path side by side."""

    def __init__(self, out_channels: int) -> None:
        super().__init__()
        self.conv = ConvBNReLU(3, out_channels, stride=2)
        self.left = nn.Sequential(
            ConvBNReLU(out_channels, out_channels // 2, kernel=1),
            ConvBNReLU(out_channels // 2, out_channels, stride=2),
        )
        self.right = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        self.fuse = ConvBNReLU(out_channels * 2, out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x)
        result: torch.Tensor = self.fuse(torch.cat([self.left(x), self.right(x)], dim=1))
        return result


class GatherExpansion(nn.Module):
    """The GE layer: gather with a 3x3 conv, expand depth-wise, project back; residual."""

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        mid = in_channels * EXPANSION
        self.gather = ConvBNReLU(in_channels, in_channels)
        if stride == 1:
            self.expand: nn.Module = ConvBNReLU(in_channels, mid, groups=in_channels, relu=False)
            self.shortcut: nn.Module | None = None
        else:
            self.expand = nn.Sequential(
                ConvBNReLU(in_channels, mid, stride=2, groups=in_channels, relu=False),
                ConvBNReLU(mid, mid, groups=mid, relu=False),
            )
            self.shortcut = nn.Sequential(
                ConvBNReLU(in_channels, in_channels, stride=2, groups=in_channels, relu=False),
                ConvBNReLU(in_channels, out_channels, kernel=1, relu=False),
            )
        self.project = ConvBNReLU(mid, out_channels, kernel=1, relu=False)
        if stride == 1 and in_channels != out_channels:
            raise ValueError("a stride-1 GE layer keeps its channel count")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        residual = x if self.shortcut is None else self.shortcut(x)
        out = self.project(self.expand(self.gather(x)))
        return F.relu(out + residual)


class ContextEmbedding(nn.Module):
    """Global average pooling added back onto the 1/32 map: the whole image as context."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.bn = nn.BatchNorm2d(channels)
        self.gap_conv = ConvBNReLU(channels, channels, kernel=1)
        self.conv = ConvBNReLU(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        context = self.gap_conv(self.bn(x.mean(dim=(2, 3), keepdim=True)))
        result: torch.Tensor = self.conv(x + context)
        return result


class SemanticBranch(nn.Module):
    """Narrow and deep down to 1/32; returns every stage for the booster heads."""

    def __init__(self, channels: tuple[int, int, int, int]) -> None:
        super().__init__()
        c1, c2, c3, c4 = channels
        self.stem = StemBlock(c1)
        self.stage3 = nn.Sequential(GatherExpansion(c1, c2, stride=2), GatherExpansion(c2, c2))
        self.stage4 = nn.Sequential(GatherExpansion(c2, c3, stride=2), GatherExpansion(c3, c3))
        self.stage5 = nn.Sequential(
            GatherExpansion(c3, c4, stride=2),
            GatherExpansion(c4, c4),
            GatherExpansion(c4, c4),
            GatherExpansion(c4, c4),
        )
        self.context = ContextEmbedding(c4)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        s2 = self.stem(x)
        s3 = self.stage3(s2)
        s4 = self.stage4(s3)
        s5 = self.stage5(s4)
        return [s2, s3, s4, s5, self.context(s5)]


class BilateralGuidedAggregation(nn.Module):
    """Each branch gates the other at its own resolution, then the two are summed at 1/8."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        c = channels
        self.detail_keep = nn.Sequential(ConvBNReLU(c, c, groups=c, relu=False), nn.Conv2d(c, c, 1, bias=False))
        self.detail_down = nn.Sequential(
            ConvBNReLU(c, c, stride=2, relu=False),
            nn.AvgPool2d(kernel_size=3, stride=2, padding=1, ceil_mode=False),
        )
        self.semantic_up = ConvBNReLU(c, c, relu=False)
        self.semantic_keep = nn.Sequential(ConvBNReLU(c, c, groups=c, relu=False), nn.Conv2d(c, c, 1, bias=False))
        self.fuse = ConvBNReLU(c, c)

    def forward(self, detail: torch.Tensor, semantic: torch.Tensor) -> torch.Tensor:
        size = detail.shape[2:]
        semantic_gate = F.interpolate(self.semantic_up(semantic), size=size, mode="bilinear", align_corners=False)
        left = self.detail_keep(detail) * torch.sigmoid(semantic_gate)
        down = self.detail_down(detail)
        right = down * torch.sigmoid(self.semantic_keep(semantic))
        right = F.interpolate(right, size=size, mode="bilinear", align_corners=False)
        result: torch.Tensor = self.fuse(left + right)
        return result


class SegmentHead(nn.Sequential):
    def __init__(self, in_channels: int, mid_channels: int, num_classes: int, dropout: float) -> None:
        super().__init__(
            ConvBNReLU(in_channels, mid_channels),
            nn.Dropout(dropout),
            nn.Conv2d(mid_channels, num_classes, kernel_size=1),
        )


class BiSeNetV2(nn.Module):
    """Logits at the input's resolution; in training mode with `aux`, also the booster logits."""

    def __init__(self, num_classes: int, width: float = 1.0, aux: bool = True, dropout: float = 0.1) -> None:
        super().__init__()
        if width <= 0:
            raise ValueError(f"width must be positive, got {width}")
        self.num_classes = num_classes
        self.width = width
        detail = tuple(scaled(c, width) for c in DETAIL_CHANNELS)
        semantic = tuple(scaled(c, width) for c in SEMANTIC_CHANNELS)
        # The aggregation adds the two branches, so they must end with the same width.
        assert detail[-1] == semantic[-1]
        self.detail = DetailBranch((detail[0], detail[1], detail[2]))
        self.semantic = SemanticBranch((semantic[0], semantic[1], semantic[2], semantic[3]))
        self.aggregate = BilateralGuidedAggregation(detail[-1])
        self.head = SegmentHead(detail[-1], scaled(HEAD_CHANNELS, width), num_classes, dropout)
        self.aux_heads = (
            nn.ModuleList(
                SegmentHead(c, scaled(mid, width), num_classes, dropout)
                for c, mid in zip(semantic, AUX_HEAD_CHANNELS, strict=True)
            )
            if aux
            else None
        )
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Conv2d):
                nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.BatchNorm2d):
                nn.init.ones_(module.weight)
                nn.init.zeros_(module.bias)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        """`[main]` in eval mode (or without aux heads), `[main, aux...]` in training mode."""
        size = x.shape[2:]
        stages = self.semantic(x)
        features = self.aggregate(self.detail(x), stages[-1])
        outputs = [self.head(features)]
        if self.training and self.aux_heads is not None:
            outputs += [head(stage) for head, stage in zip(self.aux_heads, stages[:4], strict=True)]
        return [F.interpolate(o, size=size, mode="bilinear", align_corners=False) for o in outputs]


def inference_parameters(model: BiSeNetV2) -> int:
    """Parameters used at inference: everything but the booster heads."""
    total = sum(p.numel() for p in model.parameters())
    aux = sum(p.numel() for p in model.aux_heads.parameters()) if model.aux_heads else 0
    return total - aux


class SegmentationLoss(nn.Module):
    """Cross entropy on the main head plus the weighted booster heads; 255 is ignored."""

    def __init__(self, aux_weight: float, class_weights: list[float] | None = None) -> None:
        super().__init__()
        self.aux_weight = aux_weight
        self.class_weights: torch.Tensor | None
        self.register_buffer("class_weights", torch.tensor(class_weights) if class_weights is not None else None)

    def forward(self, outputs: list[torch.Tensor], labels: torch.Tensor) -> torch.Tensor:
        # In fp32 even under autocast: a softmax over 19 classes in bf16 loses the small terms.
        loss = self._cross_entropy(outputs[0], labels)
        for aux in outputs[1:]:
            loss = loss + self.aux_weight * self._cross_entropy(aux, labels)
        # A batch without one labelled pixel (all skipped pairs, say) has a mean over nothing,
        # NaN: it counts 0 instead, and its gradient is 0 (no sync: the choice stays on the device).
        return torch.where((labels != IGNORE_INDEX).any(), loss, torch.zeros_like(loss))

    def _cross_entropy(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.float(), labels, weight=self.class_weights, ignore_index=IGNORE_INDEX)
