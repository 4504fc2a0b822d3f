"""FLOPs per call, achieved TFLOP/s and Model FLOPs Utilization (dlprof_profiler/engine/flops.py, gpu_peaks.py):
hand-computed FLOPs of every op family forward and backward, the precedence of the trace's own `flops`
argument, MFU and achieved TFLOP/s on generated nsys and Kineto profiles computed by hand, the same figures out
of core, in the database and in the viewer's tables, and PyTorch's own FLOP counter on a real run."""

from __future__ import annotations

import csv
import gzip
import io
import json
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from dlprof_profiler.engine import flops as F
from dlprof_profiler.engine import gpu_peaks
from dlprof_profiler.outputs.reports import detailed_report, summary_report, write_report
from tests import profiles
from tests.analysis import analyze
from tests.data import KINETO
from tests.kineto_builder import KinetoTrace
from tests.profiles import FLOPS_BACKWARD, FLOPS_OPS, FLOPS_SPAN, run_dlprof

# ---------------------------------------------------------------------------- formulas, by hand

FORWARD = [
    # op type, input shapes, output shapes, FLOPs per call
    ("mm", "<64, 128>; <128, 32>", None, 2 * 64 * 128 * 32),
    ("aten::mm", "<64, 128>; <128, 32>", None, 2 * 64 * 128 * 32),
    ("_scaled_mm", "<64, 128>; <128, 32>; <1, 1>", None, 2 * 64 * 128 * 32),
    ("mm", "<64, 128>; <127, 32>", None, None),  # inner dimensions differ
    ("addmm", "<32>; <64, 128>; <128, 32>", None, 2 * 64 * 128 * 32),  # bias additions not counted
    ("addmm", "<64, 32>; <64, 128>; <128, 32>", None, 2 * 64 * 128 * 32),
    ("addmm", "<>; <64, 128>; <128, 32>", None, 2 * 64 * 128 * 32),  # a 0-d bias
    ("bmm", "<8, 64, 128>; <8, 128, 32>", None, 2 * 8 * 64 * 128 * 32),
    ("bmm", "<8, 64, 128>; <4, 128, 32>", None, None),
    ("baddbmm", "<8, 64, 32>; <8, 64, 128>; <8, 128, 32>", None, 2 * 8 * 64 * 128 * 32),
    ("matmul", "<64, 128>; <128, 32>", None, 2 * 64 * 128 * 32),
    ("matmul", "<128>; <128, 32>", None, 2 * 128 * 32),  # vector x matrix
    ("matmul", "<4, 64, 128>; <128>", None, 2 * 4 * 64 * 128),  # batched matrix x vector
    ("matmul", "<4, 1, 64, 128>; <3, 128, 32>", None, 2 * (4 * 3) * 64 * 128 * 32),  # broadcast batch
    ("matmul", "<4, 64, 128>; <3, 128, 32>", None, None),  # batch dimensions that do not broadcast
    ("__matmul__", "<64, 128>; <128, 32>", None, 2 * 64 * 128 * 32),
    ("__rmatmul__", "<128, 32>; <64, 128>", None, 2 * 64 * 128 * 32),  # b.__rmatmul__(a) = a @ b
    ("linear", "<N:4, K:1024>; <M:32, K:1024>; <32>", None, 2 * 4 * 1024 * 32),
    ("linear", "<2, 16, 512>; <2048, 512>", None, 2 * (2 * 16) * 512 * 2048),
    ("linear", "<4, 1024>; <32, 1000>", None, None),
    # convolutions: 2 x prod(output) x C_in/groups x prod(kernel); transposed: 2 x prod(input) x C_out/groups x ...
    (
        "conv2d",
        "<N:4, C:3, H:8, W:8>; <K:8, C:3, R:3, S:3>; <8>",
        "<N:4, K:8, P:8, Q:8>",
        2 * (4 * 8 * 8 * 8) * (3 * 3 * 3),
    ),
    ("conv2d", "<2, 16, 10, 10>; <32, 4, 3, 3>", "<2, 32, 8, 8>", 2 * (2 * 32 * 8 * 8) * (4 * 3 * 3)),  # 4 groups
    ("conv2d", "<3, 8, 8>; <8, 3, 3, 3>", "<8, 6, 6>", 2 * (8 * 6 * 6) * (3 * 3 * 3)),  # unbatched
    ("conv2d", "<4, 3, 8, 8>; <8, 3, 3, 3>", None, None),  # no output shape: strides and padding unknown
    ("conv2d", "<4, 3, 8, 8>; <8, 3, 3, 3>", "<4, 9, 8, 8>", None),  # output channels are not the weight's
    ("conv1d", "<N:2, C:3, W:10>; <K:4, C:3, S:3>", "<N:2, K:4, Q:4>", 2 * (2 * 4 * 4) * (3 * 3)),
    ("conv3d", "<1, 2, 4, 4, 4>; <2, 1, 3, 3, 3>", "<1, 2, 4, 4, 4>", 2 * (2 * 4 * 4 * 4) * (1 * 27)),
    ("conv_transpose2d", "<4, 8, 8, 8>; <8, 4, 2, 2>; <4>", None, 2 * (4 * 8 * 8 * 8) * (4 * 2 * 2)),
    ("conv_transpose1d", "<2, 6, 5>; <6, 2, 3>", None, 2 * (2 * 6 * 5) * (2 * 3)),
    ("conv_transpose2d", "<4, 8, 8, 8>; <7, 4, 2, 2>", None, None),  # input channels are not the weight's
    # attention: QK^T 2 L S E + (softmax) V 2 L S Ev per batch and head
    (
        "scaled_dot_product_attention",
        "<2, 16, 128, 64>; <2, 16, 256, 64>; <2, 16, 256, 32>",
        None,
        2 * (2 * 16) * 128 * 256 * (64 + 32),
    ),
    (
        "scaled_dot_product_attention",
        "<2, 16, 128, 64>; <2, 4, 128, 64>; <2, 4, 128, 64>",  # grouped-query attention: 16 query heads
        None,
        2 * (2 * 16) * 128 * 128 * (64 + 64),
    ),
    (
        "_scaled_dot_product_flash_attention",
        "<2, 16, 128, 64>; <2, 16, 128, 64>; <2, 16, 128, 64>",
        None,
        2 * 32 * 128 * 128 * 128,
    ),
    ("_scaled_dot_product_efficient_attention", "<4, 8, 32>; <4, 16, 32>; <4, 16, 8>", None, 2 * 4 * 8 * 16 * 40),
    (
        "_flash_attention_forward",
        "<2, 128, 16, 64>; <2, 256, 16, 64>; <2, 256, 16, 64>",
        None,
        2 * 32 * 128 * 256 * 128,
    ),
    (
        "_efficient_attention_forward",
        "<2, 128, 16, 64>; <2, 256, 16, 64>; <2, 256, 16, 32>",
        None,
        2 * 32 * 128 * 256 * 96,
    ),
    ("scaled_dot_product_attention", "<2, 16, 128, 64>; <2, 16, 256, 32>; <2, 16, 256, 64>", None, None),  # E differs
    ("relu", "<512, 1024>", None, None),
    ("Conv2D", "<4, 3, 8, 8>; <3, 3, 3, 8>", None, None),  # TensorFlow's types have no formula
]

