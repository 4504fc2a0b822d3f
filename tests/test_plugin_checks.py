"""Shared checks of the DLPROF HTTP API (http_api.md) for the TensorBoard plugin and dlprofviewer tests.

Every check talks HTTP to a running server (`Api`) and compares with the database read directly with
sqlite3 and with the hand-computed training profile of tests/profiles.py. No tests are defined here.
"""

from __future__ import annotations

import csv
import io
import json
import socket
import sqlite3
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path
from xml.etree import ElementTree

import pytest

from dlprof_plugin.security import REQUEST_HEADER
from tests.profiles import run_dlprof
from tests.waiting import wait_until

# ---------------------------------------------------------------------------- the training profile, by hand
WALL_TIME = 290_000  # first recorded event (1_000_000) to the last cudaDeviceSynchronize end (1_290_000)
ITERATIONS = 4  # 3 optimizer steps -> 4 intervals
KEY_NODE = "Optimizer.step#SGD.step"
N_OPS = 8  # to, conv2d, relu, linear, linear(bprop), conv2d(bprop), add_, unassociated sync
TOP_OP = ("CONV2D_1", 30_000)  # 3 x TC_CONV [T+14000, T+24000)
KERNELS_PER_ITERATION = 6  # conv, relu, sgemm, sgemm (backward), wgrad, add (the memcpy is not a kernel)
ITER1 = (1_080_000, 1_180_000)  # iteration 1 = [end of step 0, end of step 1)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    """HTTP client of one server; `prefix` is where the routes live ('/data/plugin/dlprof/')."""

    def __init__(self, base: str, prefix: str = "/data/plugin/dlprof/"):
        self.base, self.prefix = base.rstrip("/"), prefix

    def url(self, route: str, **params) -> str:
        q = urllib.parse.urlencode({k: v for k, v in params.items() if v is not None})
        return f"{self.base}{self.prefix}{route}" + (f"?{q}" if q else "")

    def raw(
        self,
        url: str,
        data: bytes | None = None,
        method: str | None = None,
        timeout: float = 30,
        headers: dict | None = None,
    ):
        req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        if data is not None and not req.has_header("Content-type"):
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as err:
            return err.code, dict(err.headers), err.read()

    def get(self, route: str, expect: int = 200, **params):
        status, headers, body = self.raw(self.url(route, **params))
        assert status == expect, f"{route} {params}: {status} {body[:300]!r}"
        return json.loads(body)

    def post(self, route: str, doc, expect: int | None = None):
        data = doc if isinstance(doc, bytes) else json.dumps(doc).encode()
        status, _, body = self.raw(self.url(route), data=data, method="POST", headers={REQUEST_HEADER: "1"})
        if expect is not None:
            assert status == expect, f"POST {route} {doc!r}: {status} {body[:300]!r}"
        return status, json.loads(body)

    def table(self, name: str, **params) -> tuple[dict, list[dict]]:
        doc = self.get(f"table/{name}", **params)
        keys = [c["key"] for c in doc["columns"]]
        return doc, [dict(zip(keys, r)) for r in doc["rows"]]


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


def db_rows(db: Path, sql: str, params=()) -> list[tuple]:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return con.execute(sql, params).fetchall()
    finally:
        con.close()


# ---------------------------------------------------------------------------- checks


def route_checks(run: str) -> dict:
    """The checks every server of the routes passes on the training profile as run `run`, by name:
    check(api, database)."""
    return {
        "runs": lambda api, db: check_runs(api, {run: db}),
        "metadata_routes": lambda api, db: check_metadata_routes(api, run, db),
        "dashboard": lambda api, db: check_dashboard(api, run, db),
        "tables": lambda api, db: check_tables(api, run, db),
        "exports": lambda api, db: check_exports(api, run),
        "terms": lambda api, db: check_terms(api, run),
        "bad_requests": lambda api, db: check_bad_requests(api, run),
        "static_files": lambda api, db: check_static(api),
    }


def check_runs(api: Api, expected: dict[str, Path]) -> None:
    runs = {r["run"]: r for r in api.get("runs")["runs"]}
    assert set(runs) == set(expected)
    for name, db in expected.items():
        r = runs[name]
        assert r["mode"] == "pytorch" and r["primary_domain"] == "default" and r["profile_name"] == "dlprof"
        assert r["dlprof_version"] and r["nsys_version"] == "2022.4.2.1"
        assert Path(r["database"]).name == db.name and not Path(r["database"]).is_absolute()


