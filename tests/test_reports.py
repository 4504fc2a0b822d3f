"""Reports in DLProf 1.8's files, sections, columns and value formats, written by the real CLI."""

import csv
import importlib.util
import io
import json
import re
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from dlprof_profiler import experts as expert_systems
from dlprof_profiler.outputs import report_format
from dlprof_profiler.outputs import reports as current
from dlprof_profiler.outputs.report_format import Table
from tests import profiles
from tests.analysis import analyze
from tests.nsys_builder import NsysExport
from tests.profiles import run_dlprof
from tests import data

ALL_FILES = ["summary", "detailed", "iteration", "kernel", "tensor_core", "op_type", "group_op", "expert_systems"]


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    root = tmp_path_factory.mktemp("reports")
    export = profiles.training_profile(root / "t.sqlite")
    run_dlprof(f"--database={export}", "--reports=all", "--formats=csv,json", f"--output_path={root / 'out'}")
    return root / "out"


def read(path):
    return path.read_text(encoding="utf-8")


@pytest.mark.slow
def test_every_report_file_in_both_formats(out):
    for name in ALL_FILES:
        assert (out / f"dlprof_{name}.csv").is_file(), name
        assert (out / f"dlprof_{name}.json").is_file(), name
    assert (out / "dlprof_dldb.sqlite").is_file()


def test_summary_sections(out):
    text = read(out / "dlprof_summary.csv")
    sections = text.strip("\n").split("\n\n")
    assert [s.split("\n")[0] for s in sections] == [
        "System Config",
        "Summary Report",
        "Iterations",
        "All Ops",
        "All Kernels",
    ]
    assert '"' not in text  # the summary file quotes nothing
    lines = text.splitlines()
    assert "GPU Count,1" in lines and "GPU Name(s),NVIDIA A100-SXM4-40GB" in lines
    assert "CPU Model,Test CPU @ 2.00GHz" in lines and "CUDA Version,12.2" in lines
    assert "Wall Clock Time (ns),290000" in lines
    assert "Tensor Core Kernel Utilization %,50.0" in lines
    assert "GPU Utilization %,38.3" in lines  # 111,000 / 290,000
    assert "Dataloader Duration %,5.2" in lines  # 15,000 / 290,000
    assert "Total Iterations,4" in lines and "Average Iteration Time (ns),72500.0" in lines
    # iterations [1.00 ms, 1.08 ms) 80 us, then 100 us, 100 us, and the tail [1.28 ms, 1.29 ms) 10 us: the median
    # of the complete ones (1 and 2; 0 runs up to the first key node, 3 after the last), right after DLProf's lines
    std = lines.index("Iteration Time Standard Deviation," + f"{np.std([80e3, 100e3, 100e3, 10e3], ddof=1):.1f}")
    assert lines[std + 1] == "Median Iteration Time (ns),100000.0"
    assert ",GPU Time (ns),CPU Time (ns),# Ops" in lines
    assert "Ops using TC,48000,54000,2" in lines
    assert "Kernels using TC,48000,6000,2" in lines and "Memory,3000,3000,1" in lines


def test_detailed_report_layout_and_quoting(out):
    lines = read(out / "dlprof_detailed.csv").splitlines()
    assert lines[0] == "All Iterations"
    assert lines[1] == (
        "Op ID,Op Name,Direction,Op Type,No. Calls,TC Eligible,Using TC,Total CPU Time (ns),"
        "Avg. CPU Time (ns),Min CPU Time (ns),Max CPU Time (ns),Total GPU Time (ns),Avg. GPU Time (ns),"
        "Min GPU Time (ns),Max GPU Time (ns),Total CPU Overhead (ns),Avg. CPU Overhead (ns),"
        "Min CPU Overhead (ns),Max CPU Overhead (ns),Total GPU Idle (ns),Avg. GPU Idle (ns),"
        "Min GPU Idle (ns),Max GPU Idle (ns),Data Type,Stack Trace,"
        "Input Shapes,FLOPs per Call,Achieved TFLOP/s"
    )  # DLProf 1.8's columns, then ours
    assert (
        '"CONV2D_1","/aten::conv2d",fprop,"conv2d",3,yes,yes,30000,10000.0,10000,10000,30000,10000.0,10000,'
        '10000,27000,9000.0,9000,9000,0,0.0,0,0,,"","",,'
    ) in lines  # emit_nvtx without sizes: no shapes, no FLOPs
    assert any(
        line.startswith(
            '"CUDADEVICESYNCHRONIZE_1","unassociated_cudaDeviceSynchronize",,'
            '"cudaDeviceSynchronize",3,no,no,15000,5000.0'
        )
        for line in lines
    )
    ids = [row[0] for row in csv.reader(io.StringIO("\n".join(lines[2:])))]
    assert ids == sorted(ids)  # rows ordered by Op ID as a string


