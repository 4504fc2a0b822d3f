"""The op hierarchy as a TensorBoard graph (graph_events, written by event_files): the event file read back with
TensorBoard's own loader, checked against the hand-computed training profile (tests/profiles.py), and a real
TensorBoard serving it in the GRAPHS tab."""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from google.protobuf import text_format
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader, RawEventFileLoader
from tensorboard.compat.proto import config_pb2, event_pb2, graph_pb2, types_pb2

from dlprof_profiler.outputs import graph_events
from tests import test_plugin_checks as checks
from tests.nsys_builder import NsysExport
from tests.profiles import make_logdir, run_dlprof, training_profile
from tests.waiting import wait_until

CALLS = 3  # training_profile's iterations: every op runs once per iteration
# node name: (op type, Op ID, direction, GPU ns per call, CPU ns per call), from training_profile's docstring
TRAINING = {
    "to/aten::to": ("to", "TO_1", "fprop", 1000, 3000),  # memcpy [T+7000,T+8000)
    "conv2d/aten::conv2d": ("conv2d", "CONV2D_1", "fprop", 10000, 10000),  # TC_CONV [T+14000,T+24000)
    "relu/aten::relu": ("relu", "RELU_1", "fprop", 2000, 4000),  # RELU [T+25000,T+27000)
    "linear/aten::linear": ("linear", "LINEAR_1", "fprop", 8000, 10000),  # SGEMM [T+37000,T+45000)
    "linear/aten::linear (bprop)": ("linear", "LINEAR_2", "bprop", 8000, 6000),  # AddmmBackward0
    "conv2d/aten::conv2d (bprop)": ("conv2d", "CONV2D_2", "bprop", 6000, 8000),  # ConvolutionBackward0
    "Optimizer.step#SGD.step/aten::add_": ("add_", "ADD__1", "fprop", 2000, 8000),  # ADD [T+74000,T+76000)
    "unassociated/cudaDeviceSynchronize": (
        "cudaDeviceSynchronize",
        "CUDADEVICESYNCHRONIZE_1",
        None,
        0,
        5000,
    ),  # [T+85000,T+90000)
}
TRAINING_OP_NAMES = [
    "/aten::to",
    "/aten::conv2d",
    "/aten::relu",
    "/aten::linear",
    "/aten::linear (bprop)",
    "/aten::conv2d (bprop)",
    "/Optimizer.step#SGD.step/aten::add_",
    "unassociated_cudaDeviceSynchronize",
]


def read_graph(run_dir: Path) -> tuple[graph_pb2.GraphDef, config_pb2.RunMetadata, dict]:
    """The GraphDef and tagged RunMetadata of a run's event file, as TensorBoard's loader migrates them
    (graph -> `__run_graph__` blob, run metadata -> the graph_tagged_run_metadata plugin), plus the raw events."""
    (path,) = list(run_dir.glob("events.out.tfevents.*"))
    graph = meta = None
    for event in EventFileLoader(str(path)).Load():
        for value in event.summary.value:
            plugin = value.metadata.plugin_data.plugin_name
            if plugin == "graphs" and value.tag == "__run_graph__":
                graph = graph_pb2.GraphDef.FromString(value.tensor.string_val[0])
            elif plugin == "graph_tagged_run_metadata" and value.tag == graph_events.RUN_METADATA_TAG:
                meta = config_pb2.RunMetadata.FromString(value.tensor.string_val[0])
    raw = {e.WhichOneof("what"): e for e in map(event_pb2.Event.FromString, RawEventFileLoader(str(path)).Load())}
    assert graph is not None and meta is not None, "graph or run metadata missing"
    return graph, meta, raw


def node_stats(meta) -> dict:
    """{node name: (device, NodeExecStats)}"""
    return {s.node_name: (d.device, s) for d in meta.step_stats.dev_stats for s in d.node_stats}


@pytest.fixture(scope="module")
def training(tmp_path_factory):
    base = tmp_path_factory.mktemp("graph_events")
    export = training_profile(base / "training.sqlite")
    root = make_logdir(base / "logdir", {"training": export})
    return {
        "base": base,
        "export": export,
        "run": root / "training" / "dlprof",
        "logdir": root,
        "db": root / "training" / "dlprof_dldb.sqlite",
    }


