"""Peak math throughput of NVIDIA data-center GPUs per precision: the denominator of Model FLOPs Utilization.

Dense (no 2:4 structured sparsity) Tensor Core peaks in TFLOP/s (TOP/s for int8) for fp16, bf16, tf32, fp8 and
int8, and the FP32 peak of the CUDA cores (`fp32`: FP32 math without Tensor Cores), per GPU, at the boost clock
of the board's default power limit. Where a datasheet gives only figures "with sparsity" (every datasheet from
A10/A30/A100's Tensor Core rows onwards marks them with an asterisk), the dense figure is half of it. A
precision the GPU's Tensor Cores do not run (bf16, tf32, fp8 and int8 on Volta; bf16, tf32 and fp8 on
Turing; fp8 on Ampere) is absent: ops in it get no peak.

Sources (NVIDIA datasheets and specification pages):
- Tesla V100: "NVIDIA Tesla V100 GPU Accelerator" datasheet (SXM2 125 / PCIe 112 TFLOPS tensor, 15.7 / 14 FP32),
  V100S PCIe datasheet (130 tensor, 16.4 FP32); DGX-1 / DGX Station / DGX-2 (V100-SXM2, -DGXS, -SXM3) use the
  SXM2 figures.
- Tesla T4: "NVIDIA T4 Tensor Core GPU" datasheet (65 TFLOPS mixed FP16/FP32, 130 INT8 TOPS, 8.1 FP32).
- A10: "NVIDIA A10 Tensor Core GPU" datasheet (FP32 31.2; TF32 62.5, BF16/FP16 125, INT8 250 dense).
- A100 40/80 GB, SXM4 and PCIe: "NVIDIA A100 Tensor Core GPU" datasheet (FP32 19.5; TF32 156, BF16/FP16 312,
  INT8 624 dense; the same peaks for every A100 form factor and memory size).
- A30: "NVIDIA A30 Tensor Core GPU" datasheet (FP32 10.3; TF32 82, BF16/FP16 165, INT8 330 dense).
- L4: "NVIDIA L4 Tensor Core GPU" datasheet (FP32 30.3; TF32 120*, BF16/FP16 242*, FP8/INT8 485* with sparsity).
- L40S: "NVIDIA L40S" datasheet (FP32 91.6; TF32 183, BF16/FP16 362.05, FP8/INT8 733 dense).
- H100 SXM, PCIe and NVL: "NVIDIA H100 Tensor Core GPU" datasheet (FP32 67 / 51 / 60; TF32 989* / 756* / 835*,
  BF16/FP16 1,979* / 1,513* / 1,671*, FP8/INT8 3,958* / 3,026* / 3,341* with sparsity).
- H200 SXM and NVL: "NVIDIA H200 Tensor Core GPU" datasheet (the H100 SXM and H100 NVL figures).
- B100, B200: HGX B100 / HGX B200 specifications, per GPU (FP32 60 / 75; TF32 1.8 / 2.2 PFLOPS*, BF16/FP16
  3.5 / 4.5*, FP8/INT8 7 / 9* with sparsity).
- GB200: GB200 NVL72 specifications, per Blackwell GPU (FP32 80; TF32 2.5 PFLOPS*, BF16/FP16 5*, FP8/INT8 10*
  with sparsity).
"""

from __future__ import annotations

import re

PRECISIONS = ("fp16", "bf16", "tf32", "fp32", "fp8", "int8")


def _dense(sparse: float) -> float:
    return sparse / 2