def test_iteration_report_has_one_row_per_kernel_launch(out):
    rows = list(csv.reader(io.StringIO(read(out / "dlprof_iteration.csv"))))
    assert rows[0] == ["Iteration Report"] and rows[1][:6] == [
        "Iteration",
        "Op ID",
        "Op Name",
        "Direction",
        "Op Type",
        "Kernel Name",
    ]
    data = rows[2:]
    assert len(data) == 18  # 6 kernels x 3 iterations, memcpys excluded
    conv = [r for r in data if r[1] == "CONV2D_1"]
    assert [r[0] for r in conv] == ["0", "1", "2"]
    assert conv[0][5] == profiles.TC_CONV and conv[0][7] == str(1_014_000) and conv[0][8] == "10000"
    assert conv[0][11] == "yes"


def test_json_carries_the_same_tables(out):
    doc = json.loads(read(out / "dlprof_detailed.json"))
    assert doc["report"] == "detail"
    table = doc["sections"][0]
    assert table["title"] == "All Iterations" and table["columns"][0] == "Op ID"
    rows = {r[0]: r for r in table["rows"]}
    assert rows["CONV2D_1"][4] == 3 and rows["CONV2D_1"][8] == 10000.0 and rows["CONV2D_1"][5] == "yes"
    csv_rows = list(csv.reader(io.StringIO(read(out / "dlprof_detailed.csv"))))[2:]
    assert len(csv_rows) == len(table["rows"])
    summary = json.loads(read(out / "dlprof_summary.json"))
    titles = [s["title"] for s in summary["sections"]]
    assert titles == ["System Config", "Summary Report", "Iterations", "All Ops", "All Kernels"]
    iterations = summary["sections"][2]
    assert iterations["rows"][-2:] == [
        ["Iteration Time Standard Deviation", f"{np.std([80e3, 100e3, 100e3, 10e3], ddof=1):.1f}"],
        ["Median Iteration Time (ns)", "100000.0"],  # the summary's label/value text, as DLProf's other lines
    ]


def test_expert_systems_report(out):
    lines = read(out / "dlprof_expert_systems.csv").splitlines()
    assert lines[:2] == ["Expert Systems Feedback", "Problem,Recommendation"]


def test_group_op_report_ends_with_the_complete_model(out):
    rows = list(csv.reader(io.StringIO(read(out / "dlprof_group_op.csv"))))
    assert rows[0] == ["Group Op Report"] and rows[1][:4] == [
        "Name",
        "Num Calls Aggregated",
        "Num TC Eligible Ops",
        "Num Ops Using TC",
    ]
    assert rows[-1][0] == "_CompleteModel_" and rows[2][0] == "/"


@pytest.mark.slow
def test_reports_as_space_separated_words(tmp_path):
    export = profiles.training_profile(tmp_path / "t.sqlite")
    run_dlprof(
        f"--database={export}",
        "--reports",
        "kernel",
        "op_type",
        "--",
        f"--output_path={tmp_path / 'o'}",
        "--formats",
        "json",
        "--",
    )
    assert sorted(p.name for p in (tmp_path / "o").glob("dlprof_*")) == [
        "dlprof_dldb.sqlite",
        "dlprof_kernel.json",
        "dlprof_op_type.json",
    ]


@pytest.mark.slow
def test_simple_mode_writes_totals_and_kernels_only(tmp_path):
    export = profiles.training_profile(tmp_path / "t.sqlite")
    proc = run_dlprof(f"--database={export}", "--mode=simple", "--reports=all", f"--output_path={tmp_path / 'o'}")
    assert sorted(p.name for p in (tmp_path / "o").glob("dlprof_*.csv")) == ["dlprof_kernel.csv", "dlprof_summary.csv"]
    assert "simple mode writes only the summary and kernel reports" in proc.stderr
    kernels = list(csv.reader(io.StringIO((tmp_path / "o" / "dlprof_kernel.csv").read_text())))[2:]
    assert {r[2] for r in kernels} == {"unassociated_cudaLaunchKernel"}


@pytest.mark.slow
def test_base_name_and_other_domains(tmp_path):
    from tests.nsys_builder import NsysExport

    exp = NsysExport()
    exp.add_gpu(device_id=0)
    t = exp.add_thread(pid=1, tid=1, name="python", process_name="python")
    exp.add_domain(t, domain_id=1, name="NCCL")
    exp.push_pop(t, 0, 100, "aten::mm, seq = 1, op_id = 1")
    exp.push_pop(t, 0, 100, "ncclSend", domain_id=1)
    exp.launch(t, 10, 20, 30, 40, kernel="k")
    export = exp.write(tmp_path / "t.sqlite")
    run_dlprof(
        f"--database={export}",
        "--domain=all",
        "--reports=detail",
        "--base_name=run7",
        f"--output_path={tmp_path / 'o'}",
    )
    names = sorted(p.name for p in (tmp_path / "o").glob("run7_*"))
    assert names == ["run7_detailed.csv", "run7_detailed_NCCL.csv", "run7_dldb.sqlite"]
    assert '"/ncclSend"' in (tmp_path / "o" / "run7_detailed_NCCL.csv").read_text()


