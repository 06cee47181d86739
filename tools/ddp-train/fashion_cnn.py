"""ddp-train's model in Python: the same layers under the same names as
FashionCnn (tools/ddp-train/model.h), so that a checkpoint's .model.pt
loads with strict=True. Input: N x 1 x 28 x 28 float32, each pixel p in
0..255 as (p / 255 - 0.2860) / 0.3530 (torchvision's ToTensor() and
Normalize((0.2860,), (0.3530,))). Output: N x 10 logits.

    import glob, torch
    from fashion_cnn import FashionCnn
    model = FashionCnn()
    path = sorted(glob.glob("out/ddp-train/checkpoints/checkpoint-*.model.pt"))[-1]
    model.load_state_dict(torch.load(path))
    model.eval()
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class FashionCnn(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(32)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(64)
        self.drop1 = nn.Dropout(0.25)
        self.fc1 = nn.Linear(64 * 7 * 7, 128)
        self.drop2 = nn.Dropout(0.5)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        # channels-last activations from conv1 on, as model.cc (speed only)
        x = self.conv1(x).contiguous(memory_format=torch.channels_last)
        x = F.max_pool2d(F.relu(self.bn1(x)), 2)  # 32 x 14 x 14
        x = F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)  # 64 x 7 x 7
        x = self.drop1(x).flatten(1)
        return self.fc2(self.drop2(F.relu(self.fc1(x))))