@pytest.mark.slow
def test_nodes_are_the_ops_with_their_scopes_types_and_attributes(training):
    graph, _, raw = read_graph(training["run"])
    assert raw["graph_def"].step == 0 and raw["tagged_run_metadata"].tagged_run_metadata.tag == "dlprof/op_time"
    nodes = {n.name: n for n in graph.node}
    assert set(nodes) == set(TRAINING)
    for name, (op_type, op_id, direction, gpu, cpu) in TRAINING.items():
        node = nodes[name]
        attr = node.attr
        assert node.op == op_type and attr["op_id"].s.decode() == op_id, name
        assert (attr["direction"].s.decode() if "direction" in attr else None) == direction, name
        assert attr["calls"].i == CALLS
        assert (attr["gpu_time_ns"].i, attr["cpu_time_ns"].i) == (CALLS * gpu, CALLS * cpu), name
        assert node.device == ("/device:GPU:0" if gpu else "/device:CPU:0"), name
        assert not node.input  # the profile records no data flow
    # the op name (its leading / gone) is the node name; backward ops carry their direction
    assert nodes["conv2d/aten::conv2d (bprop)"].attr["op_name"].s.decode() == "/aten::conv2d"
    assert (
        nodes["Optimizer.step#SGD.step/aten::add_"].attr["op_name"].s.decode() == "/Optimizer.step#SGD.step/aten::add_"
    )
    # emit_nvtx without record_shapes: no data type or shapes to show
    assert not any(k in n.attr for n in graph.node for k in ("data_type", "T", "input_shapes", "_output_shapes"))


def test_run_metadata_gives_each_node_its_compute_time(training):
    _, meta, _ = read_graph(training["run"])
    stats = node_stats(meta)
    assert set(stats) == set(TRAINING)
    for name, (_, _, _, gpu, cpu) in TRAINING.items():
        device, s = stats[name]
        ns = CALLS * (gpu or cpu)  # GPU time where the op ran GPU work, else its CPU time
        assert device == ("/device:GPU:0" if gpu else "/device:CPU:0"), name
        assert s.all_end_rel_nanos == s.op_end_rel_nanos == ns, name
        assert s.all_end_rel_micros == s.op_end_rel_micros == round(ns / 1000), name
    # laid end to end in name order, so a name scope's span (TensorBoard: min start .. max end) is the sum of
    # its ops' times
    order = sorted(TRAINING)
    starts = [stats[n][1].all_start_nanos for n in order]
    durations = [stats[n][1].all_end_rel_nanos for n in order]
    # from 1 us: TensorBoard's text-format graph route leaves a zero start out and the page then drops the node
    assert starts == [1000 + sum(durations[:k]) for k in range(len(order))]
    assert [stats[n][1].all_start_micros for n in order] == [
        1 + sum(stats[m][1].all_end_rel_micros for m in order[:k]) for k in range(len(order))
    ]


@pytest.mark.slow
def test_reaggregated_database_writes_the_aggregations_totals(training, tmp_path):
    """`dlprof --database=dlprof_dldb.sqlite --iter_start 1 --iter_stop 2`: two of the three iterations (the first
    starts at the session start and ends at the first optimizer step, so iterations 1 and 2 hold one call each of
    every op but the last iteration's sync and the first iteration's ops)."""
    out = tmp_path / "out"
    run_dlprof(
        f"--database={training['db']}", f"--output_path={out}", "--iter_start", "1", "--iter_stop", "2", "-v", "quiet"
    )
    graph, meta, _ = read_graph(out / "dlprof")
    import sqlite3

    con = sqlite3.connect(out / "dlprof_dldb.sqlite")
    expected = {
        n: (c, g, t)
        for n, c, g, t in con.execute(
            "SELECT o.op_name || CASE WHEN o.direction = 'bprop' THEN ' (bprop)' ELSE '' END, "
            "n.num_calls, n.gpu_total, n.cpu_total FROM op_nodes n JOIN read_only_ops o ON o.op_index = n.op_index"
        )
    }
    con.close()
    nodes = {
        n.attr["op_name"].s.decode() + (" (bprop)" if n.attr["direction"].s == b"bprop" else ""): n for n in graph.node
    }
    assert set(nodes) == set(TRAINING_OP_NAMES)
    for name, node in nodes.items():
        calls, gpu, cpu = expected.get(name, (0, 0, 0))
        assert (node.attr["calls"].i, node.attr["gpu_time_ns"].i, node.attr["cpu_time_ns"].i) == (calls, gpu, cpu)
    # iteration 1 = [end of step 0, end of step 1): one call of each op of base T = 1.1 ms and the sync of
    # iteration 0 (at T0+85000 > T0+80000); iteration 2 likewise
    assert nodes["/aten::conv2d"].attr["calls"].i == 2 and nodes["/aten::conv2d"].attr["gpu_time_ns"].i == 20_000
    assert nodes["unassociated_cudaDeviceSynchronize"].attr["cpu_time_ns"].i == 10_000
    assert node_stats(meta)["conv2d/aten::conv2d"][1].all_end_rel_nanos == 20_000