# ---------------------------------------------------------------------------- the writer (report_format)

ROOT = Path(__file__).resolve().parents[1]
BRANCH_POINT = "b371e0f"  # reports.py before values were formatted once per distinct value (issue 10)
OLD_REPORTS_PATH = "dlprof_profiler/reports.py"  # where it was then (now outputs/reports.py)
FIXTURES = data.NSYS


def write(report, out: Path, formats=("csv", "json")) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    paths = current.write_report(report, out, "t", list(formats))
    return {p.suffix[1:]: p.read_bytes() for p in paths}


def test_value_formats_written_by_hand(tmp_path):
    """Each column kind, checked against text written by hand (DLProf 1.8's conventions, §3 of the
    reference): always-quoted text, text quoted only when needed, integers (missing 0, halves to even),
    one-decimal averages and percentages, yes/no."""
    table = Table(
        "T",
        ["Q", "T", "I", "A", "P", "Y"],
        ["q", "t", "i", "a", "p", "y"],
        data={
            "Q": ['a"b', "", None, "x,y", "é"],
            "T": ["plain", "a,b", None, 'say "hi"', "line\nbreak"],
            "I": [1, -1, 2.5, None, 3.5],
            "A": [1234567.0, 4812.25, None, -0.04, 2.0 / 3],
            "P": [42.66, 0.0, 100.0, 12345678901234567.0, float("inf")],
            "Y": [True, False, None, 1, 0],
        },
    )
    out = write(current.Report("detail", [table]), tmp_path)
    assert out["csv"].decode("utf-8") == (
        "T\nQ,T,I,A,P,Y\n"
        '"a""b",plain,1,1234567.0,42.7,yes\n'
        '"","a,b",-1,4812.2,0.0,no\n'
        '"",,2,0.0,100.0,no\n'
        '"x,y","say ""hi""",0,-0.0,12345678901234568.0,yes\n'
        '"é","line\nbreak",4,0.7,inf,no\n'
    )
    assert out["json"].decode("ascii") == (
        '{"report": "detail", "dlprof_version": "' + current.__version__ + '", "sections": [{"title": "T", '
        '"columns": ["Q", "T", "I", "A", "P", "Y"], "rows": ['
        '["a\\"b", "plain", 1, 1234567.0, 42.7, "yes"], ["", "a,b", -1, 4812.2, 0.0, "no"], '
        '["", "", 2, 0.0, 100.0, "no"], ["x,y", "say \\"hi\\"", 0, -0.0, 1.2345678901234568e+16, "yes"], '
        '["\\u00e9", "line\\nbreak", 4, 0.7, Infinity, "no"]]}]}\n'
    )


def test_summary_sections_quote_nothing_but_what_csv_needs(tmp_path):
    label = Table(
        "Labels",
        ["name", "value"],
        ["t", "t"],
        {"name": ["GPU Name(s)", "x"], "value": ["A, B", "1"]},
        header_prefix=None,
        bare=True,
    )
    counts = Table(
        "All Ops",
        ["", "GPU Time (ns)", "a,b"],
        ["q", "i", "i"],
        {"": ["All ops"], "GPU Time (ns)": [5], "a,b": [6]},
        bare=True,
    )
    text = write(current.Report("summary", [label, counts]), tmp_path, ["csv"])["csv"].decode()
    assert text == 'Labels\nGPU Name(s),"A, B"\nx,1\n\nAll Ops\n,GPU Time (ns),"a,b"\nAll ops,5,6\n'


def test_empty_tables(tmp_path):
    table = Table("Empty", ["A", "B"], ["q", "i"], {"A": [], "B": []})
    out = write(current.Report("kernel", [table]), tmp_path)
    assert out["csv"] == b"Empty\nA,B\n"
    assert out["json"].endswith(b'{"title": "Empty", "columns": ["A", "B"], "rows": []}]}\n')
    streamed = Table("Empty", ["A", "B"], ["q", "i"], chunks=lambda: iter([]))
    assert write(current.Report("kernel", [streamed]), tmp_path / "s") == out


# A table of every kind with every awkward value, as whole columns and as chunks of each accepted shape.
TEXTS = ["", "plain", 'q"uote', "com,ma", "new\nline", "carriage\rreturn", "é ü", "😀 emoji", "  spaced  ", "[1],[2]"]


