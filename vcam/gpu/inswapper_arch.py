"""The inswapper_128 architecture in PyTorch (docs/models.md), for benchmarks with random weights.

Used when ``vcam.engines.inswapper_torch.build_inswapper`` is not available. 138.3M parameters,
about 349 GFLOP per 128x128 face. Inputs: ``target`` (N, 3, 128, 128) RGB in [0, 1], ``source``
(N, 512) latent; output (N, 3, 128, 128) in [0, 1].
"""

from __future__ import annotations

from typing import Any


def build_inswapper(seed: int = 0) -> Any:
    import torch
    from torch import nn
    import torch.nn.functional as F

    class AdaIN(nn.Module):
        def __init__(self, ch: int) -> None:
            super().__init__()
            self.fc = nn.Linear(512, 2 * ch)
            self.ch = ch

        def forward(self, x: Any, latent: Any) -> Any:
            gb = self.fc(latent)
            gamma, beta = gb[:, : self.ch, None, None], gb[:, self.ch :, None, None]
            mean = x.mean(dim=(2, 3), keepdim=True)
            var = x.var(dim=(2, 3), keepdim=True, unbiased=False)
            return (x - mean) / torch.sqrt(var + 1e-8) * gamma + beta

    class ResBlock(nn.Module):
        def __init__(self, ch: int) -> None:
            super().__init__()
            self.c1 = nn.Conv2d(ch, ch, 3)
            self.c2 = nn.Conv2d(ch, ch, 3)
            self.a1 = AdaIN(ch)
            self.a2 = AdaIN(ch)

        def forward(self, x: Any, latent: Any) -> Any:
            y = F.relu(self.a1(self.c1(F.pad(x, (1, 1, 1, 1), mode="reflect")), latent))
            y = self.a2(self.c2(F.pad(y, (1, 1, 1, 1), mode="reflect")), latent)
            return x + y

    class Inswapper(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.e1 = nn.Conv2d(3, 128, 7)
            self.e2 = nn.Conv2d(128, 256, 3, padding=1)
            self.e3 = nn.Conv2d(256, 512, 3, stride=2, padding=1)
            self.e4 = nn.Conv2d(512, 1024, 3, stride=2, padding=1)
            self.blocks = nn.ModuleList([ResBlock(1024) for _ in range(6)])
            self.d1 = nn.Conv2d(1024, 512, 3, padding=1)
            self.d2 = nn.Conv2d(512, 256, 3, padding=1)
            self.d3 = nn.Conv2d(256, 128, 3, padding=1)
            self.d4 = nn.Conv2d(128, 3, 7)

        def forward(self, target: Any, source: Any) -> Any:
            act = lambda t: F.leaky_relu(t, 0.2)  # noqa: E731
            x = act(self.e1(F.pad(target, (3, 3, 3, 3), mode="reflect")))
            x = act(self.e2(x))
            x = act(self.e3(x))
            x = act(self.e4(x))
            for b in self.blocks:
                x = b(x, source)
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
            x = act(self.d1(x))
            x = F.interpolate(x, scale_factor=2, mode="bilinear", align_corners=False)
            x = act(self.d2(x))
            x = act(self.d3(x))
            x = torch.tanh(self.d4(F.pad(x, (3, 3, 3, 3), mode="reflect")))
            return (x + 1) / 2

    gen = torch.manual_seed(seed)
    del gen
    m = Inswapper()
    # Small random weights keep activations finite in FP16 through six residual blocks.
    with torch.no_grad():
        for p in m.parameters():
            p.normal_(0.0, 0.02)
    return m.eval()
