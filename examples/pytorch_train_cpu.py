"""A small CNN trained for a few iterations on random data, on CPU, annotated for DLProf.

Run it plainly (annotations cost next to nothing without a profiler):

    python examples/pytorch_train_cpu.py

or under the profiler (see examples/README.md):

    dlprof --mode=pytorch --output_path=./event_files python examples/pytorch_train_cpu.py
    nsys profile -t cuda,nvtx -s none --export=sqlite -o rep python examples/pytorch_train_cpu.py
"""

import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

try:
    import dlprof_profiler.pytorch as dlprof_pytorch
except ImportError:  # running from a source checkout without installing the package
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    import dlprof_profiler.pytorch as dlprof_pytorch


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

    dlprof_pytorch.init()  # the two lines DLProf users know: import + init()
    # emit_nvtx adds PyTorch's own aten:: ranges inside ours; it needs a CUDA build of PyTorch,
    # so it is switched off on CPU-only builds (our markers alone then give names and direction).
    with torch.autograd.profiler.emit_nvtx(enabled=torch.cuda.is_available(), record_shapes=True):
        final_loss = train(args.iterations, args.batch_size)
    print(
        "trained %d iterations, final loss %.4f, annotations %s"
        % (args.iterations, final_loss, "on" if dlprof_pytorch.is_active() else "off (no profiler attached)")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