def awkward_columns(n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    text_codes = rng.integers(-1, len(TEXTS), n)
    floats = rng.normal(0, 1e4, n).round(2)
    floats[rng.random(n) < 0.1] = np.nan
    floats[rng.random(n) < 0.05] = rng.integers(-50, 50, int((rng.random(n) < 0.05).sum()) or 1)[0] * 0.05
    ints = rng.integers(-(10**15), 10**15, n)
    ints[rng.random(n) < 0.5] = rng.integers(0, 40, int((rng.random(n) < 0.5).sum()) or 1)[0]
    return {
        "text_codes": text_codes,
        "floats": floats,
        "ints": ints,
        "small": rng.integers(0, 7, n),
        "flags": rng.random(n) < 0.4,
    }


AWKWARD_COLUMNS = ["Q", "T", "I", "S", "A", "P", "Y", "Q2"]
AWKWARD_FORMATS = ["q", "t", "i", "i", "a", "p", "y", "q"]


def awkward_whole(cols: dict) -> dict:
    texts = np.array(TEXTS + [None], dtype=object)[cols["text_codes"]]
    return {
        "Q": texts,
        "T": texts[::-1].copy(),
        "I": cols["ints"],
        "S": cols["small"],
        "A": cols["floats"],
        "P": cols["floats"] * 3.7,
        "Y": cols["flags"],
        "Q2": pd.Categorical(texts),
    }


def test_chunks_of_every_shape_write_what_whole_columns_write(tmp_path, monkeypatch):
    monkeypatch.setattr(report_format, "CHUNK_ROWS", 37)
    n = 500
    cols = awkward_columns(n)
    whole = awkward_whole(cols)
    expected = write(current.Report("detail", [Table("T", AWKWARD_COLUMNS, AWKWARD_FORMATS, whole)]), tmp_path / "w")
    dictionary = pa.array(TEXTS)  # one dictionary shared by every chunk

    def coded(codes):
        return pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), dictionary)

    def chunk(lo, hi, shape):
        part = {k: v[lo:hi] for k, v in cols.items()}
        c = {
            "Q": coded(part["text_codes"]),
            "T": whole["T"][lo:hi],
            "I": part["ints"],
            "S": pa.array(part["small"]),
            "A": part["floats"],
            "P": pd.Series(part["floats"] * 3.7),
            "Y": pa.array(part["flags"]),
            "Q2": pd.Series(whole["Q2"][lo:hi]),
        }
        if shape == "batch":
            return pa.RecordBatch.from_pydict(
                {k: c[k] for k in ("Q", "I", "S", "Y")}
                | {
                    "T": pa.array(list(c["T"]), type=pa.string(), from_pandas=True),
                    "A": pa.array(c["A"]),
                    "P": pa.array(c["P"]),
                    "Q2": pa.array(list(c["Q2"]), type=pa.string(), from_pandas=True),
                }
            )
        if shape == "table":
            return pa.Table.from_batches([chunk(lo, hi, "batch")])
        return c

    bounds = [0, 1, 50, 51, 300, 500]
    for shape in ("dict", "batch", "table"):
        parts = [chunk(lo, hi, shape) for lo, hi in zip(bounds, bounds[1:])]
        table = Table("T", AWKWARD_COLUMNS, AWKWARD_FORMATS, chunks=lambda p=parts: iter(p))
        assert write(current.Report("detail", [table]), tmp_path / shape) == expected, shape


def test_shared_dictionaries_are_formatted_once(tmp_path, monkeypatch):
    monkeypatch.setattr(report_format, "CHUNK_ROWS", 16)
    calls = []
    original = report_format._Formatter._format_text

    def counting(self, strings, fmt):
        calls.append((self.target, fmt, len(strings)))
        return original(self, strings, fmt)

    monkeypatch.setattr(report_format._Formatter, "_format_text", counting)
    dictionary = pa.array(["a", "b,c", 'd"e'])
    op = pa.array(np.arange(400) % 3)
    chunks = [
        {
            "X": pa.DictionaryArray.from_arrays(op.slice(lo, 40), dictionary),
            "Y": pa.DictionaryArray.from_arrays(op.slice(lo, 40), dictionary),
            "N": np.arange(40),
        }
        for lo in range(0, 400, 40)
    ]
    table = Table("T", ["X", "Y", "N"], ["q", "t", "i"], chunks=chunks)
    out = write(current.Report("kernel", [table]), tmp_path)
    # 10 chunks of 40 rows, split into 30 pieces: the dictionary is formatted once per column kind and format
    assert sorted(calls) == [("csv", "q", 3), ("csv", "t", 3), ("json", "q", 3), ("json", "t", 3)]
    lines = out["csv"].decode().splitlines()
    assert lines[2:5] == ['"a",a,0', '"b,c","b,c",1', '"d""e","d""e",2'] and len(lines) == 402


