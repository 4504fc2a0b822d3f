"""The op hierarchy as a TensorBoard graph (the GRAPHS tab): a GraphDef whose node names are the op names, so
`/` builds TensorBoard's name scopes, and a RunMetadata with each op's compute time, so the graph can be
coloured by time. TensorBoard's own protobuf messages, no TensorFlow.

Node names (`node_names`): the op name without its leading `/`; an op outside every scope goes under a scope
named after its op type (`conv2d/aten::conv2d`), so a flat profile reads as a hierarchy instead of one row of
unconnected nodes; the API calls (and GPU activities) outside every op are one node per API under
`unassociated` (`unassociated/cudaEventQuery`, not one node per call); ops of another direction than fprop get
` (<direction>)` appended (PyTorch backward ops share the forward op's name); a name that is also the scope
of other nodes becomes `name/(last part)`, as TensorBoard itself would rename it, so the name the viewer shows
is the one GRAPHS displays. Ops with the same node name (one name and direction) are one node, their calls
and times summed (`node_table`).

Compute time per node: the op's GPU time in the aggregation on `/device:GPU:<id>` when it ran GPU work, else
its CPU time on `/device:CPU:0`. TensorBoard reads a node's time as the span from `all_start_micros` to
`all_start_micros + all_end_rel_micros` and a scope's as the span of its nodes; nodes are laid end to end in
name order (from 1 us), so a scope's nodes are contiguous and its span is the sum of its ops' times.
TensorBoard's fields are microseconds (rounded here); the exact nanoseconds are in the `*_nanos` fields and the
node attributes.

The messages are serialized here column by column in protobuf's wire format (field numbers read from
TensorBoard's message descriptors, bytes joined element-wise by Arrow): building 10^5 NodeDefs through the
protobuf API takes many seconds, this a fraction of one.
"""

from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
from dlprof_profiler import log
from dlprof_profiler.contract import UNASSOCIATED_API, UNASSOCIATED_GPU
from tensorboard.compat.proto import (
    attr_value_pb2,
    config_pb2,
    graph_pb2,
    node_def_pb2,
    step_stats_pb2,
    tensor_shape_pb2,
    types_pb2,
    versions_pb2,
)

CPU_DEVICE = "/device:CPU:0"
UNASSOCIATED_KINDS = (UNASSOCIATED_API, UNASSOCIATED_GPU)
# Beyond this many ops no graph is written: TensorBoard takes minutes to lay out 10^5 nodes (its graph plugin's
# own measurements: 160K nodes 1m45s), and its event reader checks the CRC of every byte in Python (a 10^6-op
# graph is 0.4 GB); a profile without iterations has an op per call
MAX_NODES = 100_000
RUN_METADATA_TAG = "dlprof/op_time"
PRIMARY_DIRECTIONS = ("", "fprop")
DTYPES = {
    "float16": types_pb2.DT_HALF,
    "half": types_pb2.DT_HALF,
    "bfloat16": types_pb2.DT_BFLOAT16,
    "float32": types_pb2.DT_FLOAT,
    "float": types_pb2.DT_FLOAT,
    "float64": types_pb2.DT_DOUBLE,
    "double": types_pb2.DT_DOUBLE,
    "int8": types_pb2.DT_INT8,
    "uint8": types_pb2.DT_UINT8,
    "int16": types_pb2.DT_INT16,
    "int32": types_pb2.DT_INT32,
    "int": types_pb2.DT_INT32,
    "int64": types_pb2.DT_INT64,
    "long": types_pb2.DT_INT64,
    "bool": types_pb2.DT_BOOL,
    "complex64": types_pb2.DT_COMPLEX64,
    "complex128": types_pb2.DT_COMPLEX128,
}
_SHAPE = re.compile(r"<([^<>]*)>")
_DIM = re.compile(r"^\s*(?:[A-Za-z_]\w*\s*:\s*)?(-?\d+)\s*$")


def gpu_device(device_id: int) -> str:
    return f"/device:GPU:{int(device_id)}"


# ---------------------------------------------------------------------------- node names