BACKWARD_ENTRY_POINTS = [
    # (grad_out, q, k, v, ...): twice the forward's two products
    (
        "_scaled_dot_product_flash_attention_backward",
        "<2, 16, 128, 64>; <2, 16, 128, 64>; <2, 16, 256, 64>; <2, 16, 256, 64>; <2, 16, 128, 64>",
        2 * (2 * (2 * 16) * 128 * 256 * 128),
    ),
    (
        "_efficient_attention_backward",
        "<2, 128, 16, 64>; <2, 128, 16, 64>; <2, 256, 16, 64>; <2, 256, 16, 64>",
        2 * (2 * 32 * 128 * 256 * 128),
    ),
]


@pytest.mark.parametrize("op_type,shapes,output,expected", FORWARD)
def test_forward_formulas(op_type, shapes, output, expected):
    assert F.formula_flops(op_type, shapes, output) == expected


@pytest.mark.parametrize("op_type,shapes,expected", BACKWARD_ENTRY_POINTS)
def test_backward_entry_points(op_type, shapes, expected):
    assert F.formula_flops(op_type, shapes) == expected


def test_formulas_agree_with_pytorchs_flop_counter():
    """torch.utils.flop_counter's formulas on the same shapes (the forward families where both count alike)."""
    fc = pytest.importorskip("torch.utils.flop_counter")
    assert F.formula_flops("mm", "<64, 128>; <128, 32>") == fc.mm_flop([64, 128], [128, 32])
    assert F.formula_flops("addmm", "<32>; <64, 128>; <128, 32>") == fc.addmm_flop([32], [64, 128], [128, 32])
    assert F.formula_flops("bmm", "<8, 64, 128>; <8, 128, 32>") == fc.bmm_flop([8, 64, 128], [8, 128, 32])
    assert F.formula_flops("baddbmm", "<8, 64, 32>; <8, 64, 128>; <8, 128, 32>") == fc.baddbmm_flop(
        [8, 64, 32], [8, 64, 128], [8, 128, 32]
    )
    for x, w, out, transposed in (
        ([4, 3, 8, 8], [8, 3, 3, 3], [4, 8, 8, 8], False),
        ([2, 16, 10, 10], [32, 4, 3, 3], [2, 32, 8, 8], False),
        ([2, 3, 10], [4, 3, 3], [2, 4, 4], False),
        ([4, 8, 8, 8], [8, 4, 2, 2], [4, 4, 16, 16], True),
    ):
        nd = len(x) - 2
        kind = f"conv_transpose{nd}d" if transposed else f"conv{nd}d"
        text = "; ".join("<" + ", ".join(map(str, s)) + ">" for s in (x, w))
        out_text = "<" + ", ".join(map(str, out)) + ">"
        assert F.formula_flops(kind, text, out_text) == fc.conv_flop_count(x, w, out, transposed), (x, w)
    q, k, v = [2, 16, 128, 64], [2, 16, 256, 64], [2, 16, 256, 32]
    text = "; ".join("<" + ", ".join(map(str, s)) + ">" for s in (q, k, v))
    assert F.formula_flops("scaled_dot_product_attention", text) == fc.sdpa_flop_count(q, k, v)