def test_large_string_table_formats_only_what_a_chunk_uses(tmp_path, monkeypatch):
    monkeypatch.setattr(report_format, "CHUNK_ROWS", 10)
    strings = [f"name {i}, #{i}" for i in range(5000)]
    codes = np.array([4999, 0, -1, 17, 17, 2500] * 5)
    table = Table(
        "T",
        ["S"],
        ["q"],
        chunks=[{"S": pa.DictionaryArray.from_arrays(pa.array(codes, mask=codes < 0), pa.array(strings))}],
    )
    lines = write(current.Report("kernel", [table]), tmp_path, ["csv"])["csv"].decode().splitlines()[2:]
    assert lines == [f'"{strings[c]}"' if c >= 0 else '""' for c in codes]


def test_a_chunk_iterator_is_written_once_a_chunk_function_again(tmp_path):
    rows = [{"A": np.array([1, 2])}]
    once = current.Report("kernel", [Table("T", ["A"], ["i"], chunks=iter(rows))])
    write(once, tmp_path / "a", ["csv"])
    with pytest.raises(RuntimeError, match="already consumed"):
        write(once, tmp_path / "b", ["csv"])
    again = current.Report("kernel", [Table("T", ["A"], ["i"], chunks=lambda: iter(rows))])
    assert write(again, tmp_path / "c", ["csv"]) == write(again, tmp_path / "d", ["csv"]) == {"csv": b"T\nA\n1\n2\n"}


def test_bad_tables_are_refused():
    with pytest.raises(ValueError, match="either whole columns"):
        Table("T", ["A"], ["i"])
    with pytest.raises(ValueError, match="unknown column format"):
        Table("T", ["A"], ["z"], {"A": [1]})
    with pytest.raises(ValueError, match="1 columns but 2 formats"):
        Table("T", ["A"], ["i", "i"], {"A": [1]})


# ---------------------------------------------------------------------------- the iteration report from launch chunks


def launch_dictionaries() -> current.LaunchDictionaries:
    return current.LaunchDictionaries(
        op_id=pa.array(["CONV2D_1", "UNASSOCIATED_1"]),
        op_name=pa.array(["/net/conv2d", "unassociated_k"]),
        direction=pa.array(["fprop", None]),
        op_type=pa.array(["conv2d", "k"]),
        kernel_name=pa.array(["gemm", "relu"]),
        long_kernel_name=pa.array(["void gemm<float, 2>(float*, int)", "relu"]),
        data_type=pa.array(["float16"]),
        input_shapes=pa.array(["<N:8, C:3>; <16>"]),
        parameters=pa.array([""]),
        output_shapes=pa.array(["<N:8, K:16>"]),
    )


def launch_chunk(lo: int, hi: int) -> dict:
    rows = {
        "iteration": [0, 1, 1],
        "op_index": [0, 0, 1],
        "kernel_name": [0, 1, 1],
        "long_kernel_name": [0, 1, 1],
        "device_id": [0, 0, 1],
        "gpu_start": [1_014_000, 1_114_000, 1_200_000],
        "gpu_duration": [10_000, 2000, 5],
        "api_start": [1_012_000, 1_112_000, -1],
        "api_duration": [1000, 1000, -1],
        "uses_tc": [True, False, False],
        "grid_x": [4, 1, 1],
        "grid_y": [2, 1, 1],
        "grid_z": [1, 1, 1],
        "block_x": [128, 256, 32],
        "block_y": [1, 1, 1],
        "block_z": [1, 1, 1],
        "data_type": [0, 0, -1],
        "input_shapes": [0, -1, -1],
        "parameters": [0, 0, -1],
        "output_shapes": [0, -1, -1],
    }
    return {k: np.array(v[lo:hi]) for k, v in rows.items()}


ITERATION_LINES = [
    "Iteration Report",
    ",".join(current.ITERATION_COLUMNS),
    (
        '0,"CONV2D_1","/net/conv2d",fprop,"conv2d","gemm",0,1014000,10000,1012000,1000,yes,4,2,1,128,1,1,float16,'
        '"<N:8, C:3>; <16>","","<N:8, K:16>","void gemm<float, 2>(float*, int)"'
    ),
    (
        '1,"CONV2D_1","/net/conv2d",fprop,"conv2d","relu",0,1114000,2000,1112000,1000,no,1,1,1,256,1,1,float16,"","","",'
        '"relu"'
    ),
    '1,"UNASSOCIATED_1","unassociated_k",,"k","relu",1,1200000,5,,,no,1,1,1,32,1,1,,"","","","relu"',  # no launch call
]


