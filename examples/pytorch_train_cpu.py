"""A small CNN trained for a few iterations on random data, on CPU: a plain PyTorch script, nothing of dlprof
in it.

    python examples/pytorch_train_cpu.py

Profile it as it is (see examples/README.md): dlprof annotates its PyTorch when it imports torch.

    dlprof --output_path=./event_files python examples/pytorch_train_cpu.py
    dlprof --backend=torch --output_path=./event_files_torch python examples/pytorch_train_cpu.py
"""

import argparse
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class SmallNet(nn.Module):
    def __init__(self, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, kernel_size=3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, kernel_size=3, padding=1)
        self.fc1 = nn.Linear(16 * 8 * 8, 32)
        self.fc2 = nn.Linear(32, num_classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(x, 1)
        x = F.relu(self.fc1(x))
        return self.fc2(x)


def train(iterations: int, batch_size: int) -> float:
    torch.manual_seed(0)
    images = torch.randn(iterations * batch_size, 3, 32, 32)
    labels = torch.randint(0, 10, (iterations * batch_size,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=batch_size, shuffle=True)
    model = SmallNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss = torch.zeros(())
    for data, target in loader:
        optimizer.zero_grad()
        output = model(data)
        loss = F.cross_entropy(output, target)
        loss.backward()
        optimizer.step()
    return loss.item()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=8)
    args = parser.parse_args(argv)

    final_loss = train(args.iterations, args.batch_size)
    print("trained %d iterations, final loss %.4f" % (args.iterations, final_loss))
    return 0


if __name__ == "__main__":
    sys.exit(main())