def test_shape_texts_and_the_traces_own_figure():
    assert F.parse_shapes("<N:4, C:3, H:8, W:8>; <>; <8>") == [[4, 3, 8, 8], [8]]
    assert F.parse_shapes("") == [] and F.parse_shapes(None) == []
    assert F.trace_flops("flops=1024") == 1024 and F.trace_flops("stride=1, flops=7, padding=0") == 7
    assert F.trace_flops("stride=(1, 1)") is None and F.trace_flops(None) is None and F.trace_flops("myflops=3") is None


# ---------------------------------------------------------------------------- per op: backward and precedence


def _ops(rows):
    """An op table and its first calls: rows of (op_index, name, direction, op type, input shapes, output shapes,
    parameters)."""
    frame = pd.DataFrame(
        rows, columns=["op_index", "name", "direction", "op_type", "input_shapes", "output_shapes", "parameters"]
    )
    first = {c: frame[c].to_numpy(dtype=object) for c in F.FIRST_CALL_COLUMNS}
    return frame, first


def test_backward_ops_count_twice_their_forward_ops():
    mm = 2 * 64 * 128 * 32
    small, large = 2 * 4 * 8 * 16, 2 * 8 * 8 * 16
    frame, first = _ops(
        [
            # one forward call per iteration: its bprop op (shapes of the gradient only) counts twice
            (0, "/fc/linear", "fprop", "linear", "<N:4, K:1024>; <M:32, K:1024>", None, None),
            (1, "/fc/linear", "bprop", "linear", "<4, 32>", None, None),
            # a name called twice per iteration with other shapes: the bprop ops in reverse order
            (2, "/loop/mm", "fprop", "mm", "<4, 8>; <8, 16>", None, None),
            (3, "/loop/mm", "fprop", "mm", "<8, 8>; <8, 16>", None, None),
            (4, "/loop/mm", "bprop", "mm", None, None, None),
            (5, "/loop/mm", "bprop", "mm", None, None, None),
            # different forward shapes and fewer bprop ops: unknown
            (6, "/odd/mm", "fprop", "mm", "<4, 8>; <8, 16>", None, None),
            (7, "/odd/mm", "fprop", "mm", "<8, 8>; <8, 16>", None, None),
            (8, "/odd/mm", "bprop", "mm", None, None, None),
            # equal forward shapes: every bprop op of the name
            (9, "/same/mm", "fprop", "mm", "<64, 128>; <128, 32>", None, None),
            (10, "/same/mm", "fprop", "mm", "<64, 128>; <128, 32>", None, None),
            (11, "/same/mm", "bprop", "mm", None, None, None),
            # no forward op: unknown, unless a backward entry point of its own
            (12, "/orphan/mm", "bprop", "mm", "<64, 128>; <128, 32>", None, None),
            (
                13,
                "/attn/flash",
                "bprop",
                "_scaled_dot_product_flash_attention_backward",
                "<1, 2, 4, 8>; <1, 2, 4, 8>; <1, 2, 4, 8>; <1, 2, 4, 8>",
                None,
                None,
            ),
            # the trace's own figure wins over the formula; the bprop op counts twice that
            (14, "/k/mm", "fprop", "mm", "<64, 128>; <128, 32>", None, "flops=999"),
            (15, "/k/mm", "bprop", "mm", None, None, None),
            (16, "/k/relu", "fprop", "relu", "<8>", None, "flops=5"),
            (17, "/nvtx/range", "", "my_range", None, None, None),
        ]
    )
    got = F.op_flops(frame, first)
    assert str(got.dtype) == "Int64"
    expected = [
        2 * 4 * 1024 * 32,
        2 * (2 * 4 * 1024 * 32),
        small,
        large,
        2 * large,
        2 * small,
        small,
        large,
        None,
        mm,
        mm,
        2 * mm,
        None,
        2 * (2 * 2 * 4 * 4 * 16),
        999,
        1998,
        5,
        None,
    ]
    assert [None if pd.isna(v) else int(v) for v in got] == expected


