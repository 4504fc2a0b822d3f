"""TensorBoard event files: one run directory per profile, tagged for the `dlprof` plugin, plus
per-iteration scalars that show in the SCALARS tab and the op hierarchy as a graph with its op times for the
GRAPHS tab (graph_events). Written without TensorFlow."""

from __future__ import annotations

import json
import os
import socket
import struct
import time
from pathlib import Path

from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2, types_pb2

from dlprof_profiler.contract import EVENT_SUFFIX, PLUGIN_NAME, PROFILE_TAG, SCALAR_TAGS
from dlprof_profiler.outputs.crc32c import masked_crc32c
from dlprof_profiler.outputs.graph_events import RUN_METADATA_TAG


def run_directory(output_path: Path, profile_name: str) -> Path:
    """The folder of a profile's event file, which TensorBoard names the run by (its path below the logdir):
    `<output_path>/<profile_name>`, or the output folder itself when it already bears the profile's name
    (`--output_path=runs/example --profile_name=example` is the run `example`, not `example/example`)."""
    out = Path(output_path)
    return out if out.resolve().name == profile_name else out / profile_name


def existing_event_files(run_dir: Path) -> list[Path]:
    """Event files an earlier dlprof run left in this run directory."""
    if not run_dir.is_dir():
        return []
    return sorted(p for p in run_dir.iterdir() if "tfevents" in p.name and p.name.endswith(EVENT_SUFFIX))


def _profile_summary(metadata: dict) -> summary_pb2.Summary.Value:
    content = json.dumps(metadata, sort_keys=True).encode("utf-8")
    meta = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name=PLUGIN_NAME, content=content),
        data_class=summary_pb2.DATA_CLASS_TENSOR,  # the data server keeps no samples of an unknown class
    )
    tensor = tensor_pb2.TensorProto(
        dtype=types_pb2.DT_STRING, tensor_shape=tensor_shape_pb2.TensorShapeProto(), string_val=[content]
    )
    return summary_pb2.Summary.Value(tag=PROFILE_TAG, metadata=meta, tensor=tensor)


def _scalar(tag: str, value: float) -> summary_pb2.Summary.Value:
    meta = summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR,
    )
    return summary_pb2.Summary.Value(tag=tag, metadata=meta, simple_value=float(value))


class RecordWriter:
    """TFRecord framing, as TensorBoard's writer: length, its masked CRC-32C, the data, its masked CRC-32C
    (TensorBoard's writer computes the CRC in Python a byte at a time: minutes for the graph of 10^6 ops)."""

    def __init__(self, fh):
        self.fh = fh

    def write(self, data: bytes) -> None:
        header = struct.pack("<Q", len(data))
        self.fh.write(header + struct.pack("<I", masked_crc32c(header)))
        self.fh.write(data)
        self.fh.write(struct.pack("<I", masked_crc32c(data)))

    def flush(self) -> None:
        self.fh.flush()


def event_file_name() -> str:
    return f"events.out.tfevents.{int(time.time())}.{socket.gethostname()}.{os.getpid()}{EVENT_SUFFIX}"


def write_event_file(path: Path, metadata: dict, iterations, graph=None, extra_scalars=()) -> Path:
    """Write a run's event file; `iterations` is the aggregation's iteration table (one scalar step each);
    `graph` an optional pair of serialized GraphDef and RunMetadata (graph_events.op_graph) for the GRAPHS tab;
    `extra_scalars` more (step, tag, value) scalars (the iteration times of every rank of a multi-rank run)."""
    now = time.time()
    if graph is not None:
        metadata = dict(metadata, graph=True)  # the viewer names the GRAPHS node of an op
    with open(path, "wb") as fh:
        writer = RecordWriter(fh)
        writer.write(event_pb2.Event(wall_time=now, file_version="brain.Event:2").SerializeToString())
        if graph is not None:
            graph_def, run_metadata = graph
            writer.write(event_pb2.Event(wall_time=now, step=0, graph_def=graph_def).SerializeToString())
            tagged = event_pb2.TaggedRunMetadata(tag=RUN_METADATA_TAG, run_metadata=run_metadata)
            writer.write(event_pb2.Event(wall_time=now, step=0, tagged_run_metadata=tagged).SerializeToString())
        writer.write(
            event_pb2.Event(
                wall_time=now, step=0, summary=summary_pb2.Summary(value=[_profile_summary(metadata)])
            ).SerializeToString()
        )
        for row in iterations.itertuples(index=False):
            values = [
                _scalar(SCALAR_TAGS["iteration_time_ms"], row.duration / 1e6),
                _scalar(SCALAR_TAGS["gpu_utilization_pct"], row.gpu_utilization),
                _scalar(SCALAR_TAGS["tc_kernel_time_ms"], row.tc_kernel_time_per_gpu / 1e6),
            ]
            writer.write(
                event_pb2.Event(
                    wall_time=now, step=int(row.iteration), summary=summary_pb2.Summary(value=values)
                ).SerializeToString()
            )
        for step, tag, value in extra_scalars:
            writer.write(
                event_pb2.Event(
                    wall_time=now, step=int(step), summary=summary_pb2.Summary(value=[_scalar(tag, value)])
                ).SerializeToString()
            )
        writer.flush()
    return path