def check_metadata_routes(api: Api, run: str, db: Path) -> None:
    aggrs = api.get("aggregations", run=run)
    assert aggrs["aggregations"][0]["aggr_id"] == 1 and aggrs["newest"] == max(
        a["aggr_id"] for a in aggrs["aggregations"]
    )
    first = aggrs["aggregations"][0]
    assert first["key_node"] == KEY_NODE and first["key_found"] is True and first["total_iterations"] == ITERATIONS
    assert aggrs["job"]["status"] in ("idle", "succeeded", "failed")
    domains = api.get("domains", run=run)["domains"]
    assert [d["name"] for d in domains] == [
        r[0] for r in db_rows(db, "SELECT name FROM read_only_domains ORDER BY domain_id")
    ]
    assert domains[0]["is_primary"] is True
    system = api.get("system", run=run)
    assert system["gpus"][0]["name"] == "NVIDIA A100-SXM4-40GB" and system["gpus"][0]["compute_capability"] == "8.0"
    assert system["system"]["CpuDescription"] == "Test CPU @ 2.00GHz"
    assert system["profile"]["mode"] == "pytorch"
    gpus = api.get("gpus", run=run, aggr=1)["gpus"]
    util = db_rows(db, "SELECT gpu_utilization, tc_pct, other_pct FROM device_utilization WHERE aggr_id = 1")[0]
    assert len(gpus) == 1 and gpus[0]["sm_count"] == 108 and gpus[0]["compute_capability"] == "8.0"
    assert (gpus[0]["gpu_utilization"], gpus[0]["tc_pct"], gpus[0]["other_pct"]) == pytest.approx(util)
    it = api.get("iterations", run=run, aggr=1)
    assert len(it["iterations"]) == ITERATIONS and it["key_node"] == KEY_NODE
    assert (it["iter_start"], it["iter_stop"]) == (0, ITERATIONS - 1)
    assert [(r["iteration"], r["start"], r["end"]) for r in it["iterations"]] == [
        tuple(r)
        for r in db_rows(
            db, "SELECT iter_value, start_time, stop_time FROM iteration_summary WHERE aggr_id = 1 ORDER BY iter_value"
        )
    ]
    assert (it["iterations"][1]["start"], it["iterations"][1]["end"]) == ITER1
    assert it["iterations"][1]["kernels"] == KERNELS_PER_ITERATION
    findings = api.get("expert_systems", run=run, aggr=1)["findings"]
    assert sorted(f["exp_sys_id"] for f in findings) == sorted(
        r[0] for r in db_rows(db, "SELECT exp_sys_id FROM expert_systems_feedback WHERE aggr_id = 1")
    )
    # the training profile's slow first iteration, low GPU use, pageable copies and host syncs
    assert {
        "bad_iteration_range_detector",
        "underutilized_gpu_detector",
        "pageable_memcpy_detector",
        "sync_api_detector",
    } <= {f["exp_sys_id"] for f in findings}
    assert api.get("reaggregate_status", run=run)["job"]["status"] in ("idle", "succeeded", "failed")


