"""Reading a DLProf database back into the engine's frames (what a re-aggregation needs): schema 3.0 from its
raw tables (names resolved through `strings` with integer codes, never per row), schema 2.0 from its
`read_only_*` tables. Both give the same (trace, correlation, profile, domain ids, op_index offsets)."""

from __future__ import annotations

import copy
import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from dlprof_profiler import contract as K
from dlprof_profiler.engine.analysis import RANGE_INFO_FOR_REANALYSIS
from dlprof_profiler.engine.correlate import Correlation, DomainModel, call_metrics, launch_links, range_label_counts
from dlprof_profiler.engine.markers import FAMILY_OF_MODE, classify_ranges, with_call_fields
from dlprof_profiler.db import range_blocks
from dlprof_profiler.db.schema import SCHEMA
from dlprof_profiler.errors import DLProfError
from dlprof_profiler.ingest.sqlite_source import SqliteSource
from dlprof_profiler.engine.memory import empty_memory_frame
from dlprof_profiler.engine.structure import RangeForest, ThreadTimeKeys
from dlprof_profiler.engine.trace import DEVICE_COLUMNS, GPU_COLUMNS, MEMORY_COLUMNS, Trace, make_frame

DETAIL_COLUMNS = ["data_type", "input_shapes", "output_shapes", "parameters", "stack_trace"]
# what a 2.0 database must hold to be read back (read_only_range_labels came late: files without it still load)
_V2_REQUIRED = {
    "db_version",
    "profile_info",
    "iteration_list",
    "read_only_activity_owners",
    "read_only_cuda_calls",
    "read_only_cuda_syncs",
    "read_only_domains",
    "read_only_gpu_activities",
    "read_only_gpu_infos",
    "read_only_io_calls",
    "read_only_kernel_tc",
    "read_only_model_config",
    "read_only_op_instance_details",
    "read_only_op_instances",
    "read_only_ops",
    "read_only_processes",
    "read_only_ranges",
    "read_only_system_config",
    "read_only_threads",
}
_STORED_INSTANCE_COLUMNS = [
    "domain_id",
    "instance_id",
    "op_index",
    "kind",
    "source_id",
    "start",
    "end",
    "pid",
    "global_tid",
    "device_id",
    "cpu_overhead",
    "gpu_time",
    "gpu_start",
    "gpu_end",
    "n_gpu",
    "n_kernels",
]


def load_model(path: Path, rank: int = K.DEFAULT_RANK):
    """(trace, correlation, profile info, {domain: domain_id}, {domain: op_index offset or map}) of one rank."""
    src = SqliteSource(path, immutable=False)
    try:
        version = src.query_scalar("SELECT current_version FROM db_version")
        major = K.schema_major(version)
        if major not in K.READABLE_SCHEMA_MAJORS:
            raise DLProfError(
                f"{path}: DLProf database schema {version} is not supported by this dlprof "
                f"(schema {K.DB_SCHEMA_VERSION})"
            )
        _check_tables(src, path, major)
        reader = _V3(src, path, rank) if major == "3" else _V2(src, path)
        return _model(reader)
    finally:
        src.close()


# what load_model and the aggregation after it hold at their peak (max RSS), measured on databases of the
# generated profile of bench_engine.py (10^6 and 3*10^6 kernels: 1941 and 4730 MiB) and of a 10^7-event Kineto
# trace (2421 MiB; this predicts 2415): a base and a cost per row read whole
READ_BASE_BYTES = 550 << 20
READ_BYTES_PER_ROW = 209


def rows_read_whole(path: Path, rank: int = K.DEFAULT_RANK) -> int | None:
    """How many ranges, API calls, GPU activities and op instances load_model reads of a rank (None for a
    schema 2.0 file, or one missing a table): from the ids' key ranges and the blocks' row counts, without a
    scan of the tables."""
    src = SqliteSource(path, immutable=False)
    try:
        if "db_version" not in src.tables:
            return None
        major = K.schema_major(src.query_scalar("SELECT current_version FROM db_version"))
        if major != "3" or _missing_tables(src, major):
            return None  # (load_model names what it cannot read)

        def ids(table: str, key: str, scope: int) -> int:
            lo, hi = _key_range(scope)
            last = src.query_scalar(f"SELECT max({key}) FROM {table} WHERE {key} BETWEEN {lo} AND {hi}")
            return 0 if last is None else int(last) - lo + 1  # (ids are 0, 1, 2, ... within their scope)

        if K.RAW_RANGE_BLOCKS in src.tables:
            ranges = src.query_scalar(f"SELECT sum(rows) FROM {K.RAW_RANGE_BLOCKS} WHERE rank = {int(rank)}")
        else:
            ranges = src.query_scalar(f"SELECT count(*) FROM {K.RAW_RANGES} WHERE rank = {int(rank)}")
        domains = [int(r[0]) for r in src.fetchall(f"SELECT domain_id FROM {K.RAW_DOMAINS} WHERE rank = ?", (rank,))]
        return (
            int(ranges or 0)
            + ids(K.RAW_API_CALLS, "api_id", rank)
            + ids(K.RAW_GPU_ACTIVITIES, "activity_id", rank)
            + sum(ids(K.RAW_OP_INSTANCES, "instance_id", d) for d in domains)
        )
    finally:
        src.close()


def made_from(path: Path, rank: int = K.DEFAULT_RANK) -> tuple[str, str] | None:
    """(source file, source kind) of a rank as its database records them (None when it records none)."""
    src = SqliteSource(path, immutable=False)
    try:
        if K.RANKS not in src.tables:
            return None
        rows = src.fetchall(f"SELECT source_file, source_kind FROM {K.RANKS} WHERE rank = ?", (rank,))
    finally:
        src.close()
    return (str(rows[0][0]), str(rows[0][1] or "")) if rows and rows[0][0] else None