def test_iteration_report_from_launch_chunks_by_hand(tmp_path, monkeypatch):
    monkeypatch.setattr(report_format, "CHUNK_ROWS", 2)
    dicts = launch_dictionaries()
    as_batches = [pa.RecordBatch.from_pydict(launch_chunk(0, 1)), pa.RecordBatch.from_pydict(launch_chunk(1, 3))]
    for chunks in ([launch_chunk(0, 3)], [launch_chunk(0, 2), launch_chunk(2, 3)], as_batches):
        out = write(current.iteration_report_from_chunks(lambda c=chunks: iter(c), dicts), tmp_path / str(id(chunks)))
        assert out["csv"].decode().splitlines() == ITERATION_LINES
        doc = json.loads(out["json"])
        assert doc["sections"][0]["rows"][2] == [
            1,
            "UNASSOCIATED_1",
            "unassociated_k",
            "",
            "k",
            "relu",
            1,
            1200000,
            5,
            None,
            None,
            "no",
            1,
            1,
            1,
            32,
            1,
            1,
            "",
            "",
            "",
            "",
            "relu",
        ]
    with pytest.raises(KeyError, match="uses_tc"):
        current.launch_report_columns({k: v for k, v in launch_chunk(0, 1).items() if k != "uses_tc"}, dicts)


@pytest.mark.slow
def test_iteration_report_matches_the_export_by_sql(tmp_path):
    """Every launch row of the sample profile against a direct join of the export's kernel and runtime
    tables (an independent computation), and the rows in report order."""
    export = ROOT / "examples" / "sample_pytorch_training.sqlite"
    run_dlprof(f"--database={export}", "--reports=iteration", f"--output_path={tmp_path}")
    rows = list(csv.reader(io.StringIO((tmp_path / "dlprof_iteration.csv").read_text())))[2:]
    con = sqlite3.connect(f"file:{export}?mode=ro&immutable=1", uri=True)
    sql = con.execute("""SELECT s.value, k.start, k.end - k.start, r.start, r.end - r.start, k.gridX, k.gridY,
                                k.gridZ, k.blockX, k.blockY, k.blockZ
                         FROM CUPTI_ACTIVITY_KIND_KERNEL k JOIN StringIds s ON s.id = k.shortName
                         JOIN CUPTI_ACTIVITY_KIND_RUNTIME r ON r.correlationId = k.correlationId""").fetchall()
    con.close()
    assert len(sql) == len(rows) > 200
    report = [(r[5], *map(int, (r[7], r[8], r[9], r[10], r[12], r[13], r[14], r[15], r[16], r[17]))) for r in rows]
    assert sorted(report) == sorted(sql)
    # order: iteration, then within an op of an iteration by kernel name, then GPU start
    keys = [(int(r[0]), r[1], r[5], int(r[7])) for r in rows]
    assert [k[0] for k in keys] == sorted(k[0] for k in keys)
    for previous, row in zip(keys, keys[1:]):
        if previous[:2] == row[:2]:
            assert previous[2:] <= row[2:]


# ---------------------------------------------------------------------------- byte for byte against the old writer


def old_reports_source() -> str:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "show", f"{BRANCH_POINT}:{OLD_REPORTS_PATH}"],
            check=False,
            capture_output=True,
            text=True,
            timeout=60,
        )
    except OSError:
        done = None
    if done is None or done.returncode != 0:
        pytest.skip(f"needs the git history (commit {BRANCH_POINT}) to compare with the old writer")
    return done.stdout


def load_module(source: str, name: str, folder: Path):
    path = folder / f"{name}.py"
    path.write_text(source, encoding="utf-8")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


# the old writer's imports from modules that have moved since (its builders' engine imports are not needed)
OLD_IMPORTS = {
    "from dlprof_profiler.aggregate import": None,
    "from dlprof_profiler.atomic import": "from dlprof_profiler.outputs.atomic import",
}


@pytest.fixture(scope="module")
def old_writer(tmp_path_factory):
    """The old writer alone: reports.py at the branch point up to its report builders (the builders read the
    engine's frames of their day, which no longer exist)."""
    source = old_reports_source()
    head = source.split(
        "# ---------------------------------------------------------------------------- report builders"
    )[0]
    lines = []
    for line in head.splitlines():
        moved = next((old for old in OLD_IMPORTS if line.startswith(old)), None)
        if moved is None:
            lines.append(line)
        elif OLD_IMPORTS[moved] is not None:
            lines.append(line.replace(moved, OLD_IMPORTS[moved]))
    return load_module("\n".join(lines), "old_report_writer", tmp_path_factory.mktemp("old_writer"))


MISSING_SENTINEL = -987654321  # what the old writer gets for a missing number of the new formats n and m


RATE_MARKER = 900_000_000_000  # rates (format r) reach the old writer as integers -(RATE_MARKER + row)
_RATE = re.compile(r"-9\d{11}")