def check_dashboard(api: Api, run: str, db: Path) -> None:
    d = api.get("dashboard", run=run, aggr=1)
    s = d["summary"]
    assert s["wall_time"] == WALL_TIME and s["iter_total"] == ITERATIONS and s["iter_aggregated"] == ITERATIONS
    assert (s["iter_start"], s["iter_stop"], s["key_node"], s["key_found"]) == (0, 3, KEY_NODE, True)
    assert s["avg_iteration_time"] == pytest.approx(WALL_TIME / ITERATIONS)
    ms = db_rows(
        db,
        "SELECT wall_time, tc_utilization, gpu_utilization, tc_duration_pct, other_duration_pct, "
        "iteration_time_std_dev FROM model_summary WHERE aggr_id = 1",
    )[0]
    assert (
        s["wall_time"],
        s["tc_utilization"],
        s["gpu_utilization"],
        s["tc_duration_pct"],
        s["other_duration_pct"],
        s["iteration_time_std_dev"],
    ) == pytest.approx(ms)
    pct = sum(
        s[k]
        for k in (
            "tc_duration_pct",
            "non_tc_duration_pct",
            "memory_duration_pct",
            "dataloader_duration_pct",
            "io_duration_pct",
            "cpu_duration_pct",
            "other_duration_pct",
        )
    )
    assert pct == pytest.approx(100.0)
    assert s["tc_utilization"] == pytest.approx(50.0)  # TC kernels 48 us of 96 us in eligible ops
    assert d["op_summary"]["all"] == {"gpu_time": 111_000, "cpu_time": 162_000, "count": N_OPS}
    assert d["op_summary"]["using_tc"]["count"] == 2 and d["op_summary"]["eligible_not_using"]["count"] == 2
    assert d["kernel_summary"]["all"]["gpu_time"] == 111_000 and d["kernel_summary"]["tc"]["gpu_time"] == 48_000
    assert d["tensor_core"] == {
        "tc_utilization": pytest.approx(50.0),
        "eligible_ops": 4,
        "using_tc_ops": 2,
        "eligible_not_using_ops": 2,
    }
    assert len(d["iterations"]) == ITERATIONS
    top = d["top_ops"]
    assert (top[0]["op_id"], top[0]["gpu_total"]) == TOP_OP and top[0]["using_tc"] is True
    assert [t["gpu_total"] for t in top] == [
        r[0] for r in db_rows(db, "SELECT gpu_total FROM op_nodes WHERE aggr_id = 1 ORDER BY gpu_total DESC LIMIT 10")
    ]
    assert d["system"]["gpu_count"] == 1 and d["system"]["gpu_names"] == "NVIDIA A100-SXM4-40GB"
    assert d["system"]["cuda_version"] == "12.2" and d["system"]["driver_version"] == "535.104.05"
    assert d["mode"] == "pytorch" and d["domain"] == "default" and d["aggregation"]["aggr_id"] == 1
    assert isinstance(d["findings"], list) and d["guidance"] and all("title" in g for g in d["guidance"])
    # the default aggregation is the newest one
    newest = db_rows(db, "SELECT max(aggr_id) FROM aggregations")[0][0]
    assert api.get("dashboard", run=run)["aggregation"]["aggr_id"] == newest