def test_node_names_keep_scopes_directions_and_tensorboards_strict_hierarchy():
    names = graph_events.node_names(
        ["/a/b", "/a", "/a/b/c", "x", "/x", "/y[2]"], ["fprop", "fprop", "bprop", "", "fprop", "bprop"]
    )
    # "a" and "a/b" are also name scopes: TensorBoard shows such a node inside its scope as "(b)"; x without a
    # direction and x in fprop are one node
    assert names == ["a/b/(b)", "a/(a)", "a/b/c (bprop)", "x", "x", "y[2] (bprop)"]


def test_a_flat_profile_is_grouped_by_op_type_and_unassociated_calls_by_api():
    """Ops outside every scope go under their op type; the n-th calls of an unassociated API are one node per
    API under `unassociated`; scoped ops keep their scopes."""
    names = graph_events.node_names(
        ["/aten::conv2d", "/aten::conv2d[2]", "/aten::conv2d", "/m/aten::relu", "unassociated_cudaEventQuery"]
        + ["unassociated_cudaEventQuery", "unassociated_k"],
        ["fprop", "fprop", "bprop", "fprop", "", "", ""],
        ["conv2d", "conv2d", "conv2d", "relu", "cudaEventQuery", "cudaEventQuery", "k"],
        [0, 0, 0, 0, 2, 2, 3],
    )
    assert names == [
        "conv2d/aten::conv2d",
        "conv2d/aten::conv2d[2]",
        "conv2d/aten::conv2d (bprop)",
        "m/aten::relu",
        "unassociated/cudaEventQuery",
        "unassociated/cudaEventQuery",
        "unassociated/k",
    ]


def test_the_calls_of_one_api_are_one_node_with_their_sums():
    """Three unassociated cudaEventQuery ops (a torch.profiler run has hundreds, one per n-th call in an
    iteration): one node holding their calls and times, `ops` saying how many."""
    import pandas as pd

    table = pd.DataFrame(
        {
            "op_index": [0, 1, 2, 3],
            "op_id": ["CUDAEVENTQUERY_1", "CUDAEVENTQUERY_2", "CUDAEVENTQUERY_3", "RELU_1"],
            "name": ["unassociated_cudaEventQuery"] * 3 + ["/aten::relu"],
            "direction": ["", "", "", "fprop"],
            "op_type": ["cudaEventQuery"] * 3 + ["relu"],
            "data_type": [None] * 4,
            "device_id": [-1, -1, -1, 0],
            "kind": [2, 2, 2, 0],
            "calls": [4, 4, 3, 4],
            "gpu_total": [0, 0, 0, 8000],
            "cpu_total": [100, 200, 300, 9000],
            "input_shapes": [None] * 4,
            "output_shapes": [None] * 4,
        }
    )
    nodes = graph_events.node_table(table).set_index("node")
    assert list(nodes.index) == ["unassociated/cudaEventQuery", "relu/aten::relu"]
    query = nodes.loc["unassociated/cudaEventQuery"]
    assert (query["ops"], query["calls"], query["cpu_total"], query["op_id"]) == (3, 11, 600, "CUDAEVENTQUERY_1")
    graph = graph_pb2.GraphDef.FromString(graph_events.graph_def(nodes.reset_index()))
    by_name = {n.name: n for n in graph.node}
    assert by_name["unassociated/cudaEventQuery"].attr["ops"].i == 3
    assert by_name["unassociated/cudaEventQuery"].attr["calls"].i == 11
    assert "ops" not in by_name["relu/aten::relu"].attr  # one op: no count
    meta = config_pb2.RunMetadata.FromString(graph_events.run_metadata(nodes.reset_index()))
    assert node_stats(meta)["unassociated/cudaEventQuery"][1].all_end_rel_nanos == 600