def _text(values) -> pa.Array:
    """A string column (None, NaN -> "")."""
    arr = (
        values
        if isinstance(values, (pa.Array, pa.ChunkedArray))
        else pa.array(values, type=pa.string(), from_pandas=True)
    )
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    return pc.fill_null(arr.cast(pa.string()), "")


def _node_names(names, directions, op_types=None, kinds=None) -> pa.Array:
    text = pc.utf8_ltrim(_text(names), "/")
    text = pc.if_else(pc.equal(text, ""), "op", text)
    n = len(text)
    op_type = _text(op_types if op_types is not None else [None] * n)
    kind = np.asarray(kinds if kinds is not None else np.full(n, -1), dtype=np.float64)
    # API calls and GPU activities outside every op: one node per API (or kernel) under `unassociated`
    named = pc.not_equal(op_type, "").to_numpy(zero_copy_only=False)
    unassociated = pa.array(np.isin(kind, UNASSOCIATED_KINDS) & named)
    text = pc.if_else(unassociated, pc.binary_join_element_wise("unassociated", op_type, "/"), text)
    # an op outside every scope goes under its op type, so a flat profile reads as a hierarchy, not a row of nodes
    flat = pc.and_(
        pc.and_(pc.invert(pc.match_substring(text, "/")), pc.not_equal(op_type, "")), pc.invert(unassociated)
    )
    text = pc.if_else(flat, pc.binary_join_element_wise(op_type, text, "/"), text)
    direction = _text(directions)
    other = pc.invert(pc.is_in(direction, value_set=pa.array(PRIMARY_DIRECTIONS)))
    text = pc.if_else(other, pc.binary_join_element_wise(text, " (", direction, ")", ""), text)
    # every proper "/"-prefix of a name is a scope; a node named like a scope moves inside it
    parts = pc.split_pattern(text, "/")
    depth = pc.list_value_length(parts).to_numpy(zero_copy_only=False)
    scopes = [
        pc.binary_join(pc.list_slice(parts.filter(pa.array(depth > d)), 0, d), "/")
        for d in range(1, int(depth.max()) if len(depth) else 0)
    ]
    if scopes:
        clash = pc.is_in(text, value_set=pa.concat_arrays(scopes))
        last = pc.struct_field(pc.extract_regex(text, r"(?P<last>[^/]*)$"), [0])
        text = pc.if_else(clash, pc.binary_join_element_wise(text, "/(", last, ")", ""), text)
    return text


def node_names(names, directions, op_types=None, kinds=None) -> list[str]:
    """The GRAPHS node name of each op (name, direction, op type, op kind): see the module docstring. Ops of
    one name and direction share a node."""
    return _node_names(names, directions, op_types, kinds).to_pylist()


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


# ---------------------------------------------------------------------------- the op table


def op_table(ops: pd.DataFrame, stats: pd.DataFrame | None = None, first_given=None) -> pd.DataFrame:
    """Every op of a domain (`DomainModel.ops`) with its aggregation totals (`Aggregation.ops`: calls, gpu_total,
    cpu_total; 0 for ops without calls) and the first shapes its instances recorded (`first_given(column)`:
    the first non-empty value per op_index, the domain model's `first_given_values`)."""
    table = ops[["op_index", "op_id", "name", "direction", "op_type", "data_type", "device_id"]].copy()
    table["kind"] = ops["kind"].to_numpy() if "kind" in ops.columns else -1
    for col in ("calls", "gpu_total", "cpu_total"):
        if stats is not None and len(stats) and col in stats.columns:
            values = pd.Series(stats[col].to_numpy(), index=stats["op_index"].to_numpy())
            table[col] = table["op_index"].map(values).fillna(0).to_numpy(np.int64)
        else:
            table[col] = np.zeros(len(table), dtype=np.int64)
    for col in ("input_shapes", "output_shapes"):
        column = pd.Series([None] * len(table), index=table.index, dtype=object)
        if first_given is not None:
            column = table["op_index"].map(first_given(col)).astype(object)
        table[col] = column.where(column.notna(), None)
    return table


