"""Unmodified PyTorch training, profiled by tests/test_capture*.py with `dlprof python ...` on both backends:
nothing here knows about dlprof.

- `lm`: a tiny Transformer language model (Embedding, 2 TransformerEncoderLayers, a Linear head), AdamW
  with foreach, clip_grad_norm_, batches from a DataLoader with 2 worker processes;
- `cnn`: Conv2d + BatchNorm2d with an in-place relu_, then an in-place relu_ on a slice of a view (the
  backward of an in-place op on a view: CopySlices), a Linear head, SGD with momentum.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

VOCAB = 32


class TinyLM(nn.Module):
    def __init__(self, d_model: int = 16) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, d_model)
        layer = nn.TransformerEncoderLayer(d_model, nhead=2, dim_feedforward=32, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, VOCAB)

    def forward(self, tokens):
        return self.head(self.encoder(self.embed(tokens)))


class SmallCNN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        x = self.bn(self.conv(x))
        x.relu_()
        flat = F.max_pool2d(x, 2).flatten(1)
        flat[:, :8].relu_()
        return self.fc(flat)


def train_lm(steps: int) -> None:
    tokens = torch.randint(0, VOCAB, (steps * 4, 9))
    loader = DataLoader(TensorDataset(tokens), batch_size=4, num_workers=2)
    model = TinyLM()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    for (batch,) in loader:
        logits = model(batch[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()


def train_cnn(steps: int) -> None:
    model = SmallCNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    for _ in range(steps):
        images, labels = torch.randn(4, 3, 8, 8), torch.randint(0, 10, (4,))
        loss = F.cross_entropy(model(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=("lm", "cnn", "both"), default="both")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    if args.model in ("lm", "both"):
        train_lm(args.steps)
    if args.model in ("cnn", "both"):
        train_cnn(args.steps)