def check_tables(api: Api, run: str, db: Path) -> None:
    # ops: every row equals the database's view
    doc, rows = api.table("ops", run=run, aggr=1, limit=1000)
    assert doc["total"] == doc["filtered"] == N_OPS and doc["sort"] == "gpu_total" and doc["order"] == "desc"
    assert doc["columns"][0]["key"] == "op_index" and doc["columns"][0]["hidden"] is True
    keys = {c["key"] for c in doc["columns"]}
    assert {"direction", "stack_trace", "overhead_total", "idle_max", "tc_eligible"} <= keys  # PyTorch run
    expect = {
        r[0]: r[1:]
        for r in db_rows(
            db,
            "SELECT op_id, num_calls, gpu_total, cpu_total, overhead_total, "
            "using_tc FROM view_op_nodes WHERE aggr_id = 1",
        )
    }
    assert {
        r["op_id"]: (r["num_calls"], r["gpu_total"], r["cpu_total"], r["overhead_total"], int(r["using_tc"]))
        for r in rows
    } == expect
    assert [r["gpu_total"] for r in rows] == sorted((r["gpu_total"] for r in rows), reverse=True)
    assert (rows[0]["op_id"], rows[0]["gpu_total"]) == TOP_OP
    # sort, pages
    _, by_id = api.table("ops", run=run, aggr=1, sort="op_id", order="asc", limit=1000)
    ids = [r["op_id"] for r in by_id]
    assert ids == sorted(ids)
    _, page = api.table("ops", run=run, aggr=1, sort="op_id", order="asc", offset=3, limit=3)
    assert [r["op_id"] for r in page] == ids[3:6]
    # global and per-column search
    doc, hits = api.table("ops", run=run, aggr=1, q="CONV")
    assert doc["filtered"] == 2 and {r["op_id"] for r in hits} == {"CONV2D_1", "CONV2D_2"}
    doc, hits = api.table("ops", run=run, aggr=1, **{"col.gpu_total": ">=24000", "col.direction": "bprop"})
    assert [r["op_id"] for r in hits] == ["LINEAR_2"]
    doc, hits = api.table("ops", run=run, aggr=1, **{"col.gpu_total": "6000..18000", "col.using_tc": "no"})
    assert {r["op_id"] for r in hits} == {"RELU_1", "ADD__1"}
    # durations take the units the cells show (the training profile's ops: 30, 24, 24, 18, 6, 6, 3, 0 us of GPU)
    for text, expected in (
        (">20us", {"CONV2D_1", "LINEAR_1", "LINEAR_2"}),
        (">0.02ms", {"CONV2D_1", "LINEAR_1", "LINEAR_2"}),
        ("6us..18us", {"CONV2D_2", "RELU_1", "ADD__1"}),
        ("6 µs..0.018 ms", {"CONV2D_2", "RELU_1", "ADD__1"}),
        ("<1.5 s", {r["op_id"] for r in rows}),
        ("=30000", {"CONV2D_1"}),
        ("30000ns", {"CONV2D_1"}),
    ):
        _, hits = api.table("ops", run=run, aggr=1, **{"col.gpu_total": text})
        assert {r["op_id"] for r in hits} == expected, text
    _, hits = api.table("tensor_core", run=run, aggr=1, **{"col.tc_utilization": ">20%"})
    assert {r["op_id"] for r in hits} == {"CONV2D_1", "CONV2D_2"}
    _, hits = api.table("tensor_core", run=run, aggr=1, **{"col.tc_utilization": "<20"})
    assert {r["op_id"] for r in hits} == {"LINEAR_1", "LINEAR_2"}
    doc, hits = api.table("ops", run=run, aggr=1, **{"col.op_name": "%"})  # LIKE wildcards are literal
    assert doc["filtered"] == 0
    # kernels (all, and of one op)
    doc, rows = api.table("kernels", run=run, aggr=1)
    assert doc["total"] == db_rows(db, "SELECT count(*) FROM kernel_summaries WHERE aggr_id = 1")[0][0] == 6
    conv = next(r for r in rows if r["op_id"] == "CONV2D_1")
    doc, rows = api.table("kernels", run=run, aggr=1, op_index=conv["op_index"])
    assert doc["total"] == 1 and rows[0]["uses_tc"] is True and rows[0]["gpu_total"] == 30_000
    assert rows[0]["api_total"] == 3_000 and rows[0]["num_calls"] == 3
    # op types, tensor core, group ops, iterations, expert systems
    doc, rows = api.table("op_types", run=run, aggr=1)
    assert {r["op_type"]: (r["num_ops"], r["num_calls"], r["gpu_total"]) for r in rows} == {
        r[0]: r[1:]
        for r in db_rows(db, "SELECT op_type, num_ops, num_calls, gpu_total FROM op_type_metrics WHERE aggr_id = 1")
    }
    doc, rows = api.table("tensor_core", run=run, aggr=1)
    assert doc["total"] == 4 and rows[0]["total_gpu_time"] == 30_000 and rows[0]["tc_utilization"] == 100.0
    assert rows[0]["tc_kernel_names"].startswith("volta_fp16_s884cudnn") and rows[0]["uses_tc"] is True
    linear = next(r for r in rows if r["op_id"] == "LINEAR_1")
    assert linear["uses_tc"] is False and linear["non_tc_kernel_names"] == "volta_sgemm_32x32_sliced1x4_tn"
    doc, rows = api.table("group_ops", run=run, aggr=1, parent="")
    assert {r["name"] for r in rows} == {"/", "_CompleteModel_"}
    root = next(r for r in rows if r["name"] == "/")
    assert root["has_children"] is True
    _, kids = api.table("group_ops", run=run, aggr=1, parent="/")
    assert [r["name"] for r in kids] == ["/Optimizer.step#SGD.step/"] and kids[0]["num_calls"] == 3
    complete = next(r for r in rows if r["name"] == "_CompleteModel_")
    assert complete["num_calls"] == 24 and complete["cpu_total"] == 162_000
    doc, rows = api.table("iterations", run=run, aggr=1)
    assert [r["iteration"] for r in rows] == [0, 1, 2, 3] and rows[1]["duration"] == 100_000
    assert all(r["aggregated"] is True for r in rows)
    doc, rows = api.table("expert_systems", run=run, aggr=1)
    assert doc["total"] == db_rows(db, "SELECT count(*) FROM expert_systems_feedback WHERE aggr_id = 1")[0][0] > 0
    # one iteration's kernels, ops, and one op's kernels
    doc, rows = api.table("iteration_kernels", run=run, aggr=1, iteration=1)
    assert doc["total"] == KERNELS_PER_ITERATION and doc["sort"] == "gpu_start"
    starts = [r["gpu_start"] for r in rows]
    assert starts == sorted(starts) and all(ITER1[0] <= r["api_start"] < ITER1[1] for r in rows)
    first = rows[0]
    assert (
        first["op_id"],
        first["gpu_start"],
        first["gpu_duration"],
        first["api_start"],
        first["api_time"],
        first["uses_tc"],
        first["iteration"],
    ) == ("CONV2D_1", 1_114_000, 10_000, 1_112_000, 1_000, True, 1)
    expect = db_rows(
        db,
        "SELECT g.start FROM read_only_activity_owners w JOIN read_only_gpu_activities g "
        "ON g.activity_id = w.activity_id WHERE w.launch_time >= ? AND w.launch_time < ? "
        "AND g.kind = 0 ORDER BY g.start",
        ITER1,
    )
    assert starts == [r[0] for r in expect]
    doc, _ = api.table("iteration_kernels", run=run, aggr=1, iteration=3)
    assert doc["total"] == 0
    doc, rows = api.table("iteration_ops", run=run, aggr=1, iteration=1)
    assert doc["total"] == N_OPS and rows[0]["op_id"] == "CONV2D_1" and rows[0]["gpu_time"] == 10_000
    assert all(r["calls"] == 1 for r in rows)
    doc, rows = api.table("iteration_op_kernels", run=run, aggr=1, iteration=1, op_index=conv["op_index"])
    assert (
        doc["total"] == 1
        and rows[0]["kernel_name"].startswith("volta_fp16_s884cudnn")
        and rows[0]["gpu_start"] == 1_114_000
    )
    doc, rows = api.table("key_nodes", run=run, q="Optimizer", limit=100)
    assert any(r["kind"] == "op" and r["name"] == "/Optimizer.step#SGD.step/aten::add_" for r in rows)
    # the default key node, a scope range, listed by its label (its text without ", op_id = N")
    assert {
        "kind": "nvtx_range",
        "name": KEY_NODE,
        "op_id": None,
        "label": None,
        "op_type": None,
        "instances": 3,
    } in rows
    doc, rows = api.table("key_nodes", run=run, limit=1000)
    assert doc["total"] >= N_OPS and sum(r["kind"] == "op" for r in rows) == N_OPS
    # one op
    op = api.get("op", run=run, aggr=1, op_index=conv["op_index"])
    assert (op["op_id"], op["num_calls"], op["gpu_total"], op["cpu_avg"], op["direction"]) == (
        "CONV2D_1",
        3,
        30_000,
        10_000.0,
        "fprop",
    )
    assert len(op["kernels"]) == 1 and op["kernels"][0]["gpu_total"] == 30_000 and "stack_trace" in op