def test_gpu_names_as_nsys_and_kineto_record_them():
    cases = {
        "Tesla V100-SXM2-16GB": "V100 SXM2",
        "Tesla V100-DGXS-32GB": "V100 SXM2",
        "Tesla V100-PCIE-32GB": "V100 PCIe",
        "Tesla V100S-PCIE-32GB": "V100S PCIe",
        "Tesla T4": "T4",
        "NVIDIA A10": "A10",
        "NVIDIA A100-SXM4-40GB": "A100",
        "NVIDIA A100-SXM4-80GB": "A100",
        "NVIDIA A100-PCIE-40GB": "A100",
        "NVIDIA A100 80GB PCIe": "A100",
        "NVIDIA A100-PG509-200": "A100",
        "NVIDIA A30": "A30",
        "NVIDIA L4": "L4",
        "NVIDIA L40S": "L40S",
        "NVIDIA H100 80GB HBM3": "H100 SXM",
        "NVIDIA H100 PCIe": "H100 PCIe",
        "NVIDIA H100 NVL": "H100 NVL",
        "NVIDIA H200": "H200 SXM",
        "NVIDIA H200 NVL": "H200 NVL",
        "NVIDIA B100": "B100",
        "NVIDIA B200": "B200",
        "NVIDIA GB200": "GB200",
        # other chips, other peaks: not in the table
        "NVIDIA A10G": None,
        "NVIDIA L40": None,
        "NVIDIA GH200 480GB": None,
        "NVIDIA H800": None,
        "AMD Radeon Graphics": None,
        "NVIDIA GeForce RTX 4090": None,
        None: None,
    }
    assert {name: gpu_peaks.gpu_model(name) for name in cases} == cases
    # dense peaks: the datasheets' figures, halved where they are given with sparsity
    assert gpu_peaks.peak_tflops("NVIDIA A100-SXM4-80GB", "fp16") == 312.0
    assert gpu_peaks.peak_tflops("NVIDIA A100-SXM4-80GB", "tf32") == 156.0
    assert gpu_peaks.peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.5
    assert gpu_peaks.peak_tflops("NVIDIA H100 80GB HBM3", "fp8") == 1979.0
    assert gpu_peaks.peak_tflops("NVIDIA H100 PCIe", "fp16") == 756.5
    assert gpu_peaks.peak_tflops("NVIDIA B200", "fp16") == 2250.0
    assert gpu_peaks.peak_tflops("NVIDIA L4", "fp8") == 242.5
    assert gpu_peaks.peak_tflops("Tesla V100-SXM2-16GB", "fp16") == 125.0
    assert gpu_peaks.peak_tflops("Tesla V100-SXM2-16GB", "bf16") is None  # no BF16 Tensor Cores on Volta
    assert gpu_peaks.peak_tflops("NVIDIA A100-SXM4-80GB", "fp8") is None
    assert all(set(p) <= set(gpu_peaks.PRECISIONS) and "fp32" in p for p in gpu_peaks.PEAKS.values())


def test_the_precision_of_an_ops_peak():
    assert F.peak_precision("float16", "float32", True, None) == "fp16"  # the kernels show what ran
    assert F.peak_precision(None, "bfloat16", True, None) == "bf16"
    assert F.peak_precision("float32", None, True, None) == "tf32"  # FP32 on Tensor Cores
    assert F.peak_precision("float32", None, False, None) == "fp32"
    assert F.peak_precision(None, "float32", True, True) == "fp16"  # autocast: the markers show the input type
    assert F.peak_precision(None, "float", False, True) == "fp32"
    assert F.peak_precision(None, "float8_e4m3fn", True, None) == "fp8"
    assert F.peak_precision(None, "int8", True, None) == "int8"
    assert F.peak_precision("float64", "float64", False, None) is None
    assert F.peak_precision(None, None, True, None) is None


# ---------------------------------------------------------------------------- a generated nsys profile


@pytest.fixture(scope="module")
def flops_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("flops")
    export = profiles.flops_profile(base / "flops.sqlite", iterations=3)
    out = base / "out"
    run_dlprof(f"--database={export}", "--reports=summary,detail", "--formats=csv,json", f"--output_path={out}")
    return {"export": export, "out": out, "db": out / "dlprof_dldb.sqlite"}


def _detailed(out: Path) -> dict:
    rows = list(csv.reader(io.StringIO((out / "dlprof_detailed.csv").read_text())))
    header = rows[1]
    return {(r[1], r[2]): dict(zip(header, r)) for r in rows[2:]}


def _summary(out: Path) -> dict:
    return dict(line.split(",", 1) for line in (out / "dlprof_summary.csv").read_text().splitlines() if "," in line)


@pytest.mark.slow
def test_flops_achieved_tflops_and_mfu_of_a_generated_nsys_profile(flops_run):
    """flops_profile: 3 iterations on an A100-SXM4-80GB; FP16 Tensor Core GEMMs (mm, linear and their backward
    ops), an FP32 sgemm (bmm), an elementwise relu."""
    iterations = 3
    rows = _detailed(flops_run["out"])
    gpu_ns, known = 0, 0
    ideal_ns = 0.0  # time the FLOPs take at the peak of their precision: 312 TFLOP/s FP16, 19.5 FP32
    for op, (_, flops, kernel, dur) in FLOPS_OPS.items():
        row = rows[(f"/{op}", "fprop")]
        if flops is None:
            assert row["FLOPs per Call"] == "" and row["Achieved TFLOP/s"] == ""
            continue
        assert int(row["FLOPs per Call"]) == flops and int(row["No. Calls"]) == iterations
        assert row["Achieved TFLOP/s"] == f"{flops / dur / 1e3:.3f}"  # 3 calls' FLOPs over 3 kernels
        gpu_ns, known = gpu_ns + iterations * dur, known + iterations * flops
        ideal_ns += iterations * flops / ((312.0 if kernel == profiles.HGEMM else 19.5) * 1e3)
        if op in FLOPS_BACKWARD:  # the backward op: twice the FLOPs of its forward op
            back = rows[(f"/{op}", "bprop")]
            dur = FLOPS_BACKWARD[op][1]
            assert int(back["FLOPs per Call"]) == 2 * flops and back["Input Shapes"] == ""
            assert back["Achieved TFLOP/s"] == f"{2 * flops / dur / 1e3:.3f}"
            gpu_ns, known = gpu_ns + iterations * dur, known + iterations * 2 * flops
            ideal_ns += iterations * 2 * flops / (312.0 * 1e3)
    wall = (iterations - 1) * FLOPS_SPAN + 570_000  # first range to the last HGEMM's end
    summary = _summary(flops_run["out"])
    assert int(summary["Wall Clock Time (ns)"]) == wall
    assert summary["Achieved TFLOP/s"] == f"{known / gpu_ns / 1e3:.3f}"
    assert summary["Model FLOPs Utilization (%)"] == f"{round(100 * ideal_ns / wall, 1):.1f}"
    assert float(summary["Model FLOPs Utilization (%)"]) == pytest.approx(39.7)
    # the summary's lines follow DLProf's in its "Summary Report" section (then the communication lines)
    lines = (flops_run["out"] / "dlprof_summary.csv").read_text().splitlines()
    at = lines.index("Summary Report")
    assert lines[at + 11].startswith("Achieved TFLOP/s,") and lines[at + 12].startswith("Model FLOPs Utilization (%),")
    assert lines[at + 13] == "Communication Time (ns),0" and lines[at + 14] == "Overlapped Communication %,0.0"
    assert lines[at + 15] == ""
    # JSON: the same figures as numbers, null where unknown
    (section,) = json.loads((flops_run["out"] / "dlprof_detailed.json").read_text())["sections"]
    by_name = {(r[1], r[2]): dict(zip(section["columns"], r)) for r in section["rows"]}
    for key, row in rows.items():
        doc = by_name[key]
        assert doc["FLOPs per Call"] == (int(row["FLOPs per Call"]) if row["FLOPs per Call"] else None)
        assert doc["Achieved TFLOP/s"] == (float(row["Achieved TFLOP/s"]) if row["Achieved TFLOP/s"] else None)