def test_shapes_parse_as_dlprof_writes_them():
    assert graph_events.parse_shapes("<N:8, C:3, H:32, W:32>; <K:16, C:3, R:3, S:3>") == [[8, 3, 32, 32], [16, 3, 3, 3]]
    assert graph_events.parse_shapes("<4>; <>") == [[4], []]
    assert graph_events.parse_shapes("[2, 3]") is None and graph_events.parse_shapes(None) is None
    assert graph_events.parse_shapes("<a, b>") is None


@pytest.mark.slow
def test_data_type_and_shapes_of_dlprof_markers(tmp_path):
    """A conv2d recorded with DLProf's dict markers (fp16 input 8x3x32x32, weight 16x3x3x3, padding 1): the node
    carries the data type, the input shapes and the output shape the conv gives (32 + 2*1 - (3-1) - 1 + 1 = 32)."""
    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0)
    tid = exp.add_thread(pid=7, tid=7, name="python", process_name="python")
    args = [
        {"name": "input", "type": "tensor", "shape": [8, 3, 32, 32], "dtype": "torch.float16"},
        {"name": "weight", "type": "tensor", "shape": [16, 3, 3, 3], "dtype": "torch.float16"},
        {"name": "padding", "type": "int", "value": 1},
    ]
    for i in range(2):
        t = 1_000_000 + i * 100_000
        exp.push_pop(tid, t, t + 20000, repr({"traceMarker": ["train.py:1"], "funcStack": "Net::forward/conv2d"}))
        exp.push_pop(
            tid, t + 100, t + 19900, repr({"mod": "torch.nn.functional", "op": "conv2d", "args": args, "dir": "fprop"})
        )
        exp.launch(tid, t + 1000, t + 2000, t + 3000, t + 9000, kernel="volta_fp16_s884cudnn_fp16_128x128_nhwc")
        exp.push_pop(tid, t + 50000, t + 60000, "Optimizer.step#SGD.step")
    exp.set_session(start_time=0)
    export = exp.write(tmp_path / "markers.sqlite")
    run_dlprof(f"--database={export}", f"--output_path={tmp_path / 'out'}", "-v", "quiet")
    graph, meta, _ = read_graph(tmp_path / "out" / "dlprof")
    (conv,) = [n for n in graph.node if n.op == "conv2d"]
    assert conv.name == "Net::forward/conv2d"
    assert conv.attr["data_type"].s == b"float16" and conv.attr["T"].type == types_pb2.DT_HALF
    assert conv.attr["input_shapes"].s.decode() == "<N:8, C:3, H:32, W:32>; <K:16, C:3, R:3, S:3>"
    assert conv.attr["output_shapes"].s.decode() == "<N:8, K:16, P:32, Q:32>"
    assert [[d.size for d in s.dim] for s in conv.attr["_output_shapes"].list.shape] == [[8, 16, 32, 32]]
    assert node_stats(meta)["Net::forward/conv2d"][1].all_end_rel_nanos == 2 * 6000


# ---------------------------------------------------------------------------- a real TensorBoard


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read()