def check_exports(api: Api, run: str) -> None:
    doc, rows = api.table("ops", run=run, aggr=1, limit=1000)
    visible = [c for c in doc["columns"] if not c.get("hidden")]
    status, headers, body = api.raw(api.url("table/ops", run=run, aggr=1, format="csv"))
    assert status == 200 and headers["Content-Type"].startswith("text/csv")
    assert "attachment" in headers["Content-Disposition"] and ".csv" in headers["Content-Disposition"]
    table = list(csv.reader(io.StringIO(body.decode("utf-8"))))
    assert table[0] == [c["label"] for c in visible] and len(table) == 1 + len(rows)
    by_id = {r[table[0].index("Op ID")]: r for r in table[1:]}
    assert by_id["CONV2D_1"][table[0].index("Total GPU Time (ns)")] == "30000"
    assert by_id["CONV2D_1"][table[0].index("Using TC")] == "yes"
    # filtered export: only the filtered rows
    status, _, body = api.raw(api.url("table/ops", run=run, aggr=1, format="csv", q="linear"))
    assert len(list(csv.reader(io.StringIO(body.decode())))) == 1 + 2
    status, headers, body = api.raw(api.url("table/ops", run=run, aggr=1, format="xlsx"))
    assert status == 200 and headers["Content-Type"].startswith("application/vnd.openxmlformats")
    with zipfile.ZipFile(io.BytesIO(body)) as zf:
        assert {"[Content_Types].xml", "xl/workbook.xml", "xl/worksheets/sheet1.xml"} <= set(zf.namelist())
        sheet = ElementTree.fromstring(zf.read("xl/worksheets/sheet1.xml"))
    ns = {"m": "http://schemas.openxmlformats.org/spreadsheetml/2006/main"}
    xrows = sheet.findall(".//m:sheetData/m:row", ns)
    assert len(xrows) == 1 + len(rows)
    header = ["".join(c.itertext()) for c in xrows[0].findall("m:c", ns)]
    assert header == [c["label"] for c in visible]
    gpu_col = header.index("Total GPU Time (ns)")
    values = sorted(float(r.findall("m:c", ns)[gpu_col].find("m:v", ns).text) for r in xrows[1:])
    assert values == sorted(float(r["gpu_total"]) for r in rows)
    status, headers, body = api.raw(api.url("table/kernels", run=run, aggr=1, format="json_all"))
    full = json.loads(body)
    assert status == 200 and "attachment" in headers["Content-Disposition"]
    assert full["filtered"] == len(full["rows"]) == 6 and full["table"] == "kernels"