def test_the_database_and_the_viewer_tables_hold_the_figures(flops_run):
    from dlprof_plugin.runs import RunInfo, StaticRuns
    from dlprof_plugin.service import Service

    con = sqlite3.connect(flops_run["db"])
    stored = {
        (name, direction): (per_call, tflops)
        for name, direction, per_call, tflops in con.execute(
            "SELECT o.op_name, o.direction, n.flops_per_call, n.achieved_tflops FROM op_nodes n "
            "JOIN read_only_ops o ON o.op_index = n.op_index WHERE n.aggr_id = 1"
        )
    }
    con.close()
    rows = _detailed(flops_run["out"])
    for key, row in rows.items():
        per_call, tflops = stored[key]
        assert (str(per_call) if per_call is not None else "") == row["FLOPs per Call"]
        assert (f"{tflops:.3f}" if tflops is not None else "") == row["Achieved TFLOP/s"]
    service = Service(StaticRuns({"r": RunInfo(run="r", database=str(flops_run["db"]), shown_database="db")}))
    ops = _table(service, "table/ops", run="r", limit=100, sort="flops_per_call", order="desc")
    labels = {c["key"]: c["label"] for c in ops["columns"]}
    assert labels["flops_per_call"] == "FLOPs per Call" and labels["achieved_tflops"] == "Achieved TFLOP/s"
    got = {(r["op_name"], r["direction"]): (r["flops_per_call"], r["achieved_tflops"]) for r in ops["rows"]}
    assert got == stored
    assert [r["flops_per_call"] for r in ops["rows"]][:2] == [2 * FLOPS_OPS["aten::mm"][1], FLOPS_OPS["aten::mm"][1]]
    kernels = _table(service, "table/kernels", run="r", limit=100)
    for r in kernels["rows"]:  # a kernel row shows the figures of the op launching it
        assert (r["flops_per_call"], r["achieved_tflops"]) == stored[(r["op_name"], r["direction"])]


def _table(service, route: str, **args) -> dict:
    from werkzeug.test import EnvironBuilder
    from werkzeug.wrappers import Request

    request = Request(EnvironBuilder(path=f"/{route}", query_string=args).get_environ())
    reply = service.handle(route, request, None, "")
    assert reply.status == 200, reply.body
    doc = json.loads(reply.body)
    keys = [c["key"] for c in doc["columns"]]
    doc["rows"] = [dict(zip(keys, r)) for r in doc["rows"]]
    return doc


@pytest.mark.slow
def test_a_database_written_before_the_figures_stays_readable_and_gains_aggregations(flops_run, tmp_path):
    from dlprof_plugin.runs import RunInfo, StaticRuns
    from dlprof_plugin.service import Service

    old = tmp_path / "old" / "dlprof_dldb.sqlite"
    old.parent.mkdir()
    old.write_bytes(flops_run["db"].read_bytes())
    con = sqlite3.connect(old)
    con.execute("ALTER TABLE op_nodes DROP COLUMN flops_per_call")
    con.execute("ALTER TABLE op_nodes DROP COLUMN achieved_tflops")
    con.commit()
    con.close()
    service = Service(StaticRuns({"r": RunInfo(run="r", database=str(old), shown_database="db")}))
    ops = _table(service, "table/ops", run="r", limit=100)
    meta = {c["key"]: c for c in ops["columns"]}
    assert meta["flops_per_call"].get("sortable") is False and meta["achieved_tflops"].get("sortable") is False
    assert {r["flops_per_call"] for r in ops["rows"]} == {None} and len(ops["rows"]) == 7
    # updating the run (a new aggregation appended to the old file) writes the columns it has
    run_dlprof(f"--database={old}", f"--output_path={old.parent}", "--force=true", "--iter_start=1", "--reports=detail")
    con = sqlite3.connect(old)
    assert con.execute("SELECT count(*) FROM op_nodes WHERE aggr_id = 2").fetchone()[0] == 7
    con.close()
    rows = _detailed(old.parent)
    assert rows[("/aten::mm", "bprop")]["FLOPs per Call"] == str(2 * FLOPS_OPS["aten::mm"][1])