def old_write(old, report, out: Path, formats=("csv", "json")) -> dict:
    """The old writer on the same tables; streamed tables are gathered into whole columns first. The newer
    formats n and m (numbers blank when missing) are given to it as i and a with a sentinel for missing
    values, which its output then shows as blank (CSV) or null (JSON), so the comparison stays exact. A rate
    (format r, three decimals) is given as a marker integer per cell, which is then replaced by the text the
    rate must have: "%.3f" in CSV, the JSON number of the value rounded to three decimals, blank / null when
    missing."""
    rates: dict = {}
    tables = []
    for t in report.sections:
        data = t.data
        if data is None:
            parts = list(t.iter_chunks())
            data = {c: np.concatenate([decoded(p[c]) for p in parts]) if parts else [] for c in t.columns}
        data = dict(data)
        fmts = []
        for column, fmt in zip(t.columns, t.formats):
            if fmt in ("n", "m"):
                values = pd.to_numeric(pd.Series(decoded(data[column]) if len(data[column]) else []), errors="coerce")
                data[column] = values.fillna(MISSING_SENTINEL).to_numpy()
                fmt = "i" if fmt == "n" else "a"
            elif fmt == "r":
                values = pd.to_numeric(pd.Series(decoded(data[column]) if len(data[column]) else []), errors="coerce")
                markers = -(RATE_MARKER + len(rates) + np.arange(len(values), dtype=np.int64))
                for marker, v in zip(markers.tolist(), values.tolist()):
                    rates[str(marker)] = None if v != v else v
                data[column], fmt = markers, "i"
            fmts.append(fmt)
        tables.append(old.Table(t.title, t.columns, fmts, data, header_prefix=t.header_prefix, bare=t.bare))
    out.mkdir(parents=True, exist_ok=True)
    paths = old.write_report(old.Report(report.name, tables), out, "t", list(formats))
    result = {}
    for p in paths:
        text = p.read_bytes()
        blank = b"null" if p.suffix == ".json" else b""
        for sentinel in (f"{MISSING_SENTINEL}.0".encode(), str(MISSING_SENTINEL).encode()):
            text = text.replace(sentinel, blank)
        if rates:
            json_target = p.suffix == ".json"

            def rate(match, json_target=json_target):
                v = rates[match.group().decode()]
                if v is None:
                    return b"null" if json_target else b""
                return (json.dumps(round(v, 3)) if json_target else "%.3f" % v).encode()

            text = re.compile(_RATE.pattern.encode()).sub(rate, text)
        result[p.suffix[1:]] = text
    return result


def decoded(values) -> np.ndarray:
    if isinstance(values, pa.DictionaryArray):
        values = values.dictionary.take(values.indices)
    if isinstance(values, pa.Array):
        return values.to_numpy(zero_copy_only=False)
    return pd.Series(values).to_numpy()


@pytest.mark.parametrize("seed", range(4))
def test_awkward_tables_match_the_old_writer(old_writer, tmp_path, seed):
    cols = awkward_columns(3000, seed)
    whole = awkward_whole(cols)
    whole["Q2"] = np.asarray(whole["Q2"], dtype=object)  # the old writer read categoricals as their text
    report = current.Report(
        "detail",
        [
            Table("T", AWKWARD_COLUMNS, AWKWARD_FORMATS, whole),
            Table("Bare", AWKWARD_COLUMNS, AWKWARD_FORMATS, whole, bare=True),
        ],
    )
    assert write(report, tmp_path / "new") == old_write(old_writer, report, tmp_path / "old")


def test_many_chunks_match_the_old_writer(old_writer, tmp_path, monkeypatch):
    """Chunk boundaries change nothing in CSV; the old JSON wrote `,` rather than `, ` between its chunks,
    the only difference (the same JSON document)."""
    monkeypatch.setattr(report_format, "CHUNK_ROWS", 64)
    monkeypatch.setattr(old_writer, "CHUNK_ROWS", 100)
    whole = awkward_whole(awkward_columns(1000, 7))
    whole["Q2"] = np.asarray(whole["Q2"], dtype=object)
    report = current.Report("detail", [Table("T", AWKWARD_COLUMNS, AWKWARD_FORMATS, whole)])
    new, old = write(report, tmp_path / "new"), old_write(old_writer, report, tmp_path / "old")
    assert new["csv"] == old["csv"]
    assert new["json"] != old["json"] and json.loads(new["json"]) == json.loads(old["json"])
    assert len(new["json"]) - len(old["json"]) == 1000 // 100 - 1  # one space at each old chunk boundary


def profile_cases():
    cases = [("training", None, None), ("training", 1, 2), ("sample", None, None)]
    cases += [(p.name, None, None) for p in sorted(FIXTURES.glob("*.sqlite"))]
    return cases


@pytest.fixture(scope="module")
def profile_files(tmp_path_factory):
    root = tmp_path_factory.mktemp("profiles")
    files = {
        "training": profiles.training_profile(root / "training.sqlite"),
        "sample": ROOT / "examples" / "sample_pytorch_training.sqlite",
    }
    for p in sorted(FIXTURES.glob("*.sqlite")):  # copied before anything could touch them
        files[p.name] = shutil.copy(p, root / p.name)
    return files


