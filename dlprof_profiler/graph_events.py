"""The op hierarchy as a TensorBoard graph (the GRAPHS tab): a GraphDef whose node names are the op names, so
`/` builds TensorBoard's name scopes, and a RunMetadata with each op's compute time, so the graph can be
coloured by time. Built with TensorBoard's own protobufs; no TensorFlow.

Node names (`node_names`): the op name without its leading `/`; ops of another direction than fprop get
` (<direction>)` appended (PyTorch backward ops share the forward op's name); a name that is also the scope
of other nodes becomes `name/(last part)`, as TensorBoard itself would rename it, so the name the viewer shows
is the one GRAPHS displays.

Compute time per node: the op's GPU time in the aggregation on `/device:GPU:<id>` when it ran GPU work, else
its CPU time on `/device:CPU:0`. TensorBoard reads a node's time as the span from `all_start_micros` to
`all_start_micros + all_end_rel_micros` and a scope's as the span of its nodes; nodes are laid end to end in
name order (from 1 us), so a scope's nodes are contiguous and its span is the sum of its ops' times. TensorBoard's fields
are microseconds (rounded here); the exact nanoseconds are in the `*_nanos` fields and the node attributes.
"""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
from tensorboard.compat.proto import (attr_value_pb2, config_pb2, graph_pb2, step_stats_pb2, tensor_shape_pb2,
                                      types_pb2, versions_pb2)

CPU_DEVICE = "/device:CPU:0"
RUN_METADATA_TAG = "dlprof/op_time"
PRIMARY_DIRECTIONS = ("", "fprop")
DTYPES = {
    "float16": types_pb2.DT_HALF, "half": types_pb2.DT_HALF, "bfloat16": types_pb2.DT_BFLOAT16,
    "float32": types_pb2.DT_FLOAT, "float": types_pb2.DT_FLOAT, "float64": types_pb2.DT_DOUBLE,
    "double": types_pb2.DT_DOUBLE, "int8": types_pb2.DT_INT8, "uint8": types_pb2.DT_UINT8,
    "int16": types_pb2.DT_INT16, "int32": types_pb2.DT_INT32, "int": types_pb2.DT_INT32,
    "int64": types_pb2.DT_INT64, "long": types_pb2.DT_INT64, "bool": types_pb2.DT_BOOL,
    "complex64": types_pb2.DT_COMPLEX64, "complex128": types_pb2.DT_COMPLEX128,
}
_SHAPE = re.compile(r"<([^<>]*)>")
_DIM = re.compile(r"^\s*(?:[A-Za-z_]\w*\s*:\s*)?(-?\d+)\s*$")


def gpu_device(device_id: int) -> str:
    return f"/device:GPU:{int(device_id)}"


def node_names(names, directions) -> list[str]:
    """The GRAPHS node name of each op (name, direction): see the module docstring."""
    out = []
    for name, direction in zip(names, directions):
        text = str(name or "").lstrip("/") or "op"
        direction = str(direction or "")
        if direction not in PRIMARY_DIRECTIONS:
            text = f"{text} ({direction})"
        out.append(text)
    seen: dict[str, int] = {}
    for i, text in enumerate(out):   # ("", name) and ("fprop", name) would collide: number the later ones
        k = seen.get(text, 0) + 1
        seen[text] = k
        if k > 1:
            out[i] = f"{text} (#{k})"
    scopes = set()
    for text in out:
        pos = text.find("/")
        while pos > 0:
            scopes.add(text[:pos])
            pos = text.find("/", pos + 1)
    return [f"{t}/({t.rsplit('/', 1)[-1]})" if t in scopes else t for t in out]


def parse_shapes(text) -> list[list[int]] | None:
    """DLProf's shape text (`<8, 3>; <N:8, C:3>`) as dimension lists; None if it is not in that form."""
    if not isinstance(text, str) or not text.strip():
        return None
    shapes = []
    for body in _SHAPE.findall(text):
        dims = [d for d in body.split(",") if d.strip()]
        matches = [_DIM.match(d) for d in dims]
        if not all(matches):
            return None
        shapes.append([int(m.group(1)) for m in matches])
    return shapes or None


def op_table(ops: pd.DataFrame, stats: pd.DataFrame | None = None, instances: pd.DataFrame | None = None
             ) -> pd.DataFrame:
    """Every op of a domain (`DomainModel.ops`) with its aggregation totals (`Aggregation.ops`: calls, gpu_total,
    cpu_total; 0 for ops without calls) and the first shapes its instances recorded (`DomainModel.instances`)."""
    table = ops[["op_index", "op_id", "name", "direction", "op_type", "data_type", "device_id"]].copy()
    for col in ("calls", "gpu_total", "cpu_total"):
        if stats is not None and len(stats) and col in stats.columns:
            values = pd.Series(stats[col].to_numpy(), index=stats["op_index"].to_numpy())
            table[col] = table["op_index"].map(values).fillna(0).to_numpy(np.int64)
        else:
            table[col] = np.zeros(len(table), dtype=np.int64)
    for col in ("input_shapes", "output_shapes"):
        column = pd.Series([None] * len(table), index=table.index, dtype=object)
        if instances is not None and len(instances) and col in instances.columns:
            given = instances.loc[instances[col].notna() & (instances[col].astype(object) != ""), ["op_index", col]]
            first = given.drop_duplicates("op_index")   # instances are in start order
            column = table["op_index"].map(pd.Series(first[col].to_numpy(dtype=object),
                                                     index=first["op_index"].to_numpy())).astype(object)
        table[col] = column.where(column.notna(), None)
    return table