# ---------------------------------------------------------------------------- a generated Kineto trace

T0 = 1_000_000
STEP = 400_000
LINEAR_DIMS = [[256, 1024], [4096, 1024], [4096]]
LINEAR_FLOPS = 2 * 256 * 1024 * 4096
MM_TRACE_FLOPS = 5_000_000_000  # the trace's own figure (the formula would give 2 x 1024^3)
BF16_GEMM = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x256x64_warpgroupsize2x1x1_execute_kernel_cublas"
KERNELS = {"linear": 40_000, "mm": 20_000, "linear_bprop": 80_000}


def kineto_flops_trace(steps: int = 3) -> KinetoTrace:
    """torch.profiler on an H100 SXM, per step (S = T0 + i * STEP, ns), kernels back to back from S+10000:
      [S, S+150000)        ProfilerStep#i+1 (ends with its last kernel)
      [S+1000, S+5000)     aten::linear (bf16, Input Dims LINEAR_DIMS), seq 10i+1 > aten::addmm seq 10i+2
                           -> BF16_GEMM 40 us
      [S+6000, S+8000)     aten::mm [[1024, 1024], [1024, 1024]] with `flops` MM_TRACE_FLOPS -> BF16_GEMM 20 us
      autograd thread:
      [S+20000, S+30000)   evaluate_function: AddmmBackward0 seq 10i+2 > AddmmBackward0 -> BF16_GEMM 80 us
    The profiler span starts at T0; the last kernel of a step ends at S+150000, with the step."""
    k = KinetoTrace()
    k.device(0, name="NVIDIA H100 80GB HBM3", sms=132)
    k.metadata({1: "python", 2: "pt_autograd_0"})
    k.span(T0, steps * STEP)
    for i in range(steps):
        s = T0 + i * STEP
        gpu = s + 10_000
        k.annotation(1, s, 150_000, f"ProfilerStep#{i + 1}")
        types = ["c10::BFloat16"] * 3
        k.cpu_op(1, s + 1000, 4000, "aten::linear", seq=10 * i + 1, dims=LINEAR_DIMS, types=types)
        k.cpu_op(1, s + 1500, 3000, "aten::addmm", seq=10 * i + 2, dims=[[4096], [256, 1024], [1024, 4096]])
        c = k.runtime(1, s + 2000, 1000)
        k.kernel(BF16_GEMM, gpu, KERNELS["linear"], c)
        gpu += KERNELS["linear"]
        k.cpu_op(
            1,
            s + 6000,
            2000,
            "aten::mm",
            dims=[[1024, 1024], [1024, 1024]],
            types=["c10::BFloat16"] * 2,
            extra_args={"flops": MM_TRACE_FLOPS},
        )
        c = k.runtime(1, s + 6500, 1000)
        k.kernel(BF16_GEMM, gpu, KERNELS["mm"], c)
        gpu += KERNELS["mm"]
        k.cpu_op(
            2, s + 20_000, 10_000, "autograd::engine::evaluate_function: AddmmBackward0", seq=10 * i + 2, fwd_tid=1
        )
        k.cpu_op(2, s + 20_500, 9000, "AddmmBackward0", seq=10 * i + 2, fwd_tid=1, dims=[[256, 4096]])
        c = k.runtime(2, s + 21_000, 1000)
        k.kernel(BF16_GEMM, gpu, KERNELS["linear_bprop"], c)
    return k


def test_achieved_tflops_of_a_kineto_trace_and_its_own_flops_argument(tmp_path):
    steps = 3
    a = analyze(kineto_flops_trace(steps).write(tmp_path / "t.pt.trace.json.gz", gz=True))
    ops = a.agg().ops.set_index(["name", "direction"])
    linear = ops.loc[("/ProfilerStep/aten::linear", "fprop")]
    back = ops.loc[("/ProfilerStep/aten::linear", "bprop")]
    mm = ops.loc[("/ProfilerStep/aten::mm", "fprop")]
    assert linear["flops_per_call"] == LINEAR_FLOPS and back["flops_per_call"] == 2 * LINEAR_FLOPS
    assert mm["flops_per_call"] == MM_TRACE_FLOPS  # the trace's figure, not 2 x 1024^3
    assert linear["achieved_tflops"] == pytest.approx(LINEAR_FLOPS / KERNELS["linear"] / 1e3)
    assert back["achieved_tflops"] == pytest.approx(2 * LINEAR_FLOPS / KERNELS["linear_bprop"] / 1e3)
    assert mm["achieved_tflops"] == pytest.approx(MM_TRACE_FLOPS / KERNELS["mm"] / 1e3)
    # the reports: the summary over the three ops, MFU against the H100 SXM's dense BF16 peak (989.5 TFLOP/s)
    agg = a.agg()
    known = steps * (3 * LINEAR_FLOPS + MM_TRACE_FLOPS)
    gpu = steps * sum(KERNELS.values())
    wall = (steps - 1) * STEP + 150_000  # the first step's start (the span's) to the last step's end (its kernel's)
    assert agg.wall_time == wall
    out = {}
    for report in (summary_report(agg, a.trace.system, a.trace.meta, a.trace.devices, a.corr.config),):
        (path,) = write_report(report, tmp_path, "k", ["csv"])
        out = dict(line.split(",", 1) for line in path.read_text().splitlines() if "," in line)
    assert out["Achieved TFLOP/s"] == f"{known / gpu / 1e3:.3f}"
    assert out["Model FLOPs Utilization (%)"] == f"{round(100 * known / (989.5 * 1e3) / wall, 1):.1f}"
    (path,) = write_report(detailed_report(agg), tmp_path, "k", ["csv"])
    rows = {r[1]: r for r in csv.reader(io.StringIO(path.read_text())) if len(r) > 2 and r[2] == "fprop"}
    assert rows["/ProfilerStep/aten::mm"][-2:] == [str(MM_TRACE_FLOPS), f"{MM_TRACE_FLOPS / 20_000 / 1e3:.3f}"]


