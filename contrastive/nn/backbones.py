"""CIFAR ResNets: torchvision's ResNet with the CIFAR stem (the ~0.4M-parameter ``small_cnn``
is in :mod:`contrastive.nn.small_cnn`, free of torchvision).

Every backbone returns pooled features (N, num_features) and has ``forward_stages(x)``, the
list of intermediate feature maps (for distillation), see :func:`contrastive.nn.stage_features`.
"""

from __future__ import annotations

from torch import Tensor, nn
from torchvision.models.resnet import BasicBlock, Bottleneck, ResNet

__all__ = ["CifarResNet"]


class CifarResNet(ResNet):
    """torchvision's ResNet with the CIFAR stem: 3x3 conv, stride 1, no max-pool, no classifier.

    The variant of the MoCo CIFAR-10 demo and of most CIFAR reproductions (He et al. 2016,
    sec. 4.2 keep the 3x3 stem). Being a torchvision ``ResNet`` subclass, its state-dict keys
    are torchvision's (``conv1.weight``, ``layer1.0.conv1.weight``, ...) minus ``fc``.

    Shape: (N, 3, H, W) -> (N, num_features), num_features = 512 (BasicBlock) or 2048
    (Bottleneck).
    """

    def __init__(self, block: type[BasicBlock] | type[Bottleneck], layers: list[int], **kwargs):
        super().__init__(block, layers, **kwargs)
        self.conv1 = nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)
        nn.init.kaiming_normal_(self.conv1.weight, mode="fan_out", nonlinearity="relu")
        self.maxpool = nn.Identity()
        self.num_features = 512 * block.expansion
        self.fc = nn.Identity()

    def forward_stages(self, x: Tensor) -> list[Tensor]:
        """Outputs of ``layer1`` .. ``layer4``: (N, C_i, H_i, W_i), strides 1, 2, 4, 8."""
        x = self.relu(self.bn1(self.conv1(x)))
        out = []
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = layer(x)
            out.append(x)
        return out