def _text_attr(value) -> attr_value_pb2.AttrValue:
    return attr_value_pb2.AttrValue(s=str(value).encode("utf-8"))


def _known(value) -> bool:
    return value is not None and not (isinstance(value, float) and np.isnan(value)) and str(value) != ""


def graph_def(table: pd.DataFrame) -> graph_pb2.GraphDef:
    """A GraphDef with one node per op of `op_table(...)` (no edges: the profile records no data flow)."""
    graph = graph_pb2.GraphDef(versions=versions_pb2.VersionDef(producer=1))
    names = node_names(table["name"], table["direction"])
    columns = [table[c].tolist() for c in ("name", "op_id", "op_type", "direction", "data_type", "input_shapes",
                                           "output_shapes", "calls", "gpu_total", "cpu_total")]
    devices = node_devices(table)
    for node_name, device, (name, op_id, op_type, direction, dtype, ins, outs, calls, gpu, cpu) in \
            zip(names, devices, zip(*columns)):
        node = graph.node.add(name=node_name, op=str(op_type or "op"), device=device)
        attr = node.attr
        attr["op_name"].CopyFrom(_text_attr(name))
        attr["op_id"].CopyFrom(_text_attr(op_id))
        if _known(direction):
            attr["direction"].CopyFrom(_text_attr(direction))
        if _known(dtype):
            attr["data_type"].CopyFrom(_text_attr(dtype))
            if str(dtype).lower() in DTYPES:
                attr["T"].CopyFrom(attr_value_pb2.AttrValue(type=DTYPES[str(dtype).lower()]))
        if _known(ins):
            attr["input_shapes"].CopyFrom(_text_attr(ins))
        if _known(outs):
            attr["output_shapes"].CopyFrom(_text_attr(outs))
            shapes = parse_shapes(outs)
            if shapes:
                attr["_output_shapes"].CopyFrom(attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(
                    shape=[tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d)
                                                                  for d in dims]) for dims in shapes])))
        attr["calls"].CopyFrom(attr_value_pb2.AttrValue(i=int(calls)))
        attr["gpu_time_ns"].CopyFrom(attr_value_pb2.AttrValue(i=int(gpu)))
        attr["cpu_time_ns"].CopyFrom(attr_value_pb2.AttrValue(i=int(cpu)))
    return graph


def node_devices(table: pd.DataFrame) -> list[str]:
    """The device of each node: its GPU when the op ran GPU work in the aggregation, else the CPU."""
    gpu = table["gpu_total"].to_numpy(np.int64) > 0
    device_ids = table["device_id"].fillna(-1).to_numpy(np.int64)
    return [gpu_device(d) if g and d >= 0 else CPU_DEVICE for g, d in zip(gpu, device_ids)]


def compute_times(table: pd.DataFrame) -> np.ndarray:
    """Compute time of each node in ns: GPU time for ops that ran GPU work, CPU time otherwise."""
    gpu = table["gpu_total"].to_numpy(np.int64)
    return np.where(gpu > 0, gpu, table["cpu_total"].to_numpy(np.int64))


def run_metadata(table: pd.DataFrame) -> config_pb2.RunMetadata:
    """Step stats: per device, each node's compute time, laid end to end in node-name order."""
    names = np.array(node_names(table["name"], table["direction"]), dtype=object)
    devices = np.array(node_devices(table), dtype=object)
    times = compute_times(table)
    order = np.argsort(names, kind="stable")
    micros = np.rint(times[order] / 1000).astype(np.int64)
    # from 1 us: the graph route serves text format, which leaves a zero start out, and TensorBoard reads a
    # missing start as no time at all
    start_us = 1 + np.concatenate([[0], np.cumsum(micros)[:-1]])
    start_ns = 1000 + np.concatenate([[0], np.cumsum(times[order])[:-1]])
    meta = config_pb2.RunMetadata()
    by_device: dict[str, step_stats_pb2.DeviceStepStats] = {}
    for dev in sorted(set(devices.tolist())):
        by_device[dev] = meta.step_stats.dev_stats.add(device=dev)
    for k, i in enumerate(order):
        if times[i] <= 0:
            continue
        by_device[devices[i]].node_stats.add(
            node_name=names[i], all_start_micros=int(start_us[k]), all_end_rel_micros=int(micros[k]),
            op_start_rel_micros=0, op_end_rel_micros=int(micros[k]), all_start_nanos=int(start_ns[k]),
            all_end_rel_nanos=int(times[i]), op_end_rel_nanos=int(times[i]), timeline_label=str(names[i]))
    return meta


def op_graph(domain_model, aggregation) -> tuple[graph_pb2.GraphDef, config_pb2.RunMetadata]:
    """The GRAPHS content of one domain and aggregation (`correlate.DomainModel`, `aggregate.Aggregation`)."""
    table = op_table(domain_model.ops, aggregation.ops, domain_model.instances)
    return graph_def(table), run_metadata(table)