def node_table(table: pd.DataFrame) -> pd.DataFrame:
    """One row per GRAPHS node (`node`: its name) from `op_table(...)`: ops sharing a node (the calls of an
    unassociated API, one layer's ops in several processes) are summed; the other columns are the first op's
    (op_index order), data type and shapes the first given, the device the first that ran GPU work."""
    t = table.reset_index(drop=True).copy()
    t["node"] = node_names(t["name"], t["direction"], t["op_type"], t["kind"])
    t["ops"] = 1
    on_gpu = t["gpu_total"].to_numpy(np.int64) > 0
    t["gpu_device"] = t["device_id"].where(on_gpu)
    groups = t.groupby("node", sort=False)
    out = groups.agg(
        op_index=("op_index", "first"),
        op_id=("op_id", "first"),
        name=("name", "first"),
        direction=("direction", "first"),
        op_type=("op_type", "first"),
        kind=("kind", "first"),
        data_type=("data_type", "first"),
        device_id=("device_id", "first"),
        gpu_device=("gpu_device", "first"),
        ops=("ops", "sum"),
        calls=("calls", "sum"),
        gpu_total=("gpu_total", "sum"),
        cpu_total=("cpu_total", "sum"),
        input_shapes=("input_shapes", "first"),
        output_shapes=("output_shapes", "first"),
    ).reset_index()
    out["device_id"] = out["gpu_device"].where(out["gpu_device"].notna(), out["device_id"])
    for col in ("data_type", "input_shapes", "output_shapes", "direction", "op_type"):
        out[col] = out[col].astype(object).where(out[col].notna(), None)
    return out.drop(columns="gpu_device")


def node_devices(table: pd.DataFrame) -> np.ndarray:
    """The device of each node: its GPU when the op ran GPU work in the aggregation, else the CPU."""
    gpu = table["gpu_total"].to_numpy(np.int64) > 0
    device_ids = table["device_id"].fillna(-1).to_numpy(np.int64)
    on_gpu = gpu & (device_ids >= 0)
    names = np.array([gpu_device(d) for d in range(int(device_ids.max()) + 1)] if on_gpu.any() else [], dtype=object)
    out = np.full(len(table), CPU_DEVICE, dtype=object)
    out[on_gpu] = names[device_ids[on_gpu]]
    return out


def compute_times(table: pd.DataFrame) -> np.ndarray:
    """Compute time of each node in ns: GPU time for ops that ran GPU work, CPU time otherwise."""
    gpu = table["gpu_total"].to_numpy(np.int64)
    return np.where(gpu > 0, gpu, table["cpu_total"].to_numpy(np.int64))


# ---------------------------------------------------------------------------- protobuf wire format
# Columns of message bytes (Arrow binary arrays) joined element-wise by Arrow: no Python loop per op.

_EMPTY = pa.scalar(b"", pa.binary())


def _field(message, name: str) -> int:
    return message.DESCRIPTOR.fields_by_name[name].number


def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1  # int64: negatives as their two's complement
    out = bytearray()
    while n > 0x7F:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _varints(values) -> pa.Array:
    """The varint of each int64 (negatives as their two's complement), as a binary column."""
    x = np.asarray(values, dtype=np.int64).view(np.uint64)
    n = x.size
    size = np.ones(n, dtype=np.int64)
    for j in range(1, 10):
        size += x >= np.uint64(1 << (7 * j))
    width = int(size.max()) if n else 1
    groups = np.empty((n, width), dtype=np.uint8)
    for j in range(width):
        groups[:, j] = ((x >> np.uint64(7 * j)) & np.uint64(0x7F)).astype(np.uint8) | (
            (size > j + 1).astype(np.uint8) << 7
        )
    data = groups if width == 1 else groups[np.arange(width)[None, :] < size[:, None]]
    offsets = np.concatenate([[0], np.cumsum(size)]).astype(np.int32)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data.tobytes())])


def _bytes(values) -> pa.Array:
    return _text(values).cast(pa.binary())


def _join(*columns) -> pa.Array:
    return pc.binary_join_element_wise(*columns, b"")


