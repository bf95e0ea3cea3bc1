"""The reference benchmark's models, written out so that no torchvision or hub download is needed
(the node may be offline, and torchvision must match torch exactly).

- ResNet-50 v1.5 (He et al. 2015, with the stride on the 3x3 conv as torchvision has it):
  bottleneck blocks [3, 4, 6, 3], 25,557,032 parameters at 1,000 classes, as torchvision's.
- GPT-2 small (Radford et al. 2019): 12 layers, 12 heads, 768 wide, 1,024 positions, 50,257 tokens,
  tied input and output embeddings: 124,439,808 parameters.

`width_div` divides every width (and `depth` cuts the layers) so a test can run a real training
step of the same architecture on a CPU in milliseconds.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin: int, width: int, stride: int) -> None:
        super().__init__()
        cout = width * self.expansion
        self.conv1 = nn.Conv2d(cin, width, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3 = nn.Conv2d(width, cout, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(cout)
        self.down = None
        if stride != 1 or cin != cout:
            self.down = nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = F.relu(self.bn1(self.conv1(x)))
        out = F.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return F.relu(out + (x if self.down is None else self.down(x)))


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000, width_div: int = 1, blocks: tuple[int, ...] = (3, 4, 6, 3)) -> None:
        super().__init__()
        stem = 64 // width_div
        self.stem = nn.Sequential(nn.Conv2d(3, stem, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(stem),
                                  nn.ReLU(inplace=True), nn.MaxPool2d(3, stride=2, padding=1))
        layers, cin = [], stem
        for i, n in enumerate(blocks):
            width = (64 * 2 ** i) // width_div
            for j in range(n):
                layers.append(Bottleneck(cin, width, 2 if (j == 0 and i > 0) else 1))
                cin = width * Bottleneck.expansion
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(approximate="tanh"), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


class GPT2(nn.Module):
    def __init__(self, vocab: int = 50257, context: int = 1024, dim: int = 768, layers: int = 12,
                 heads: int = 12) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(context, dim)
        self.blocks = nn.Sequential(*(Block(dim, heads) for _ in range(layers)))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as GPT-2's

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        return self.head(self.ln(self.blocks(self.tok(idx) + self.pos(pos))))


def build(model: str, *, width_div: int = 1, seq_len: int = 1024) -> nn.Module:
    """Full size at width_div 1; smaller widths (and, for GPT-2, 2 layers) for quick CPU runs."""
    if model == "resnet50":
        return ResNet50(width_div=width_div)
    if model == "gpt2":
        if width_div == 1:
            return GPT2(context=max(1024, seq_len))
        return GPT2(vocab=50257 // width_div, context=seq_len, dim=768 // width_div, layers=2, heads=max(1, 12 // width_div))
    raise ValueError(model)