# model -> precision -> peak TFLOP/s (TOP/s for int8), dense
PEAKS: dict[str, dict[str, float]] = {
    "V100 SXM2": {"fp16": 125.0, "fp32": 15.7},
    "V100 PCIe": {"fp16": 112.0, "fp32": 14.0},
    "V100S PCIe": {"fp16": 130.0, "fp32": 16.4},
    "T4": {"fp16": 65.0, "int8": 130.0, "fp32": 8.1},
    "A10": {"fp16": 125.0, "bf16": 125.0, "tf32": 62.5, "int8": 250.0, "fp32": 31.2},
    "A100": {"fp16": 312.0, "bf16": 312.0, "tf32": 156.0, "int8": 624.0, "fp32": 19.5},
    "A30": {"fp16": 165.0, "bf16": 165.0, "tf32": 82.0, "int8": 330.0, "fp32": 10.3},
    "L4": {
        "fp16": _dense(242.0),
        "bf16": _dense(242.0),
        "tf32": _dense(120.0),
        "fp8": _dense(485.0),
        "int8": _dense(485.0),
        "fp32": 30.3,
    },
    "L40S": {"fp16": 362.05, "bf16": 362.05, "tf32": 183.0, "fp8": 733.0, "int8": 733.0, "fp32": 91.6},
    "H100 SXM": {
        "fp16": _dense(1979.0),
        "bf16": _dense(1979.0),
        "tf32": _dense(989.0),
        "fp8": _dense(3958.0),
        "int8": _dense(3958.0),
        "fp32": 67.0,
    },
    "H100 PCIe": {
        "fp16": _dense(1513.0),
        "bf16": _dense(1513.0),
        "tf32": _dense(756.0),
        "fp8": _dense(3026.0),
        "int8": _dense(3026.0),
        "fp32": 51.0,
    },
    "H100 NVL": {
        "fp16": _dense(1671.0),
        "bf16": _dense(1671.0),
        "tf32": _dense(835.0),
        "fp8": _dense(3341.0),
        "int8": _dense(3341.0),
        "fp32": 60.0,
    },
    "B100": {
        "fp16": _dense(3500.0),
        "bf16": _dense(3500.0),
        "tf32": _dense(1800.0),
        "fp8": _dense(7000.0),
        "int8": _dense(7000.0),
        "fp32": 60.0,
    },
    "B200": {
        "fp16": _dense(4500.0),
        "bf16": _dense(4500.0),
        "tf32": _dense(2200.0),
        "fp8": _dense(9000.0),
        "int8": _dense(9000.0),
        "fp32": 75.0,
    },
    "GB200": {
        "fp16": _dense(5000.0),
        "bf16": _dense(5000.0),
        "tf32": _dense(2500.0),
        "fp8": _dense(10000.0),
        "int8": _dense(10000.0),
        "fp32": 80.0,
    },
}
PEAKS["H200 SXM"] = PEAKS["H100 SXM"]
PEAKS["H200 NVL"] = PEAKS["H100 NVL"]

# Device names as nsys (TARGET_INFO_GPU.name) and Kineto (deviceProperties.name) record them, e.g. "Tesla
# V100-SXM2-16GB", "NVIDIA A100-SXM4-80GB", "NVIDIA A100 80GB PCIe", "NVIDIA H100 80GB HBM3", "NVIDIA H100 PCIe",
# "NVIDIA H100 NVL", "NVIDIA GB200". Checked in order on the upper-cased name, first match wins; word bounds
# keep A10G, A100X, L40, GH200 and H800 (other peaks) out.
MODEL_PATTERNS = (
    ("GB200", re.compile(r"\bGB200\b")),
    ("B200", re.compile(r"\bB200\b")),
    ("B100", re.compile(r"\bB100\b")),
    ("H200 NVL", re.compile(r"\bH200\b.*\bNVL\b")),
    ("H200 SXM", re.compile(r"\bH200\b")),
    ("H100 NVL", re.compile(r"\bH100\b.*\bNVL\b")),
    ("H100 PCIe", re.compile(r"\bH100\b.*\bPCIE\b")),
    ("H100 SXM", re.compile(r"\bH100\b")),
    ("L40S", re.compile(r"\bL40S\b")),
    ("L4", re.compile(r"\bL4\b")),
    ("A100", re.compile(r"\bA100\b")),
    ("A30", re.compile(r"\bA30\b")),
    ("A10", re.compile(r"\bA10\b")),
    ("T4", re.compile(r"\bT4\b")),
    ("V100S PCIe", re.compile(r"\bV100S\b")),
    ("V100 PCIe", re.compile(r"\bV100\b.*\bPCIE\b")),
    ("V100 SXM2", re.compile(r"\bV100\b")),
)


def gpu_model(device_name) -> str | None:
    """The table's model of a recorded device name, or None when it is not in the table."""
    if device_name is None or not isinstance(device_name, str):
        return None
    upper = device_name.upper()
    for model, pattern in MODEL_PATTERNS:
        if pattern.search(upper):
            return model
    return None


def peak_tflops(device_name, precision) -> float | None:
    """Peak TFLOP/s of a device (by its recorded name) in a precision of PRECISIONS; None when unknown."""
    model = gpu_model(device_name)
    if model is None or precision is None:
        return None
    return PEAKS[model].get(precision)
