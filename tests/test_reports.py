"""Reports in DLProf 1.8's files, sections, columns and value formats, written by the real CLI."""
import csv
import io
import json

import pytest

from tests import profiles
from tests.profiles import run_dlprof

ALL_FILES = ["summary", "detailed", "iteration", "kernel", "tensor_core", "op_type", "group_op", "expert_systems"]


@pytest.fixture(scope="module")
def out(tmp_path_factory):
    root = tmp_path_factory.mktemp("reports")
    export = profiles.training_profile(root / "t.sqlite")
    run_dlprof(f"--database={export}", "--reports=all", "--formats=csv,json", f"--output_path={root / 'out'}")
    return root / "out"


def read(path):
    return path.read_text(encoding="utf-8")


def test_every_report_file_in_both_formats(out):
    for name in ALL_FILES:
        assert (out / f"dlprof_{name}.csv").is_file(), name
        assert (out / f"dlprof_{name}.json").is_file(), name
    assert (out / "dlprof_dldb.sqlite").is_file()


def test_summary_sections(out):
    text = read(out / "dlprof_summary.csv")
    sections = text.strip("\n").split("\n\n")
    assert [s.split("\n")[0] for s in sections] == ["System Config", "Summary Report", "Iterations", "All Ops",
                                                    "All Kernels"]
    assert '"' not in text  # the summary file quotes nothing
    lines = text.splitlines()
    assert "GPU Count,1" in lines and "GPU Name(s),NVIDIA A100-SXM4-40GB" in lines
    assert "CPU Model,Test CPU @ 2.00GHz" in lines and "CUDA Version,12.2" in lines
    assert "Wall Clock Time (ns),290000" in lines
    assert "Tensor Core Kernel Utilization %,50.0" in lines
    assert "GPU Utilization %,38.3" in lines                # 111,000 / 290,000
    assert "Dataloader Duration %,5.2" in lines            # 15,000 / 290,000
    assert "Total Iterations,4" in lines and "Average Iteration Time (ns),72500.0" in lines
    assert ",GPU Time (ns),CPU Time (ns),# Ops" in lines
    assert "Ops using TC,48000,54000,2" in lines
    assert "Kernels using TC,48000,6000,2" in lines and "Memory,3000,3000,1" in lines


def test_detailed_report_layout_and_quoting(out):
    lines = read(out / "dlprof_detailed.csv").splitlines()
    assert lines[0] == "All Iterations"
    assert lines[1] == ("Op ID,Op Name,Direction,Op Type,No. Calls,TC Eligible,Using TC,Total CPU Time (ns),"
                        "Avg. CPU Time (ns),Min CPU Time (ns),Max CPU Time (ns),Total GPU Time (ns),Avg. GPU Time (ns),"
                        "Min GPU Time (ns),Max GPU Time (ns),Total CPU Overhead (ns),Avg. CPU Overhead (ns),"
                        "Min CPU Overhead (ns),Max CPU Overhead (ns),Total GPU Idle (ns),Avg. GPU Idle (ns),"
                        "Min GPU Idle (ns),Max GPU Idle (ns),Data Type,Stack Trace,"
                        "Input Shapes")  # DLProf 1.8's columns, then ours
    assert ('"CONV2D_1","/aten::conv2d",fprop,"conv2d",3,yes,yes,30000,10000.0,10000,10000,30000,10000.0,10000,'
            '10000,27000,9000.0,9000,9000,0,0.0,0,0,,"",""') in lines  # emit_nvtx without sizes: no shapes
    assert any(line.startswith('"CUDADEVICESYNCHRONIZE_V3020_1","unassociated_cudaDeviceSynchronize_v3020",,'
                               '"cudaDeviceSynchronize_v3020",3,no,no,15000,5000.0') for line in lines)
    ids = [row[0] for row in csv.reader(io.StringIO("\n".join(lines[2:])))]
    assert ids == sorted(ids)  # rows ordered by Op ID as a string


def test_iteration_report_has_one_row_per_kernel_launch(out):
    rows = list(csv.reader(io.StringIO(read(out / "dlprof_iteration.csv"))))
    assert rows[0] == ["Iteration Report"] and rows[1][:6] == ["Iteration", "Op ID", "Op Name", "Direction",
                                                               "Op Type", "Kernel Name"]
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


def test_expert_systems_report(out):
    lines = read(out / "dlprof_expert_systems.csv").splitlines()
    assert lines[:2] == ["Expert Systems Feedback", "Problem,Recommendation"]


def test_group_op_report_ends_with_the_complete_model(out):
    rows = list(csv.reader(io.StringIO(read(out / "dlprof_group_op.csv"))))
    assert rows[0] == ["Group Op Report"] and rows[1][:4] == ["Name", "Num Calls Aggregated", "Num TC Eligible Ops",
                                                             "Num Ops Using TC"]
    assert rows[-1][0] == "_CompleteModel_" and rows[2][0] == "/"


def test_reports_as_space_separated_words(tmp_path):
    export = profiles.training_profile(tmp_path / "t.sqlite")
    run_dlprof(f"--database={export}", "--reports", "kernel", "op_type", "--", f"--output_path={tmp_path / 'o'}",
               "--formats", "json", "--")
    assert sorted(p.name for p in (tmp_path / "o").glob("dlprof_*")) == [
        "dlprof_dldb.sqlite", "dlprof_kernel.json", "dlprof_op_type.json"]


def test_simple_mode_writes_totals_and_kernels_only(tmp_path):
    export = profiles.training_profile(tmp_path / "t.sqlite")
    proc = run_dlprof(f"--database={export}", "--mode=simple", "--reports=all", f"--output_path={tmp_path / 'o'}")
    assert sorted(p.name for p in (tmp_path / "o").glob("dlprof_*.csv")) == ["dlprof_kernel.csv",
                                                                          "dlprof_summary.csv"]
    assert "simple mode writes only the summary and kernel reports" in proc.stderr
    kernels = list(csv.reader(io.StringIO((tmp_path / "o" / "dlprof_kernel.csv").read_text())))[2:]
    assert {r[2] for r in kernels} == {"unassociated_cudaLaunchKernel_v7000"}


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
    run_dlprof(f"--database={export}", "--domain=all", "--reports=detail", "--base_name=run7",
               f"--output_path={tmp_path / 'o'}")
    names = sorted(p.name for p in (tmp_path / "o").glob("run7_*"))
    assert names == ["run7_detailed.csv", "run7_detailed_NCCL.csv", "run7_dldb.sqlite"]
    assert '"/ncclSend"' in (tmp_path / "o" / "run7_detailed_NCCL.csv").read_text()