def _delimited(number: int, payloads: pa.Array) -> pa.Array:
    """Length-delimited fields (strings, messages): key, length, payload."""
    return _join(
        _varint(number << 3 | 2), _varints(pc.binary_length(payloads).to_numpy(zero_copy_only=False)), payloads
    )


def _ints(number: int, values, keep_zeros: bool = False) -> pa.Array:
    """Varint fields; zeros left out as proto3 does, except for oneof members (keep_zeros)."""
    values = np.asarray(values, dtype=np.int64)
    out = _join(_varint(number << 3), _varints(values))
    return out if keep_zeros else _only(out, values != 0)


def _only(column: pa.Array, mask: np.ndarray) -> pa.Array:
    return pc.if_else(pa.array(mask), column, _EMPTY)


def _concatenated(column: pa.Array) -> bytes:
    """All values of a binary column (without nulls) as one byte string."""
    if len(column) == 0:
        return b""
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)[column.offset : column.offset + len(column) + 1]
    return column.buffers()[2][int(offsets[0]) : int(offsets[-1])].to_pybytes()


def _one(number: int, payload: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


_AV = attr_value_pb2.AttrValue
_NODE = {k: _field(node_def_pb2.NodeDef, k) for k in ("name", "op", "device", "attr")}
_AV_S, _AV_I, _AV_TYPE = (_field(_AV, k) for k in ("s", "i", "type"))
_STATS = {
    k: _field(step_stats_pb2.NodeExecStats, k)
    for k in (
        "node_name",
        "all_start_micros",
        "op_end_rel_micros",
        "all_end_rel_micros",
        "all_start_nanos",
        "op_end_rel_nanos",
        "all_end_rel_nanos",
    )
}


def _attr(key: str, values: pa.Array, mask: np.ndarray | None = None) -> pa.Array:
    """NodeDef.attr entries (map<string, AttrValue>: key field 1, value field 2) of AttrValue payloads."""
    out = _delimited(_NODE["attr"], _join(_one(1, key.encode()), _delimited(2, values)))
    return out if mask is None else _only(out, mask)


def _shapes_value(text) -> bytes:
    """An AttrValue list of shapes from DLProf's shape text (b"" when it does not parse)."""
    shapes = parse_shapes(text)
    if not shapes:
        return b""
    msg = attr_value_pb2.AttrValue(
        list=attr_value_pb2.AttrValue.ListValue(
            shape=[
                tensor_shape_pb2.TensorShapeProto(dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=d) for d in dims])
                for dims in shapes
            ]
        )
    )
    return msg.SerializeToString()


def _known(column: pd.Series) -> np.ndarray:
    return pc.not_equal(_text(column), "").to_numpy(zero_copy_only=False)


# ---------------------------------------------------------------------------- the messages


def graph_def(table: pd.DataFrame) -> bytes:
    """A serialized GraphDef with one node per row of `node_table(...)` (no edges: the profile records no data
    flow)."""
    ints = lambda col: table[col].fillna(0).to_numpy(np.int64)  # noqa: E731
    string = lambda col: _delimited(_AV_S, _bytes(table[col]))  # noqa: E731
    op_types = table["op_type"].astype(object).where(_known(table["op_type"]), "op")
    columns = [
        _delimited(_NODE["name"], _bytes(table["node"])),
        _delimited(_NODE["op"], _bytes(op_types)),
        _delimited(_NODE["device"], _bytes(node_devices(table))),
        _attr("op_name", string("name")),
        _attr("op_id", string("op_id")),
        _attr("calls", _ints(_AV_I, ints("calls"), keep_zeros=True)),
        _attr("gpu_time_ns", _ints(_AV_I, ints("gpu_total"), keep_zeros=True)),
        _attr("cpu_time_ns", _ints(_AV_I, ints("cpu_total"), keep_zeros=True)),
        _attr("direction", string("direction"), _known(table["direction"])),
    ]
    merged = table["ops"].to_numpy(np.int64) > 1 if "ops" in table.columns else np.zeros(len(table), bool)
    if merged.any():  # how many ops a node stands for (the calls of one unassociated API ...)
        columns.append(_attr("ops", _ints(_AV_I, table["ops"].to_numpy(np.int64), keep_zeros=True), merged))
    has_dtype = _known(table["data_type"])
    if has_dtype.any():
        codes, distinct = pd.factorize(table["data_type"].astype(object))
        enum = np.array([DTYPES.get(str(d).lower(), 0) for d in distinct] + [0], dtype=np.int64)[codes]
        columns += [
            _attr("data_type", string("data_type"), has_dtype),
            _attr("T", _ints(_AV_TYPE, enum, keep_zeros=True), enum > 0),
        ]
    for col in ("input_shapes", "output_shapes"):
        given = _known(table[col])
        if given.any():
            columns.append(_attr(col, string(col), given))
    if _known(table["output_shapes"]).any():
        codes, distinct = pd.factorize(table["output_shapes"].astype(object))
        parsed = np.array([_shapes_value(t) for t in distinct] + [b""], dtype=object)[codes]
        lists = pa.array(parsed, type=pa.binary())
        columns.append(_attr("_output_shapes", lists, pc.binary_length(lists).to_numpy(zero_copy_only=False) > 0))
    nodes = _delimited(_field(graph_pb2.GraphDef, "node"), _join(*columns)) if len(table) else pa.array([], pa.binary())
    producer = _varint(_field(versions_pb2.VersionDef, "producer") << 3) + _varint(1)
    return _concatenated(nodes) + _one(_field(graph_pb2.GraphDef, "versions"), producer)