BAD_REQUESTS = [
    # (route, params, status)
    ("dashboard", {}, 400),  # run missing
    ("dashboard", {"run": "no_such_run"}, 404),
    ("dashboard", {"run": "../training"}, 400),
    ("dashboard", {"run": "/etc/passwd"}, 400),
    ("dashboard", {"aggr": "99"}, 404),
    ("dashboard", {"aggr": "1x"}, 400),
    ("dashboard", {"aggr": "-1"}, 400),
    ("dashboard", {"domain": "no_such_domain"}, 404),
    ("dashboard", {"domain": "../../etc"}, 400),
    ("table/no_such_table", {}, 404),
    ("table/ops", {"sort": "gpu_total; DROP TABLE op_nodes"}, 400),
    ("table/ops", {"sort": "no_such_column"}, 400),
    ("table/ops", {"order": "sideways"}, 400),
    ("table/ops", {"limit": "100000"}, 413),
    ("table/ops", {"limit": "-1"}, 400),
    ("table/ops", {"offset": "ten"}, 400),
    ("table/ops", {"col.gpu_total": ">>5"}, 400),
    ("table/ops", {"col.gpu_total": ">1 fortnight"}, 400),  # not a unit
    ("table/ops", {"col.num_calls": ">1ms"}, 400),  # a count takes no duration unit
    ("op", {"op_index": str(2**63)}, 400),  # beyond what SQLite stores
    ("op", {"op_index": "9" * 40}, 400),
    ("table/ops", {"col.no_such_column": "1"}, 400),
    ("table/ops", {"col.using_tc": "perhaps"}, 400),
    ("table/ops", {"format": "pdf"}, 400),
    ("table/iteration_kernels", {}, 400),  # iteration missing
    ("table/iteration_kernels", {"iteration": "99"}, 404),
    ("table/iteration_op_kernels", {"iteration": "1", "op_index": "9999"}, 404),
    ("table/group_ops", {"parent": "/no/such/group/"}, 404),
    ("table/iteration_kernels", {"iteration": "1", "sort": "api_time"}, 400),  # computed per page
    ("op", {}, 400),
    ("op", {"op_index": "9999"}, 404),
    ("no_such_route", {}, 404),
    ("..%2F..%2Fetc%2Fpasswd", {}, 404),
]