def test_convolutions_of_a_kineto_trace_take_their_output_shape_from_concrete_inputs(tmp_path):
    """PyTorch 2.x records stride, padding and dilation of aten::conv2d as `Concrete Inputs`: the output shape
    (32 - 3 + 2)/2 + 1 = 16 gives 2 x (8 x 16 x 16 x 16) x (3 x 3 x 3); a padding the rule cannot size ("same"
    as text) or no Concrete Inputs (older traces) leaves the FLOPs unknown."""
    k = KinetoTrace()
    k.device(0)
    k.metadata({1: "python"})
    k.span(T0, 100_000)
    dims = [[8, 3, 32, 32], [16, 3, 3, 3], [16], [], [], [], []]
    for n, concrete in enumerate(
        (["", "", "", "[2, 2]", "[1, 1]", "[1, 1]", "1"], ["", "", "", "[1, 1]", "same", "[1, 1]", "1"], None)
    ):
        k.annotation(1, T0 + n * 20_000, 10_000, f"block{n}")
        extra = {"Concrete Inputs": concrete} if concrete is not None else None
        k.cpu_op(1, T0 + n * 20_000 + 1000, 5000, "aten::conv2d", seq=n, dims=dims, extra_args=extra)
        c = k.runtime(1, T0 + n * 20_000 + 2000, 1000)
        k.kernel("implicit_convolve_sgemm", T0 + n * 20_000 + 4000, 5000, c)
    ops = analyze(k.write(tmp_path / "c.json")).agg().ops.set_index("name")
    assert ops.loc["/block0/aten::conv2d", "flops_per_call"] == 2 * (8 * 16 * 16 * 16) * (3 * 3 * 3)
    assert pd.isna(ops.loc["/block1/aten::conv2d", "flops_per_call"])
    assert pd.isna(ops.loc["/block2/aten::conv2d", "flops_per_call"])


