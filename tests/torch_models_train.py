"""Training steps of small real models, run under Nsight Systems by tests/test_pytorch_instrumentation.py.

A 2-layer Transformer encoder with a linear head (AdamW, foreach), then an ``nn.Sequential`` of two Linear
layers (SGD with momentum, foreach, gradient clipping); the batches come from a DataLoader with one forked
worker, which writes what ``is_active()`` says in the worker to ``--worker-report``.
"""

import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import dlprof_profiler.pytorch as dlprof_pytorch  # noqa: E402


class TinyTransformer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model=16, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        return self.head(self.encoder(x)).mean(dim=1)


def report_worker(path: str):
    def init(worker_id: int) -> None:
        with open(path, "w") as out:
            out.write(f"{os.getpid()} {int(dlprof_pytorch.is_active())}\n")

    return init


def main(argv=None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=2)
    parser.add_argument("--worker-report", required=True)
    args = parser.parse_args(argv)
    dlprof_pytorch.init()
    torch.manual_seed(0)
    n = 4 * args.iterations
    data = TensorDataset(torch.randn(n, 5, 16), torch.randint(0, 4, (n,)))
    loader = DataLoader(data, batch_size=4, num_workers=1, worker_init_fn=report_worker(args.worker_report))
    model = TinyTransformer()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    for x, y in loader:
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()

    seq = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    sgd = torch.optim.SGD(seq.parameters(), lr=0.1, momentum=0.9, foreach=True)
    for _ in range(args.iterations):
        sgd.zero_grad()
        seq(torch.randn(4, 8)).square().mean().backward()
        torch.nn.utils.clip_grad_norm_(seq.parameters(), 1.0)
        sgd.step()
    torch.linalg.matrix_norm(seq[0].weight.detach())
    print(f"pid {os.getpid()} annotations {'on' if dlprof_pytorch.is_active() else 'off'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