@pytest.mark.slow
@pytest.mark.parametrize("load_fast", ["auto", "false"])
def test_tensorboard_shows_graphs_beside_dlprof(training, load_fast, tmp_path):
    """GRAPHS and DLPROF are both active for a fresh run; the graph and run metadata routes answer with what
    the event file holds (both data-server modes)."""
    port = checks.free_port()  # a TensorBoard of its own: the data-server mode (--load_fast) is what varies
    exe = Path(sys.executable).parent / "tensorboard"
    cmd = [str(exe)] if exe.exists() else [sys.executable, "-m", "tensorboard.main"]
    log = open(tmp_path / "tb.log", "w")
    proc = subprocess.Popen(
        cmd
        + [
            "--logdir",
            str(training["logdir"]),
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            f"--load_fast={load_fast}",
            "--reload_interval",
            "2",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}/data"
    try:
        import json

        def both_active():
            listing = json.loads(_get(f"{base}/plugins_listing"))
            return listing.get("graphs", {}).get("enabled") and listing.get("dlprof", {}).get("enabled")

        try:
            wait_until(both_active, 90, "GRAPHS and DLPROF to be active", proc)
        except AssertionError as exc:
            raise AssertionError(f"{exc}: {(tmp_path / 'tb.log').read_text()}") from None
        info = json.loads(_get(f"{base}/plugin/graphs/info"))
        run = info["training/dlprof"]
        assert run["run_graph"] is True and run["tags"]["dlprof/op_time"]["profile"] is True
        graph = text_format.Parse(
            _get(f"{base}/plugin/graphs/graph?run=training/dlprof").decode(), graph_pb2.GraphDef()
        )
        assert {n.name for n in graph.node} == set(TRAINING)
        meta = text_format.Parse(
            _get(f"{base}/plugin/graphs/run_metadata?run=training/dlprof&tag=dlprof/op_time").decode(),
            config_pb2.RunMetadata(),
        )
        assert node_stats(meta)["linear/aten::linear (bprop)"][1].all_end_rel_nanos == CALLS * 8000
        # the DLPROF tab names each op's node
        op = json.loads(_get(f"{base}/plugin/dlprof/op?run=training/dlprof&op_index=5"))
        assert (op["op_id"], op["graph_node"]) == ("CONV2D_2", "conv2d/aten::conv2d (bprop)")
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def test_the_wire_encoding_is_protobufs():
    """graph_events serializes the messages itself (10^5 nodes through the protobuf API take many seconds): its
    varints are protobuf's, and its messages parse back into what the protobuf API builds."""
    from google.protobuf.internal.encoder import _VarintBytes
    from tensorboard.compat.proto import attr_value_pb2, tensor_shape_pb2

    values = [0, 1, 127, 128, 300, 16383, 16384, 2**35, 2**63 - 1]
    assert graph_events._varints(values).to_pylist() == [_VarintBytes(v) for v in values]
    import pandas as pd

    table = pd.DataFrame(
        {
            "op_index": [0, 1],
            "op_id": ["CONV2D_1", "X_1"],
            "name": ["/net/conv", "/x"],
            "direction": ["bprop", None],
            "op_type": ["conv2d", None],
            "data_type": ["float16", None],
            "device_id": [1, -1],
            "calls": [2, 0],
            "gpu_total": [5000, 0],
            "cpu_total": [7, -3],
            "input_shapes": ["<N:8, C:3>", None],
            "output_shapes": ["<8, 0>", None],
        }
    )
    table["kind"] = 0
    table = graph_events.node_table(table)
    graph = graph_pb2.GraphDef.FromString(graph_events.graph_def(table))
    expected = graph_pb2.GraphDef()
    node = expected.node.add(name="net/conv (bprop)", op="conv2d", device="/device:GPU:1")
    AV = attr_value_pb2.AttrValue
    for key, value in {
        "op_name": AV(s=b"/net/conv"),
        "op_id": AV(s=b"CONV2D_1"),
        "calls": AV(i=2),
        "gpu_time_ns": AV(i=5000),
        "cpu_time_ns": AV(i=7),
        "direction": AV(s=b"bprop"),
        "data_type": AV(s=b"float16"),
        "T": AV(type=types_pb2.DT_HALF),
        "input_shapes": AV(s=b"<N:8, C:3>"),
        "output_shapes": AV(s=b"<8, 0>"),
        "_output_shapes": AV(
            list=AV.ListValue(
                shape=[
                    tensor_shape_pb2.TensorShapeProto(
                        dim=[
                            tensor_shape_pb2.TensorShapeProto.Dim(size=8),
                            tensor_shape_pb2.TensorShapeProto.Dim(size=0),
                        ]
                    )
                ]
            )
        ),
    }.items():
        node.attr[key].CopyFrom(value)
    node = expected.node.add(name="x", op="op", device="/device:CPU:0")  # no op type: no type scope
    for key, value in {
        "op_name": AV(s=b"/x"),
        "op_id": AV(s=b"X_1"),
        "calls": AV(i=0),
        "gpu_time_ns": AV(i=0),
        "cpu_time_ns": AV(i=-3),
    }.items():
        node.attr[key].CopyFrom(value)
    expected.versions.producer = 1
    assert graph == expected
    # a oneof member is written even when zero: TensorBoard shows "calls: 0", not an empty value
    assert graph.node[1].attr["calls"].WhichOneof("value") == "i"
    meta = config_pb2.RunMetadata.FromString(graph_events.run_metadata(table))
    (gpu,) = [d for d in meta.step_stats.dev_stats if d.device == "/device:GPU:1"]
    assert [(s.node_name, s.all_start_micros, s.all_end_rel_micros, s.all_end_rel_nanos) for s in gpu.node_stats] == [
        ("net/conv (bprop)", 1, 5, 5000)
    ]