def test_real_cpu_trace_convolution_flops_from_its_concrete_inputs():
    """PyTorch 2.13 on CPU (a small CNN): each aten::conv2d's FLOPs from the Input Dims and Concrete Inputs
    written in the file (read here with a regular expression: the file is not valid JSON, see
    tests/data/README.md), the output size by the convolution arithmetic."""
    import re

    from tests.data import KINETO_MALFORMED

    path = KINETO_MALFORMED / "pytorch2.13_cpu_unescaped_name.pt.trace.json.gz"
    text = gzip.open(path).read().decode("utf-8", "replace")
    expected = set()
    for m in re.finditer(r'"name": "aten::conv2d",.*?"args": \{(.*?)\n    \}', text, re.S):
        args = json.loads("{" + m.group(1) + "}")
        (x, w), (stride, padding, dilation) = (
            args["Input Dims"][:2],
            [json.loads(v) for v in args["Concrete Inputs"][3:6]],
        )
        out = [(x[2 + i] + 2 * padding[i] - dilation[i] * (w[2 + i] - 1) - 1) // stride[i] + 1 for i in range(2)]
        expected.add(2 * (x[0] * w[0] * out[0] * out[1]) * (w[1] * w[2] * w[3]))
    assert len(expected) == 2
    a = analyze(path)
    ops = a.agg().ops
    conv = ops[ops["op_type"] == "conv2d"]
    assert set(conv.loc[conv["direction"] == "fprop", "flops_per_call"].astype(int)) == expected
    assert set(conv.loc[conv["direction"] == "bprop", "flops_per_call"].astype(int)) == {2 * v for v in expected}
    # no GPU time: no achieved TFLOP/s, no MFU, per op or in the summary
    assert ops["achieved_tflops"].isna().all()
    s = a.agg().summary
    assert F.summary_figures(ops, a.trace.devices, s["wall_time"], s["n_visible_gpus"], None) == {
        "achieved_tflops": None,
        "mfu_pct": None,
    }


def test_a_gpu_missing_from_the_table_leaves_mfu_empty(tmp_path):
    k = kineto_flops_trace(2)
    k.top["deviceProperties"][0]["name"] = "NVIDIA GeForce RTX 4090"
    a = analyze(k.write(tmp_path / "t.json"))
    (path,) = write_report(
        summary_report(a.agg(), a.trace.system, a.trace.meta, a.trace.devices, a.corr.config), tmp_path, "k", ["csv"]
    )
    lines = path.read_text().splitlines()
    assert "Model FLOPs Utilization (%)," in lines and any(
        line.startswith("Achieved TFLOP/s,") and line != "Achieved TFLOP/s," for line in lines
    )


# ---------------------------------------------------------------------------- real traces


@pytest.mark.slow
def test_real_trace_matmul_flops_equal_the_shapes_in_its_json():
    """HTA's 8xA100 trace: every fprop linear, addmm, mm and bmm op's FLOPs per call, from the `Input Dims` of
    the trace's events of that name read here with json (the first call's shapes are among them)."""
    path = KINETO / "pytorch_8xa100_rank3.json.gz"
    events = json.loads(gzip.open(path).read())["traceEvents"]
    expected = {"linear": set(), "addmm": set(), "mm": set(), "bmm": set()}
    for e in events:
        name, dims = e.get("name", ""), (e.get("args") or {}).get("Input Dims")
        kind = name[6:] if name.startswith("aten::") else None
        if kind in expected and dims:
            t = [d for d in dims if d]
            if kind == "linear":
                expected[kind].add(2 * int(np.prod(t[0][:-1])) * t[0][-1] * t[1][0])
            elif kind == "addmm":
                expected[kind].add(2 * t[1][0] * t[1][1] * t[2][1])
            elif kind == "mm":
                expected[kind].add(2 * t[0][0] * t[0][1] * t[1][1])
            else:
                expected[kind].add(2 * t[0][0] * t[0][1] * t[0][2] * t[1][2])
    ops = analyze(path).agg().ops
    checked = 0
    for kind, values in expected.items():
        fprop = ops[(ops["op_type"] == kind) & (ops["direction"] == "fprop") & ops["input_shapes"].notna()]
        for v in fprop["flops_per_call"]:
            assert int(v) in values
            checked += 1
        bprop = ops[(ops["op_type"] == kind) & (ops["direction"] == "bprop")]
        assert set(bprop["flops_per_call"].dropna().astype(int)) <= {2 * v for v in values}
    assert checked >= 100  # the trace's 101 fprop linear ops, its bmm ops


@pytest.mark.slow
@pytest.mark.torch
def test_forward_flops_of_a_real_pytorch_run_equal_pytorchs_flop_counter(tmp_path):
    """A CPU PyTorch model trained STEPS steps under `dlprof --backend=torch`: the FLOPs of its fprop ops (one
    call each per iteration) add up to what torch.utils.flop_counter.FlopCounterMode counts for one forward
    pass of the same model (run in a process of its own)."""
    pytest.importorskip("torch")
    script = tmp_path / "model.py"
    script.write_text(MODEL)
    reference = subprocess.run(
        [sys.executable, str(script), "reference"], capture_output=True, text=True, timeout=300, check=True
    )
    forward = int(reference.stdout.strip())
    out = tmp_path / "out"
    run_dlprof("--backend=torch", f"--output_path={out}", "--reports=detail", sys.executable, str(script))
    rows = list(csv.reader(io.StringIO((out / "dlprof_detailed.csv").read_text())))
    header = rows[1]
    fprop = [dict(zip(header, r)) for r in rows[2:] if r[2] == "fprop" and r[header.index("FLOPs per Call")]]
    assert {int(r["No. Calls"]) for r in fprop} == {STEPS}
    assert {r["Op Type"] for r in fprop} == {
        "linear",
        "conv2d",
        "conv_transpose2d",
        "bmm",
        "matmul",
        "addmm",
        "baddbmm",
    }
    assert sum(int(r["FLOPs per Call"]) for r in fprop) == forward > 0
    bprop = {r[1]: r for r in rows[2:] if r[2] == "bprop"}
    for r in fprop:  # backward: twice the forward
        assert bprop[r["Op Name"]][header.index("FLOPs per Call")] == str(2 * int(r["FLOPs per Call"]))


STEPS = 3
MODEL = f"""
import sys
import torch, torch.nn as nn, torch.nn.functional as F


class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.up = nn.ConvTranspose2d(8, 4, 2, stride=2)
        self.fc = nn.Linear(4 * 16 * 16, 32)
        self.w = nn.Parameter(torch.randn(2, 8, 8))

    def forward(self, x):
        h = self.fc(self.up(F.relu(self.conv(x))).flatten(1))
        b = torch.bmm(h.reshape(4, 4, 8), self.w.repeat(2, 1, 1))
        m = torch.matmul(h.reshape(2, 2, 4, 8), self.w[0])
        a = torch.addmm(h[:, :8], h, self.w.reshape(16, 8).repeat(2, 1))
        c = torch.baddbmm(b, b, self.w.repeat(2, 1, 1))
        return b.sum() + m.sum() + a.sum() + c.sum()


torch.manual_seed(0)
model, x = M(), torch.randn(4, 3, 16, 16)
if sys.argv[1:] == ["reference"]:
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        model(x)
    print(counter.get_total_flops())
else:
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for _ in range({STEPS}):
        opt.zero_grad()
        model(x).backward()
        opt.step()
"""