def check_terms(api: Api, run: str) -> None:
    """One definition per label: the terms route, and every table column naming one of its entries."""
    terms = api.get("terms")["terms"]
    labels = [t["label"] for t in terms.values()]
    assert len(labels) == len(set(labels)) and all(t["label"] and t["definition"] for t in terms.values())
    tables = ["ops", "kernels", "op_types", "tensor_core", "group_ops", "iterations", "key_nodes", "expert_systems"]
    tables += ["compare_ops", "compare_kernels"]
    shown = {}
    for name in tables + ["iteration_kernels", "iteration_ops"]:
        doc = api.get(f"table/{name}", run=run, limit=0, iteration=1)
        for c in doc["columns"]:
            t = terms[c["term"]]
            assert (c["display"], c["tooltip"]) == (t["label"], t["definition"]), (name, c)
            shown.setdefault(c["display"], set()).add(c["tooltip"])
    assert all(len(d) == 1 for d in shown.values()), {k: v for k, v in shown.items() if len(v) > 1}
    # a kernel's durations and an op's GPU time are different figures: different labels
    ops = {c["key"]: c for c in api.get("table/ops", run=run, limit=0)["columns"]}
    kernels = {c["key"]: c for c in api.get("table/kernels", run=run, limit=0)["columns"]}
    assert ops["gpu_total"]["label"] == kernels["gpu_total"]["label"] == "Total GPU Time (ns)"  # DLProf's headers
    assert (ops["gpu_total"]["display"], kernels["gpu_total"]["display"]) == ("Total GPU Time", "Total Duration")


def check_bad_requests(api: Api, run: str) -> None:
    for route, params, status in BAD_REQUESTS:
        params = dict(params)
        if route not in ("no_such_route",) and "run" not in params and not (route == "dashboard" and not params):
            params["run"] = run
        if route.startswith(".."):
            code, headers, body = api.raw(f"{api.base}{api.prefix}{route}")
        else:
            code, headers, body = api.raw(api.url(route, **params))
        assert code == status, f"{route} {params}: {code} {body[:200]!r}"
        assert headers["Content-Type"].startswith("application/json"), (route, headers["Content-Type"])
        assert isinstance(json.loads(body)["error"], str)
    # integers beyond 2^53 are integers: a valid one is looked up (404: no such op), one beyond int64 is named so
    for value, status, text in (
        (str(2**53 + 1), 404, "unknown op_index 9007199254740993"),
        (str(2**63 - 1), 404, "unknown op_index 9223372036854775807"),
        (str(2**63), 400, "must be between -9223372036854775808 and 9223372036854775807"),
        ("1e3", 400, "must be an integer"),
    ):
        doc = api.get("op", expect=status, run=run, op_index=value)
        assert text in doc["error"], (value, doc)
    doc = api.get("table/ops", expect=400, run=run, **{"col.gpu_total": ">1 fortnight"})
    assert "filter on 'gpu_total' must be" in doc["error"] and "500us" in doc["error"], doc
    for body, status in [
        (b"not json", 400),
        (b"[1, 2]", 400),
        (json.dumps({"run": run, "iter_start": -1}).encode(), 400),
        (json.dumps({"run": run, "iter_start": "1"}).encode(), 400),
        (json.dumps({"run": run, "iter_start": 2, "iter_stop": 1}).encode(), 400),
        (json.dumps({"run": run, "key_node": 5}).encode(), 400),
        (json.dumps({"run": "no_such_run"}).encode(), 404),
        (json.dumps({"run": "../x"}).encode(), 400),
    ]:
        code, doc = api.post("reaggregate", body)
        assert code == status and "error" in doc, (body, code, doc)
    # iteration numbers beyond 2^53 are integers (here refused for their order), beyond int64 named so
    for body, text in (
        ({"run": run, "iter_start": 2**53 + 1, "iter_stop": 1}, "'iter_start' must not be greater than 'iter_stop'"),
        ({"run": run, "iter_start": 2**63}, "'iter_start' must be at most 9223372036854775807"),
    ):
        code, doc = api.post("reaggregate", body)
        assert code == 400 and doc["error"] == text, (body, doc)
    code, _, _ = api.raw(api.url("reaggregate"))  # GET on a POST route
    assert code == 405


def check_static(api: Api) -> None:
    status, headers, body = api.raw(api.url("index.js"))
    assert status == 200 and headers["Content-Type"].startswith("text/javascript")
    assert b"render" in body
    status, _, _ = api.raw(api.url("no_such_file.js"))
    assert status == 404
    status, _, _ = api.raw(api.url("__init__.py"))
    assert status == 404