def memory_to_read(rows: int) -> int:
    """About the peak memory, in bytes, of re-analysing a rank of `rows` rows read whole (rows_read_whole)."""
    return READ_BASE_BYTES + READ_BYTES_PER_ROW * rows


def api_owners(trace: Trace, gpu_api: np.ndarray, inst: pd.DataFrame, gpu_instance: np.ndarray) -> np.ndarray:
    """Op instance of every API call (the correlator's api_instance), which the database does not store: the
    call that launched GPU work belongs to its activities' instance, an unassociated call to its own instance,
    any other call to the innermost instance around it on its thread (as the correlator assigned it)."""
    api = trace.api_calls
    owner = np.full(len(api), -1, dtype=np.int64)
    if len(api) == 0 or len(inst) == 0:
        return owner
    tids, start = api["global_tid"].to_numpy(np.int64), api["start"].to_numpy(np.int64)
    ids = inst["instance_id"].to_numpy(np.int64)
    timed = np.flatnonzero(
        np.isin(inst["kind"].to_numpy(), (*K.INSTANCE_KINDS_FROM_RANGES, K.BACKWARD_PASS))
        & (inst["global_tid"].to_numpy(np.int64) >= 0)
    )
    if timed.size:
        i_tid = inst["global_tid"].to_numpy(np.int64)[timed]
        i_start, i_end = inst["start"].to_numpy(np.int64)[timed], inst["end"].to_numpy(np.int64)[timed]
        keys = ThreadTimeKeys([i_tid, tids], [i_start, i_end, start])
        row = RangeForest(i_tid, i_start, i_end, ids[timed]).innermost_at(keys, tids, start)
        owner = np.where(row >= 0, ids[timed][np.maximum(row, 0)], -1)
    api_id = inst["api_id"].to_numpy(np.int64)
    own = api_id >= 0
    # api ids are the rows of the trace's API calls (0, 1, 2, ... as loaded)
    owner[api_id[own]] = ids[own]
    launched = (np.asarray(gpu_api) >= 0) & (np.asarray(gpu_instance) >= 0)
    owner[np.asarray(gpu_api)[launched]] = np.asarray(gpu_instance)[launched]
    return owner


def _required_tables(major: str) -> set[str]:
    if major == "2":
        return _V2_REQUIRED
    later = {*K.SCHEMA_3_1_TABLES, *K.SCHEMA_3_2_TABLES, *K.SCHEMA_3_3_TABLES}
    return set(re.findall(r"CREATE (?:TABLE|VIEW) (\w+)", SCHEMA)) - later


def _missing_tables(src: SqliteSource, major: str) -> list[str]:
    missing = _required_tables(major) - src.tables
    if major == "3" and not {K.RAW_RANGE_BLOCKS, K.RAW_RANGES} & src.tables:
        missing.add(K.RAW_RANGE_BLOCKS)  # the ranges, in either of their two forms
    return sorted(missing)


def _check_tables(src: SqliteSource, path: Path, major: str) -> None:
    """A database that lost a table (a hand edit, a partial copy) is named as damaged, not read half."""
    missing = _missing_tables(src, major)
    if missing:
        raise DLProfError(
            f"{path}: damaged DLProf database: table{'s' if len(missing) > 1 else ''} {', '.join(missing)} missing"
        )


def _model(reader):
    profile = reader.profile()
    trace = Trace(source=Path(profile.get("source_file") or reader.path))
    system = reader.system()
    trace.meta = {k[5:]: v for k, v in system.items() if k.startswith("nsys:")}
    trace.system = {k: v for k, v in system.items() if not k.startswith("nsys:")}
    trace.devices = reader.devices()
    trace.processes, trace.threads = reader.processes_threads()
    domains = reader.domains()  # (domain_id, name, family, has_markers, num_ranges) of the op-model domains
    mode = profile.get("mode") or "nvtx"
    family = FAMILY_OF_MODE.get(mode)
    offsets, domain_ids, ops = {}, {}, {}
    for did, name, _fam, _has_markers, _num_ranges in domains:
        domain_ids[name] = int(did)
        ops[name], offsets[name] = reader.ops(int(did), name)
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="dlprof-load") as pool:
        # the ranges with their classification and the op instances each on a connection of their own, while
        # this thread reads the rest (SQLite and Arrow work without the GIL)
        classified = pool.submit(_classified_ranges, reader.alone(), family)
        instances = {
            name: pool.submit(_instances, reader.alone(), domain_ids[name], name, ops[name], offsets[name])
            for name in ops
        }
        trace.api_calls = reader.api_calls()
        trace.gpu = reader.gpu()
        uses_tc, tc_rule = reader.kernel_tc(trace.gpu)
        trace.syncs = reader.syncs()
        trace.io_calls = reader.io_calls()
        trace.memory = reader.memory()
        gpu_api, thread_dev, process_dev = launch_links(trace)
        models = {}
        for did, name, fam, has_markers, num_ranges in domains:
            inst = instances[name].result()
            owners = reader.owners(int(did))
            models[name] = DomainModel(
                domain=name,
                family=fam or None,
                has_markers=bool(has_markers),
                instances=inst,
                ops=ops[name],
                api_instance=api_owners(trace, gpu_api, inst, owners),
                gpu_instance=owners,
                n_ranges=int(num_ranges or 0),
            )
        trace.ranges, range_info = classified.result()
    trace.has_cuda_tables = len(trace.api_calls) > 0 or len(trace.gpu) > 0
    trace.has_nvtx = len(trace.ranges) > 0
    corr = Correlation(
        gpu_api=gpu_api,
        uses_tc=uses_tc,
        tc_rule=tc_rule,
        range_info=range_info,
        mode=mode,
        family=family,
        thread_device=thread_dev,
        process_device=process_dev,
        config=reader.config(),
        range_labels=range_label_counts(trace.ranges, range_info),
    )
    corr.domains.update(models)
    return trace, corr, profile, domain_ids, offsets