def run_metadata(table: pd.DataFrame) -> bytes:
    """A serialized RunMetadata whose step stats give, per device, each node's (`node_table(...)`) compute time,
    the nodes laid end to end in node-name order."""
    names = _text(table["node"])
    order = pc.sort_indices(names).to_numpy()  # byte order, as TensorBoard's names sort
    names = names.take(pa.array(order))
    devices = node_devices(table)[order]
    times = compute_times(table)[order]
    micros = np.rint(times / 1000).astype(np.int64)
    # from 1 us: the graph route serves text format, which leaves a zero start out, and TensorBoard reads a
    # missing start as no time at all
    start_us = 1 + np.concatenate([[0], np.cumsum(micros)[:-1]]).astype(np.int64)
    start_ns = 1000 + np.concatenate([[0], np.cumsum(times)[:-1]]).astype(np.int64)
    f = _STATS
    timed = times > 0
    stats = (
        _delimited(
            _field(step_stats_pb2.DeviceStepStats, "node_stats"),
            _join(
                _delimited(f["node_name"], names.cast(pa.binary())),
                _ints(f["all_start_micros"], start_us),
                _ints(f["op_end_rel_micros"], micros),
                _ints(f["all_end_rel_micros"], micros),
                _ints(f["all_start_nanos"], start_ns),
                _ints(f["op_end_rel_nanos"], times),
                _ints(f["all_end_rel_nanos"], times),
            ),
        )
        if len(table)
        else pa.array([], pa.binary())
    )
    parts = []
    for device in sorted(set(devices.tolist())):
        body = _one(_field(step_stats_pb2.DeviceStepStats, "device"), device.encode()) + _concatenated(
            stats.filter(pa.array(timed & (devices == device)))
        )
        parts.append(_one(_field(step_stats_pb2.StepStats, "dev_stats"), body))
    return _one(_field(config_pb2.RunMetadata, "step_stats"), b"".join(parts))


def op_graph(domain_model, aggregation) -> tuple[bytes, bytes] | None:
    """The GRAPHS content of one domain and aggregation (`correlate.DomainModel`, `aggregate.Aggregation`):
    serialized GraphDef and RunMetadata; None (said on the console) for more than MAX_NODES ops."""
    if len(domain_model.ops) > MAX_NODES:
        log.info(
            f"GRAPHS: no op graph for {len(domain_model.ops):,} ops (TensorBoard lays out at most about "
            f"{MAX_NODES:,} nodes); the DLPROF tab shows every op"
        )
        return None
    table = op_table(domain_model.ops, aggregation.ops, domain_model.first_given_values)
    nodes = node_table(table)
    return graph_def(nodes), run_metadata(nodes)