def check_concurrency(api: Api, run: str) -> None:
    urls = [
        api.url("dashboard", run=run, aggr=1),
        api.url("table/ops", run=run, aggr=1, sort="op_name"),
        api.url("table/iteration_kernels", run=run, aggr=1, iteration=1),
        api.url("table/key_nodes", run=run),
    ]
    results = []

    def worker(u):
        results.append(api.raw(u)[0])

    threads = [threading.Thread(target=worker, args=(urls[i % len(urls)],)) for i in range(24)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert results == [200] * 24


def wait_job(api: Api, run: str, timeout: float = 120) -> dict:
    def done():
        job = api.get("reaggregate_status", run=run)["job"]
        return job if job["status"] != "running" else None

    return wait_until(done, timeout, "the re-aggregation job")


def _summary_csv(path: Path) -> dict:
    values = {}
    for row in csv.reader(path.read_text().splitlines()):
        if len(row) == 2:
            values[row[0]] = row[1]
    return values


def check_reaggregation(api: Api, run: str, db: Path, work: Path) -> None:
    """POST reaggregate for iterations 1..2, poll, compare with `dlprof --database --iter_start 1 --iter_stop 2`;
    then a failing job leaves the aggregations as they were."""
    before = api.get("aggregations", run=run)["aggregations"]
    status, doc = api.post("reaggregate", {"run": run, "key_node": None, "iter_start": 1, "iter_stop": 2}, expect=202)
    assert doc["job"]["status"] == "running" and doc["job"]["iter_start"] == 1
    status, doc = api.post("reaggregate", {"run": run})  # one job per database
    assert status == 409 and "already running" in doc["error"]
    assert api.get("table/ops", run=run, aggr=1)["total"] == N_OPS  # readers keep working meanwhile
    job = wait_job(api, run)
    assert job["status"] == "succeeded", job
    new_id = job["aggr_id"]
    assert new_id == max(a["aggr_id"] for a in before) + 1
    aggrs = api.get("aggregations", run=run)
    assert aggrs["newest"] == new_id and len(aggrs["aggregations"]) == len(before) + 1
    row = aggrs["aggregations"][-1]
    assert (row["iter_start"], row["iter_stop"], row["key_node"]) == (1, 2, KEY_NODE)
    # the same aggregation computed by the CLI, from its reports
    out = work / f"reference_{new_id}"
    run_dlprof(
        f"--database={db}",
        f"--output_path={out}",
        "--iter_start",
        "1",
        "--iter_stop",
        "2",
        "--reports=summary,detail",
        "-v",
        "quiet",
        "--force",
    )
    summary = _summary_csv(out / "dlprof_summary.csv")
    dash = api.get("dashboard", run=run, aggr=new_id)["summary"]
    assert dash["wall_time"] == int(summary["Wall Clock Time (ns)"]) < WALL_TIME
    assert dash["iter_aggregated"] == int(summary["Aggregated Iterations"]) == 2
    assert (dash["iter_start"], dash["iter_stop"]) == (1, 2)
    for key, label in (
        ("gpu_utilization", "GPU Utilization %"),
        ("tc_utilization", "Tensor Core Kernel Utilization %"),
        ("cpu_duration_pct", "CPU Duration %"),
        ("other_duration_pct", "Other Duration %"),
    ):
        assert f"{round(dash[key], 1):.1f}" == summary[label], key
    assert f"{round(dash['avg_iteration_time'], 1):.1f}" == summary["Average Iteration Time (ns)"]
    lines = (out / "dlprof_detailed.csv").read_text().splitlines()[1:]  # line 1 is the title
    detail = list(csv.DictReader(lines))
    _, ops = api.table("ops", run=run, aggr=new_id, limit=1000)
    assert {r["op_id"]: (r["num_calls"], r["gpu_total"], r["cpu_total"]) for r in ops} == {
        r["Op ID"]: (int(r["No. Calls"]), int(r["Total GPU Time (ns)"]), int(r["Total CPU Time (ns)"])) for r in detail
    }
    assert all(r["num_calls"] <= 2 for r in ops)
    # a failing job: reported, nothing added
    status, doc = api.post("reaggregate", {"run": run, "key_node": "no_such_key_node_xyz"}, expect=202)
    job = wait_job(api, run)
    assert job["status"] == "failed" and "no_such_key_node_xyz" in job["message"]
    assert api.get("aggregations", run=run)["newest"] == new_id
    assert api.get("dashboard", run=run, aggr=1)["summary"]["wall_time"] == WALL_TIME