def _classified_ranges(own, family: str | None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(the ranges, their classification) read by a reader of its own (`alone`), whose connection it closes."""
    try:
        ranges = own.ranges()
    finally:
        own.src.close()
    info = classify_ranges(ranges["text"], ranges["domain"], {family} if family else set())
    # the op model is stored: only the stages after correlation and the iterations read the classification
    # (at 10^7 Kineto events its other columns are 0.2 GB)
    return ranges, info[[c for c in RANGE_INFO_FOR_REANALYSIS if c in info]]


def _instances(own, did: int, name: str, ops: pd.DataFrame, op_map) -> pd.DataFrame:
    """A domain's op instances read by a reader of its own (`alone`), whose connection it closes."""
    try:
        return own.instances(did, name, ops, op_map)
    finally:
        own.src.close()


def _finish_instances(inst: pd.DataFrame, ops: pd.DataFrame, name: str, details: dict) -> pd.DataFrame:
    """The engine's instance columns from the stored ones (source ids split by kind, CPU time, GPU idle,
    details, op names). `details`: instance_id and DETAIL_COLUMNS as numpy arrays, the texts objects shared
    per distinct value (in a DataFrame they would become pandas strings, and then a string object a row)."""
    kind = inst["kind"].to_numpy()
    inst["range_id"] = np.where(np.isin(kind, K.INSTANCE_KINDS_FROM_RANGES), inst["source_id"], -1)
    inst["api_id"] = np.where(kind == K.UNASSOCIATED_API, inst["source_id"], -1)
    inst["activity_id"] = np.where(kind == K.UNASSOCIATED_GPU, inst["source_id"], -1)
    inst["cpu_time"] = np.where(kind == K.UNASSOCIATED_GPU, 0, inst["end"] - inst["start"])
    inst["gpu_idle"] = np.where(inst["n_gpu"] > 0, inst["gpu_end"] - inst["gpu_start"] - inst["gpu_time"], 0)
    if "call_id" not in inst:  # schema 2.0 kept no calls: every instance one
        inst["call_id"] = inst["instance_id"].to_numpy(np.int64)
    call_metrics(inst)
    for c in DETAIL_COLUMNS:
        column = np.full(len(inst), None, dtype=object)
        column[details["instance_id"]] = details[c]
        inst[c] = pd.Series(column, dtype=object, copy=False)
    inst["domain"] = name
    # each op's value object shared by its instances (a text per row would cost a string object each); an
    # op_index without an op gets NaN, as a lookup by index would
    op_index = ops["op_index"].to_numpy(np.int64)
    rows = inst["op_index"].to_numpy(np.int64)
    slots = int(max(op_index.max(initial=-1), rows.max(initial=-1))) + 2  # the last slot: no op
    rows = np.where((rows >= 0) & np.isin(rows, op_index), rows, slots - 1)
    for c in ("name", "direction", "op_type", "label"):
        per_op = np.full(slots, np.nan, dtype=object)
        per_op[op_index] = ops[c].to_numpy(dtype=object)
        inst[c] = pd.Series(per_op[rows], dtype=object, copy=False)
    return inst


# ---------------------------------------------------------------------------- schema 3.0


def _key_range(scope: int) -> tuple[int, int]:
    """First and last database-wide key of a rank or domain."""
    return K.db_id(scope, 0), K.db_id(scope, K.ID_MASK)


class _Reader:
    """What both schemas' readers share."""

    src: SqliteSource
    path: Path

    def alone(self):
        """A copy of this reader on a connection of its own (for another thread), with the names it has read."""
        other = copy.copy(self)
        other.src = SqliteSource(self.path, immutable=self.src.immutable)
        return other


class _V3(_Reader):
    def __init__(self, src: SqliteSource, path: Path, rank: int):
        self.src, self.path, self.rank = src, path, int(rank)
        self.keys = _key_range(self.rank)
        self._strings = None
        self._threads = None
        self._processes = None

    # names ---------------------------------------------------------------
    @property
    def strings(self) -> np.ndarray:
        """Every string as an object array indexed by id (ids are 0, 1, 2, ...)."""
        if self._strings is None:
            ids = self.src.int_columns(f"SELECT id FROM {K.STRINGS} ORDER BY id", ["id"])["id"]
            values = self.src.text_column(f"SELECT value FROM {K.STRINGS} ORDER BY id")
            table = np.full(int(ids.max()) + 1 if ids.size else 0, None, dtype=object)
            table[ids] = values
            self._strings = table
        return self._strings

    @property
    def arrow_strings(self) -> pa.Array:
        """Every string as an Arrow array indexed by id."""
        return pa.array(self.strings, type=pa.string())

    def names(self, ids: np.ndarray) -> np.ndarray:
        """Strings of ids (-1 -> None) as an object array."""
        ids = np.asarray(ids, dtype=np.int64)
        out = np.full(ids.size, None, dtype=object)
        has = ids >= 0
        out[has] = self.strings[ids[has]]
        return out

    def categorical(self, ids: np.ndarray) -> pd.Categorical:
        """Strings of ids as a categorical (categories: the distinct names used; -1 -> missing)."""
        ids = np.asarray(ids, dtype=np.int64)
        used, inverse = np.unique(ids, return_inverse=True)
        present = used >= 0
        codes, categories = pd.factorize(pd.Series(self.names(used[present]), dtype=object))
        lut = np.full(used.size, -1, dtype=np.int64)
        lut[present] = codes
        return pd.Categorical.from_codes(
            lut[inverse] if ids.size else np.zeros(0, dtype=np.int64), categories=pd.Index(categories, dtype=object)
        )

    def _ints(self, sql: str, names: list[str], params=()) -> dict:
        return _int_columns(self.src, sql, names, params)

    # small tables ----------------------------------------------------------
    def profile(self) -> dict:
        """The file's profile_info; in a multi-rank database, overlaid with the rank's own."""
        info = dict(self.src.fetchall("SELECT name, value FROM profile_info"))
        if K.RANK_PROFILE_INFO in self.src.tables:
            info.update(
                self.src.fetchall(f"SELECT name, value FROM {K.RANK_PROFILE_INFO} WHERE rank = ?", (self.rank,))
            )
        return info

    def system(self) -> dict:
        return dict(self.src.fetchall(f"SELECT name, value FROM {K.RAW_SYSTEM_CONFIG} WHERE rank = ?", (self.rank,)))

    def config(self) -> dict:
        return {
            k: json.loads(v)
            for k, v in self.src.fetchall(f"SELECT name, value FROM {K.RAW_MODEL_CONFIG} WHERE rank = ?", (self.rank,))
        }

    def devices(self) -> pd.DataFrame:
        devices = self.src.frame(
            f"SELECT {', '.join(DEVICE_COLUMNS)} FROM {K.RAW_GPU_INFOS} WHERE rank = ? ORDER BY device_id",
            DEVICE_COLUMNS,
            (self.rank,),
        )
        return _typed_devices(devices)

    def _thread_table(self):
        if self._threads is None:
            t = self._ints(
                f"SELECT thread_id, global_tid, pid, tid, coalesce(name_id, -1) FROM {K.RAW_THREADS} "
                "WHERE rank = ? ORDER BY thread_id",
                ["thread_id", "global_tid", "pid", "tid", "name_id"],
                (self.rank,),
            )
            p = self._ints(
                f"SELECT process_id, pid, coalesce(name_id, -1) FROM {K.RAW_PROCESSES} WHERE rank = ? "
                "ORDER BY process_id",
                ["process_id", "pid", "name_id"],
                (self.rank,),
            )
            self._threads, self._processes = t, p
        return self._threads, self._processes

    def _lookup(self, table: dict, key: str, ids: np.ndarray, field: str, missing: int = -1) -> np.ndarray:
        """table[field] of the rows whose `key` equals each id (`missing` where the id is -1)."""
        ids = np.asarray(ids, dtype=np.int64)
        keys = table[key]
        if keys.size == 0:
            return np.full(ids.size, missing, dtype=np.int64)
        pos = np.clip(np.searchsorted(keys, ids), 0, keys.size - 1)
        return np.where((ids >= 0) & (keys[pos] == ids), table[field][pos], missing)

    def thread_field(self, thread_ids: np.ndarray, field: str) -> np.ndarray:
        return self._lookup(self._thread_table()[0], "thread_id", thread_ids, field)

    def process_pid(self, process_ids: np.ndarray) -> np.ndarray:
        return self._lookup(self._thread_table()[1], "process_id", process_ids, "pid")

    def processes_threads(self) -> tuple[pd.DataFrame, pd.DataFrame]:
        """The named processes and threads (as the export's PROCESSES and ThreadNames list them)."""
        t, p = self._thread_table()
        named = p["name_id"] >= 0
        processes = pd.DataFrame({"pid": p["pid"][named], "name": self.names(p["name_id"][named])})
        named = t["name_id"] >= 0
        threads = pd.DataFrame(
            {
                "global_tid": t["global_tid"][named],
                "pid": t["pid"][named],
                "tid": t["tid"][named],
                "name": self.names(t["name_id"][named]),
            }
        )
        return processes, threads

    def domains(self) -> list[tuple]:
        self._domain_names = dict(
            self.src.fetchall(f"SELECT domain_id, name FROM {K.RAW_DOMAINS} WHERE rank = ?", (self.rank,))
        )
        return self.src.fetchall(
            f"SELECT domain_id, name, family, has_markers, num_ranges FROM {K.RAW_DOMAINS} "
            "WHERE rank = ? AND has_model ORDER BY domain_id",
            (self.rank,),
        )

    # event tables -----------------------------------------------------------
    def ranges(self) -> pd.DataFrame:
        cols, texts = self._stored_ranges()
        n = cols["range_id"].size
        names = self._domain_names
        ids = np.array(sorted(names), dtype=np.int64)
        labels = np.array([names[i] for i in ids.tolist()], dtype=object)
        pos = np.searchsorted(ids, cols["domain_id"]) if ids.size else np.zeros(n, dtype=np.int64)
        return pd.DataFrame(
            {
                "range_id": cols["range_id"],
                "domain": pd.Series(labels[pos] if n else np.zeros(0, object), dtype=object),
                "text": pd.Series(texts, dtype="str"),
                "start": cols["start"],
                "end": cols["start"] + cols["duration"],
                "global_tid": self.thread_field(cols["thread_id"], "global_tid"),
                "pid": self.thread_field(cols["thread_id"], "pid"),
                "event_type": cols["event_type"].astype(np.int8),
                "unclosed": cols["unclosed"].astype(bool),
            }
        )

    def _stored_ranges(self) -> tuple[dict, pa.Array]:
        """(integer columns, texts) of the rank's ranges: blocks since schema 3.3, rows before (a text's PyTorch
        call fields stored apart from its shared part, a string id)."""
        if K.RAW_RANGE_BLOCKS in self.src.tables:
            stored = range_blocks.read_ranges(self.src, self.rank)
            cols = {name: stored[name].to_numpy() for name in range_blocks.BLOCK_SCHEMA.names if name != "text"}
            return cols, stored["text"].combine_chunks()
        cols = self._ints(
            "SELECT range_id, domain_id, thread_id, coalesce(event_type, -1), start, duration, text_id, "
            f"coalesce(seq, 0), seq IS NULL, coalesce(op_id, 0), op_id IS NULL, unclosed FROM {K.RAW_RANGES} "
            "WHERE rank = ? ORDER BY rowid",
            [
                "range_id",
                "domain_id",
                "thread_id",
                "event_type",
                "start",
                "duration",
                "text_id",
                "seq",
                "no_seq",
                "op_id",
                "no_op_id",
                "unclosed",
            ],
            (self.rank,),
        )
        if cols["range_id"].size == 0:
            return cols, pa.array([], pa.string())
        shared = self.arrow_strings.take(pa.array(cols["text_id"]))
        seq = pa.array(cols["seq"], mask=cols["no_seq"].astype(bool))
        op_id = pa.array(cols["op_id"], mask=cols["no_op_id"].astype(bool))
        return cols, with_call_fields(shared, seq, op_id)  # (3.0-3.2 kept the call fields apart)

    def api_calls(self) -> pd.DataFrame:
        cols = self._ints(
            "SELECT api_id, coalesce(name_id, -1), thread_id, start, duration, correlation_id, event_class, "
            f"return_value FROM {K.RAW_API_CALLS} WHERE api_id BETWEEN ? AND ? ORDER BY api_id",
            ["api_id", "name_id", "thread_id", "start", "duration", "correlation_id", "event_class", "return_value"],
            self.keys,
        )
        return pd.DataFrame(
            {
                "api_id": cols["api_id"] - self.keys[0],
                "name": self.categorical(cols["name_id"]),
                "start": cols["start"],
                "end": cols["start"] + cols["duration"],
                "global_tid": self.thread_field(cols["thread_id"], "global_tid"),
                "pid": self.thread_field(cols["thread_id"], "pid"),
                "correlation_id": cols["correlation_id"],
                "event_class": cols["event_class"],
                "return_value": cols["return_value"],
            }
        )

    def gpu(self) -> pd.DataFrame:
        plain = [c for c in GPU_COLUMNS if c not in ("activity_id", "kind", "name", "long_name", "start", "end", "pid")]
        cols = self._ints(
            "SELECT activity_id, kind, name_id, coalesce(long_name_id, name_id), start, duration, process_id, "
            f"{', '.join(plain)} FROM {K.RAW_GPU_ACTIVITIES} WHERE activity_id BETWEEN ? AND ? ORDER BY activity_id",
            ["activity_id", "kind", "name_id", "long_name_id", "start", "duration", "process_id"] + plain,
            self.keys,
        )
        name_ids = _unpinned(cols, ["name_id", "long_name_id"])
        self._gpu_name_ids = (name_ids["name_id"], name_ids["long_name_id"])
        frame = {
            "activity_id": cols["activity_id"] - self.keys[0],
            "kind": cols["kind"].astype(np.int8),
            "name": self.categorical(cols["name_id"]),
            "long_name": self.categorical(cols["long_name_id"]),
            "start": cols["start"],
            "end": cols["start"] + cols["duration"],
            "pid": self.process_pid(cols["process_id"]),
        }
        frame.update({c: cols[c] for c in plain})
        return pd.DataFrame({c: frame[c] for c in GPU_COLUMNS})

    def kernel_tc(self, gpu: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        """Tensor Core use and deciding rule per GPU activity, from its (name, long name) pair."""
        n = len(gpu)
        tc = self.src.fetchall(
            f"SELECT name_id, long_name_id, uses_tc, tc_rule FROM {K.RAW_KERNEL_TC} WHERE rank = ?", (self.rank,)
        )
        uses, rules = np.zeros(n, dtype=bool), np.full(n, "", dtype=object)
        if not tc or n == 0:
            return uses, rules
        name_ids, long_ids = self._gpu_name_ids
        width = int(max(long_ids.max(), max(r[1] for r in tc))) + 1
        keys = np.array([r[0] * width + r[1] for r in tc], dtype=np.int64)
        order = np.argsort(keys)
        keys = keys[order]
        pair = name_ids * width + long_ids
        pos = np.clip(np.searchsorted(keys, pair), 0, keys.size - 1)
        hit = keys[pos] == pair
        flags = np.array([bool(r[2]) for r in tc], dtype=bool)[order]
        texts = np.array([r[3] or "" for r in tc], dtype=object)[order]
        uses[hit] = flags[pos[hit]]
        rules[hit] = texts[pos[hit]]
        return uses, rules

    def syncs(self) -> pd.DataFrame:
        cols = self._ints(
            "SELECT start, duration, device_id, stream_id, coalesce(process_id, -1), correlation_id, "
            f"sync_type FROM {K.RAW_SYNCS} WHERE rank = ? ORDER BY rowid",
            ["start", "duration", "device_id", "stream_id", "process_id", "correlation_id", "sync_type"],
            (self.rank,),
        )
        return pd.DataFrame(
            {
                "start": cols["start"],
                "end": cols["start"] + cols["duration"],
                "device_id": cols["device_id"],
                "stream_id": cols["stream_id"],
                "pid": self.process_pid(cols["process_id"]),
                "correlation_id": cols["correlation_id"],
                "sync_type": cols["sync_type"],
            }
        )

    def io_calls(self) -> pd.DataFrame:
        cols = self._ints(
            f"SELECT start, duration, thread_id, coalesce(name_id, -1) FROM {K.RAW_IO_CALLS} "
            "WHERE rank = ? ORDER BY rowid",
            ["start", "duration", "thread_id", "name_id"],
            (self.rank,),
        )
        return pd.DataFrame(
            {
                "start": cols["start"],
                "end": cols["start"] + cols["duration"],
                "global_tid": self.thread_field(cols["thread_id"], "global_tid"),
                "pid": self.thread_field(cols["thread_id"], "pid"),
                "name": pd.Series(self.names(cols["name_id"]), dtype=object),
            }
        )

    def memory(self) -> pd.DataFrame:
        """The memory events with their stored levels (none in a schema 3.0 file)."""
        if K.RAW_MEMORY_EVENTS not in self.src.tables:
            return empty_memory_frame()
        cols = self._ints(
            "SELECT start, call_start, coalesce(thread_id, -1), process_id, device_type, device_id, "
            f"coalesce(address, -1), bytes, allocated, coalesce(reserved, -1) FROM {K.RAW_MEMORY_EVENTS} "
            "WHERE rank = ? ORDER BY rowid",
            ["start", "call_start", "thread_id", "process_id", "device_type", "device_id", "address", "bytes"]
            + ["allocated", "reserved"],
            (self.rank,),
        )
        thread = cols.pop("thread_id")
        cols["global_tid"] = self.thread_field(thread, "global_tid")
        cols["pid"] = self.process_pid(cols.pop("process_id"))
        return make_frame({c: cols[c] for c in MEMORY_COLUMNS})

    # op model -------------------------------------------------------------------
    def ops(self, did: int, name: str):
        """The domain's ops (op_index: the op model's index) and the database op_index of each (an offset when
        they are consecutive)."""
        cols = self._ints(
            "SELECT domain_op_index, op_index, coalesce(name_id, -1), coalesce(op_type_id, -1), "
            "coalesce(label_id, -1), tc_eligible, coalesce(data_type_id, -1), coalesce(stack_trace_id, -1), device_id, "
            f"first_start, num_instances, coalesce(kind, -1) FROM {K.RAW_OPS} WHERE domain_id = ? "
            "ORDER BY domain_op_index",
            [
                "domain_op_index",
                "op_index",
                "name_id",
                "op_type_id",
                "label_id",
                "tc_eligible",
                "data_type_id",
                "stack_trace_id",
                "device_id",
                "first_start",
                "n_instances",
                "kind",
            ],
            (did,),
        )
        texts = self.src.fetchall(
            f"SELECT op_id, direction FROM {K.RAW_OPS} WHERE domain_id = ? ORDER BY domain_op_index", (did,)
        )
        local = cols["domain_op_index"]
        n = local.size
        if not np.array_equal(local, np.arange(n)):
            raise DLProfError(f"{self.path}: the ops of NVTX domain {name} are incomplete")
        ops = pd.DataFrame(
            {
                "op_index": local,
                "op_id": pd.Series([t[0] for t in texts], dtype=object),
                "name": pd.Series(self.names(cols["name_id"]), dtype=object),
                "direction": pd.Series([t[1] or "" for t in texts], dtype=object),
                "op_type": pd.Series(self.names(cols["op_type_id"]), dtype=object),
                "label": pd.Series(self.names(cols["label_id"]), dtype=object),
                "tc_eligible": cols["tc_eligible"].astype(bool),
                "data_type": pd.Series(self.names(cols["data_type_id"]), dtype=object),
                "stack_trace": pd.Series(self.names(cols["stack_trace_id"]), dtype=object),
                "device_id": cols["device_id"],
                "first_start": cols["first_start"],
                "n_instances": cols["n_instances"],
                "kind": cols["kind"],
            }
        )
        ops["domain"] = name
        global_index = cols["op_index"]
        consecutive = n == 0 or bool((np.diff(global_index) == 1).all())
        return ops, (int(global_index[0]) if n else 0) if consecutive else global_index

    def instances(self, did: int, name: str, ops: pd.DataFrame, op_map) -> pd.DataFrame:
        cols = self._ints(
            "SELECT instance_id, op_index, kind, coalesce(source_id, -1), coalesce(thread_id, -1), process_id, "
            "device_id, start, duration, cpu_overhead, gpu_time, coalesce(gpu_offset, 0), coalesce(gpu_span, 0), "
            "n_gpu, n_kernels, coalesce(call_id, instance_id) "
            f"FROM {K.RAW_OP_INSTANCES} WHERE instance_id BETWEEN ? AND ? ORDER BY instance_id",
            [
                "instance_id",
                "op_index",
                "kind",
                "source_id",
                "thread_id",
                "process_id",
                "device_id",
                "start",
                "duration",
                "cpu_overhead",
                "gpu_time",
                "gpu_offset",
                "gpu_span",
                "n_gpu",
                "n_kernels",
                "call_id",
            ],
            _key_range(did),
        )
        base = K.db_id(did, 0)
        if isinstance(op_map, (int, np.integer)):
            local = cols["op_index"] - int(op_map)
        else:  # database op_index -> the op model's index
            order = np.argsort(op_map)
            local = order[np.searchsorted(op_map[order], cols["op_index"])]
        cols.update(_unpinned(cols, _INSTANCE_COLUMNS_KEPT))  # (the others are derived from, or not kept)
        has_gpu = cols["n_gpu"] > 0
        gpu_start = np.where(has_gpu, cols["start"] + cols["gpu_offset"], -1)
        thread = cols["thread_id"]
        inst = make_frame(
            {
                "instance_id": cols["instance_id"] - base,
                "op_index": local,
                "kind": cols["kind"],
                "source_id": cols["source_id"],
                "start": cols["start"],
                "end": cols["start"] + cols["duration"],
                "pid": self.process_pid(cols["process_id"]),
                "global_tid": self.thread_field(thread, "global_tid"),
                "device_id": cols["device_id"],
                "cpu_overhead": cols["cpu_overhead"],
                "gpu_time": cols["gpu_time"],
                "gpu_start": gpu_start,
                "gpu_end": np.where(has_gpu, gpu_start + cols["gpu_span"], -1),
                "n_gpu": cols["n_gpu"],
                "n_kernels": cols["n_kernels"],
                "call_id": cols["call_id"] - base,
            }
        )
        details = self._ints(
            "SELECT instance_id, "
            + ", ".join(f"coalesce({c}_id, -1)" for c in DETAIL_COLUMNS)
            + f" FROM {K.RAW_OP_INSTANCE_DETAILS} WHERE instance_id BETWEEN ? AND ?",
            ["instance_id"] + DETAIL_COLUMNS,
            _key_range(did),
        )
        detail_texts = {c: self.names(details[c]) for c in DETAIL_COLUMNS}
        return _finish_instances(inst, ops, name, {"instance_id": details["instance_id"] - base, **detail_texts})

    def owners(self, did: int) -> np.ndarray:
        """Per GPU activity of the rank: the row of its owner among the domain's instances."""
        keys = self._ints(
            f"SELECT instance_id FROM {K.RAW_ACTIVITY_OWNERS} WHERE owner_id BETWEEN ? AND ? ORDER BY owner_id",
            ["i"],
            _key_range(did),
        )["i"]
        return keys - K.db_id(did, 0)


_INSTANCE_COLUMNS_KEPT = ["kind", "source_id", "start", "device_id", "cpu_overhead", "gpu_time", "n_gpu", "n_kernels"]


def _unpinned(cols: dict, names: list[str]) -> dict:
    """Copies of the columns of a read (`_int_columns`) that outlive it. ADBC hands a query's columns over as
    one Arrow batch, so a view of any of them holds the memory of all: at 10^7 Kineto events two name-id columns
    held the GPU activities' whole read (0.24 GB), and the op instances' read held the 8 columns only derived
    from (durations, threads, GPU offsets, ...)."""
    return {c: np.array(cols[c], copy=True) for c in names}


def _int_columns(src: SqliteSource, sql: str, names: list[str], params=()) -> dict:
    """Integer columns of a query whose parameters are integers: they are written into the SQL, so ADBC reads
    the columns in C (a parameterized query goes through Python rows)."""
    parts = sql.split("?")
    values = [str(int(p)) for p in params] + [""]
    assert len(parts) == len(values), sql
    return src.int_columns("".join(part + value for part, value in zip(parts, values)), names)


def _typed_devices(devices: pd.DataFrame) -> pd.DataFrame:
    for c in ("compute_major", "compute_minor", "sm_count", "total_memory"):
        devices[c] = pd.to_numeric(devices[c], errors="coerce").astype("Int64")
    devices["device_id"] = devices["device_id"].astype(np.int64)
    return devices


# ---------------------------------------------------------------------------- schema 2.0


class _V2(_Reader):
    """The read_only_* tables of schema 2.0 (names as text on every row)."""

    def __init__(self, src: SqliteSource, path: Path):
        self.src, self.path = src, path

    def profile(self) -> dict:
        return dict(self.src.fetchall("SELECT name, value FROM profile_info"))

    def system(self) -> dict:
        return dict(self.src.fetchall("SELECT name, value FROM read_only_system_config"))

    def config(self) -> dict:
        return {k: json.loads(v) for k, v in self.src.fetchall("SELECT name, value FROM read_only_model_config")}

    def devices(self) -> pd.DataFrame:
        return _typed_devices(
            self.src.frame(
                f"SELECT {', '.join(DEVICE_COLUMNS)} FROM read_only_gpu_infos ORDER BY device_id", DEVICE_COLUMNS
            )
        )

    def processes_threads(self):
        return (
            self.src.frame("SELECT pid, name FROM read_only_processes", ["pid", "name"]),
            self.src.frame(
                "SELECT global_tid, pid, tid, name FROM read_only_threads", ["global_tid", "pid", "tid", "name"]
            ),
        )

    def domains(self) -> list[tuple]:
        self._domains = self.src.fetchall(
            "SELECT domain_id, name, family, has_markers, num_ranges FROM read_only_domains ORDER BY domain_id"
        )
        return self._domains

    def ranges(self) -> pd.DataFrame:
        rcols = self.src.int_columns(
            'SELECT range_id, domain_id, start, "end", global_tid, pid, event_type, '
            "unclosed FROM read_only_ranges ORDER BY start, range_id",
            ["range_id", "domain_id", "start", "end", "global_tid", "pid", "event_type", "unclosed"],
        )
        texts = self.src.arrow_text_column("SELECT text FROM read_only_ranges ORDER BY start, range_id")
        id_to_name = {d[0]: d[1] for d in self._domains}
        # 2.0 stored the ranges of domains without an op model (simple mode) with domain_id -1: the last entry
        domain_names = np.array(
            [id_to_name.get(d, "default") for d in range(max(id_to_name, default=-1) + 1)] + ["other"], dtype=object
        )
        return pd.DataFrame(
            {
                "range_id": rcols["range_id"],
                "domain": pd.Series(
                    domain_names[rcols["domain_id"]] if len(texts) else np.zeros(0, dtype=object), dtype=object
                ),
                "text": pd.Series(texts, dtype="str"),
                "start": rcols["start"],
                "end": rcols["end"],
                "global_tid": rcols["global_tid"],
                "pid": rcols["pid"],
                "event_type": rcols["event_type"],
                "unclosed": rcols["unclosed"].astype(bool),
            }
        )

    def api_calls(self) -> pd.DataFrame:
        acols = self.src.int_columns(
            'SELECT start, "end", global_tid, pid, correlation_id, event_class, return_value '
            "FROM read_only_cuda_calls ORDER BY api_id",
            ["start", "end", "global_tid", "pid", "correlation_id", "event_class", "return_value"],
        )
        api_names = self.src.text_column("SELECT name FROM read_only_cuda_calls ORDER BY api_id")
        return pd.DataFrame(
            {"api_id": np.arange(len(api_names), dtype=np.int64), "name": pd.Categorical(api_names), **acols}
        )[["api_id", "name", "start", "end", "global_tid", "pid", "correlation_id", "event_class", "return_value"]]

    def gpu(self) -> pd.DataFrame:
        numeric = [c for c in GPU_COLUMNS if c not in ("name", "long_name")]
        gcols = self.src.int_columns(
            f"SELECT {', '.join(chr(34) + c + chr(34) for c in numeric)} "
            "FROM read_only_gpu_activities ORDER BY activity_id",
            numeric,
        )
        gpu = pd.DataFrame(gcols)
        gpu["kind"] = gpu["kind"].astype(np.int8)
        gpu["name"] = pd.Categorical(
            self.src.text_column("SELECT name FROM read_only_gpu_activities ORDER BY activity_id")
        )
        gpu["long_name"] = pd.Categorical(
            self.src.text_column("SELECT long_name FROM read_only_gpu_activities ORDER BY activity_id")
        )
        return gpu[GPU_COLUMNS]

    def kernel_tc(self, gpu: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
        tc = self.src.frame(
            "SELECT name, long_name, uses_tc, tc_rule FROM read_only_kernel_tc",
            ["name", "long_name", "uses_tc", "tc_rule"],
        )
        keys = pd.MultiIndex.from_arrays([gpu["name"].astype(object), gpu["long_name"].astype(object)])
        tc_index = pd.MultiIndex.from_arrays([tc["name"].astype(object), tc["long_name"].astype(object)])
        pos = tc_index.get_indexer(keys) if len(tc) else np.full(len(gpu), -1)
        uses_tc = np.where(pos >= 0, tc["uses_tc"].to_numpy()[np.maximum(pos, 0)] if len(tc) else 0, 0).astype(bool)
        tc_rule = np.where(pos >= 0, tc["tc_rule"].to_numpy(dtype=object)[np.maximum(pos, 0)] if len(tc) else "", "")
        return uses_tc, tc_rule

    def syncs(self) -> pd.DataFrame:
        return self.src.frame(
            'SELECT start, "end", device_id, stream_id, pid, correlation_id, sync_type FROM read_only_cuda_syncs',
            ["start", "end", "device_id", "stream_id", "pid", "correlation_id", "sync_type"],
        )

    def io_calls(self) -> pd.DataFrame:
        return self.src.frame(
            'SELECT start, "end", global_tid, pid, name FROM read_only_io_calls',
            ["start", "end", "global_tid", "pid", "name"],
        )

    def memory(self) -> pd.DataFrame:
        return empty_memory_frame()  # schema 2.0 kept no memory events

    def ops(self, did: int, name: str):
        ops = self.src.frame(
            "SELECT op_index, op_id, op_name, direction, op_type, label, tc_eligible, data_type, "
            "stack_trace, device_id, first_start, num_instances, kind FROM read_only_ops "
            "WHERE domain_id = ? ORDER BY op_index",
            [
                "op_index",
                "op_id",
                "name",
                "direction",
                "op_type",
                "label",
                "tc_eligible",
                "data_type",
                "stack_trace",
                "device_id",
                "first_start",
                "n_instances",
                "kind",
            ],
            (did,),
        )
        offset = int(ops["op_index"].min()) if len(ops) else 0
        ops["op_index"] = ops["op_index"].astype(np.int64) - offset
        ops["domain"] = name
        ops["tc_eligible"] = ops["tc_eligible"].astype(bool)
        ops["direction"] = ops["direction"].fillna("").astype(object)
        return ops, offset

    def instances(self, did: int, name: str, ops: pd.DataFrame, offset: int) -> pd.DataFrame:
        numeric = [c for c in _STORED_INSTANCE_COLUMNS if c != "domain_id"]
        cols = _int_columns(
            self.src,
            f"SELECT {', '.join(chr(34) + c + chr(34) for c in numeric)} "
            "FROM read_only_op_instances WHERE domain_id = ? ORDER BY instance_id",
            numeric,
            (did,),
        )
        inst = pd.DataFrame(cols)
        inst["op_index"] -= offset
        details = self.src.frame(
            "SELECT instance_id, data_type, input_shapes, output_shapes, parameters, stack_trace "
            "FROM read_only_op_instance_details WHERE domain_id = ?",
            ["instance_id"] + DETAIL_COLUMNS,
            (did,),
        )
        detail_texts = {c: details[c].to_numpy(dtype=object) for c in DETAIL_COLUMNS}
        return _finish_instances(
            inst, ops, name, {"instance_id": details["instance_id"].to_numpy(np.int64), **detail_texts}
        )

    def owners(self, did: int) -> np.ndarray:
        return _int_columns(
            self.src,
            "SELECT instance_id FROM read_only_activity_owners WHERE domain_id = ? ORDER BY activity_id",
            ["i"],
            (did,),
        )["i"]