@pytest.mark.slow
@pytest.mark.parametrize("name,start,stop", profile_cases())
def test_every_report_matches_the_old_writer_byte_for_byte(profile_files, old_writer, tmp_path, name, start, stop):
    """Every report of every test profile and real fixture, in CSV and JSON: today's tables written by the old
    writer and by the new one."""
    a = analyze(Path(profile_files[name]), iter_start=start, iter_stop=stop)
    compared = 0
    for domain, agg in a.aggs.items():
        dm = a.corr.domains[domain]
        findings = expert_systems.detect(a.trace, a.corr, dm, agg, a.iterations)
        for report in current.build_reports(current_names(), agg, dm, a.trace, a.corr.config, findings):
            where = tmp_path / domain / report.name
            assert write(report, where / "new") == old_write(old_writer, report, where / "old"), (domain, report.name)
            compared += 1
    assert compared == 8 * len(a.aggs)


def current_names() -> list[str]:
    return ["summary", "detail", "iteration", "kernel", "tensor", "op_type", "group_node", "expert_systems"]


@pytest.mark.slow
def test_system_config_versions_as_dlprof_wrote_them(tmp_path):
    """Driver 515.43.04 stored as the integer 5154304; PyTorch and cuDNN versions from the run metadata;
    nsys with its build suffix when dlprof captured it; DLProf 1.8's SystemInfo table fills what is unknown."""
    import json as _json

    from dlprof_profiler.outputs.reports import cudnn_version, driver_version

    assert driver_version("5154304") == "515.43.04" and driver_version("5206105") == "520.61.05"
    assert driver_version("535.104.05") == "535.104.05" and driver_version(None) == "Unknown"
    assert cudnn_version(8902) == "8.9.2" and cudnn_version(90100) == "9.1.0" and cudnn_version(None) is None
    exp = NsysExport()
    exp.add_gpu(device_id=0, name="NVIDIA A100-SXM4-40GB")
    exp.system_env("NvDriverVersion", "5154304")
    t = exp.add_thread(pid=1, tid=1, name="python", process_name="python")
    exp.push_pop(t, 0, 0, _json.dumps({"model_config": {"torch_version": "2.3.1", "cudnn_version": 8902}}))
    exp.push_pop(t, 10, 100, "aten::mm, seq = 1, op_id = 1")
    exp.launch(t, 20, 30, 40, 50, kernel="k")
    path = exp.write(tmp_path / "p.sqlite")
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE SystemInfo (name TEXT, value TEXT)")
    con.execute("INSERT INTO SystemInfo VALUES ('CPU Model', 'AMD EPYC 7742 64-Core Processor')")
    con.commit()
    con.close()
    run_dlprof(f"--database={path}", f"--output_path={tmp_path / 'o'}", "--reports=summary", "-v", "quiet")
    lines = (tmp_path / "o" / "dlprof_summary.csv").read_text().splitlines()
    assert "GPU Driver Version,515.43.04" in lines and "Framework,PyTorch 2.3.1" in lines
    assert "cuDNN Version,8.9.2" in lines and "CPU Model,AMD EPYC 7742 64-Core Processor" in lines
    assert lines.index("cuDNN Version,8.9.2") == lines.index("CUDA Version,Unknown") + 1


def test_the_console_leads_with_the_steady_iteration_figures():
    """The line printed after a run: the median of the complete iterations, their range, the partial ones
    named (key-node intervals), then DLProf's average over all."""
    from dlprof_profiler.outputs.reports import iteration_headline

    key_nodes = {
        "aggregated_iterations": 13,
        "total_iterations": 13,
        "avg_iteration_time": 294.1e6,
        "wall_time": 3_823_300_000,
        "median_iteration_time": 95.6e6,
        "complete_iterations": 11,
        "complete_start": 1,
        "complete_stop": 11,
        "partial_iterations": [0, 12],
        "key_found": True,
    }
    assert iteration_headline(key_nodes) == (
        "Median iteration time 95.6 ms over 11 complete iterations 1..11; partial, left out: 0 (up to the first "
        "key node), 12 (after the last key node); average 294.1 ms over 13 aggregated (wall clock 3.823 s)"
    )
    steps = dict(key_nodes, aggregated_iterations=6, total_iterations=6, avg_iteration_time=77.5e6)
    steps.update(wall_time=465_200_000, median_iteration_time=76.8e6, complete_iterations=6, complete_start=0)
    steps.update(complete_stop=5, partial_iterations=[])
    assert iteration_headline(steps) == (
        "Median iteration time 76.8 ms over 6 complete iterations 0..5; average 77.5 ms over 6 aggregated "
        "(wall clock 465.2 ms)"
    )
    whole = dict(key_nodes, aggregated_iterations=1, total_iterations=1, complete_iterations=0, key_found=False)
    whole.update(avg_iteration_time=2e9, wall_time=2e9)
    assert iteration_headline(whole) == (
        "1 iteration(s), none complete (no key node found): average 2.000 s over 1 aggregated (wall clock 2.000 s)"
    )
