"""The timeline routes over HTTP against a real TensorBoard process: the events of an iteration of the
hand-computed training profile, its GPU idle gaps and what the CPU did in one, windows of a generated 2-GPU
profile against SQL over its database (every overlapping event, and nothing else), the merging of events
shorter than a pixel (bounded answers, counts and busy times kept), and bad requests."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from dlprof_profiler import contract as K
from tests import test_plugin_checks as checks
from tests.profiles import make_logdir

pytestmark = pytest.mark.slow  # TensorBoard, a 20,000-kernel profile


KERNELS = 20_000  # benchmarks/bench_engine.generate: 20 iterations of 1000 kernels on 2 GPUs


@pytest.fixture(scope="module")
def tb(tmp_path_factory, tensorboard, training_run):
    from benchmarks.bench_engine import generate

    base = tmp_path_factory.mktemp("plugin_timeline")
    bench = generate(base / "bench.sqlite", KERNELS)
    logdir = tensorboard.publish(
        "plugin_timeline", make_logdir(base / "logdir", {"training": training_run, "bench": bench})
    )
    return {"api": checks.Api(tensorboard.url), "db": lambda run: logdir / run / "dlprof_dldb.sqlite"}


def events(doc: dict) -> list[dict]:
    """The answer's boxes as dicts with their row and name."""
    ev = doc["events"]
    out = []
    for i in range(len(ev["start"])):
        row = doc["rows"][ev["row"][i]]
        out.append(
            {
                "row": row,
                "start": ev["start"][i],
                "end": ev["end"][i],
                "kind": ev["kind"][i],
                "key": ev["key"][i],
                "op": ev["op"][i],
                "name": doc["names"][ev["name"][i]],
                "n": ev["n"][i],
                "busy": ev["busy"][i],
            }
        )
    return out


# ---------------------------------------------------------------------------- the training profile by hand

T1 = 1_100_000  # base of the profile's second loop; iteration 1 = [T0 + 80 us, T1 + 80 us) (tests/profiles.py)
SYNC = "unassociated_cudaDeviceSynchronize"
MAIN_OPS = [
    (1_085_000, 1_090_000, SYNC),
    (T1 + 6000, T1 + 9000, "/aten::to"),
    (T1 + 10000, T1 + 20000, "/aten::conv2d"),
    (T1 + 21000, T1 + 25000, "/aten::relu"),
    (T1 + 26000, T1 + 36000, "/aten::linear"),
    (T1 + 71000, T1 + 79000, "/Optimizer.step#SGD.step/aten::add_"),
]
GRAD_OPS = [(T1 + 50000, T1 + 56000, "/aten::linear"), (T1 + 57000, T1 + 65000, "/aten::conv2d")]
MAIN_API = [
    (1_085_000, 1_090_000, "cudaDeviceSynchronize"),
    (T1 + 6500, T1 + 7500, "cudaMemcpyAsync"),
    (T1 + 12000, T1 + 13000, "cudaLaunchKernel"),
    (T1 + 22000, T1 + 23000, "cudaLaunchKernel"),
    (T1 + 29000, T1 + 30000, "cudaLaunchKernel"),
    (T1 + 72000, T1 + 73000, "cudaLaunchKernel"),
]
GRAD_API = [(T1 + 51000, T1 + 52000, "cudaLaunchKernel"), (T1 + 58000, T1 + 59000, "cudaLaunchKernel")]
# GPU 0, stream 7: (start, end, name, kind, launching call's start)
GPU = [
    (T1 + 7000, T1 + 8000, "[CUDA memcpy HtoD]", K.KIND_MEMCPY, T1 + 6500),
    (T1 + 14000, T1 + 24000, "volta_fp16_s884cudnn_fp16_128x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1", 0, T1 + 12000),
    (T1 + 25000, T1 + 27000, "vectorized_elementwise_kernel", 0, T1 + 22000),
    (T1 + 37000, T1 + 45000, "volta_sgemm_32x32_sliced1x4_tn", 0, T1 + 29000),
    (T1 + 53000, T1 + 61000, "volta_sgemm_32x32_sliced1x4_tn", 0, T1 + 51000),
    (T1 + 62000, T1 + 68000, "volta_fp16_s884cudnn_fp16_256x64_ldg8_dgrad_f2f_exp_small_nhwc_tn_v1", 0, T1 + 58000),
    (T1 + 74000, T1 + 76000, "multi_tensor_apply_kernel", 0, T1 + 72000),
]
# no kernel on GPU 0 in [1,080,000, 1,180,000) between the kernels above (the memcpy is no kernel)
GAPS = [
    (1_080_000, T1 + 14000),
    (T1 + 24000, T1 + 25000),
    (T1 + 27000, T1 + 37000),
    (T1 + 45000, T1 + 53000),
    (T1 + 61000, T1 + 62000),
    (T1 + 68000, T1 + 74000),
    (T1 + 76000, T1 + 80000),
]


def test_an_iteration_of_the_training_profile(tb):
    doc = tb["api"].get("timeline", run="plugin_timeline/training/dlprof", iteration=1, width=2000)
    assert doc["window"] == [1_080_000, 1_180_000] and doc["iteration"] == {
        "iteration": 1,
        "start": 1_080_000,
        "end": 1_180_000,
    }
    assert [(r["id"], r["kind"]) for r in doc["rows"]] == [
        ("t0.0", "ops"),
        ("t0.api", "api"),
        ("t1.0", "ops"),
        ("t1.api", "api"),
        ("g0.7", "gpu"),
    ]
    assert doc["rows"][0]["label"] == "python (pid 100, tid 100)" and doc["rows"][2]["tid"] == 101
    got = events(doc)
    assert all(e["n"] == 1 and e["busy"] == e["end"] - e["start"] for e in got)  # nothing under a pixel
    by_row = lambda rid: [(e["start"], e["end"], e["name"]) for e in got if e["row"]["id"] == rid]  # noqa: E731
    assert by_row("t0.0") == MAIN_OPS and by_row("t1.0") == GRAD_OPS
    assert by_row("t0.api") == MAIN_API and by_row("t1.api") == GRAD_API
    gpu = [e for e in got if e["row"]["id"] == "g0.7"]
    assert [(e["start"], e["end"], e["name"], e["kind"]) for e in gpu] == [g[:4] for g in GPU]
    # every op box names its op (the details pane opens it)
    ops = {o["op_index"]: o["op_name"] for o in tb["api"].table("ops", run="plugin_timeline/training/dlprof")[1]}
    assert all(ops[e["op"]] == e["name"] for e in got if e["kind"] == 10)
    # launch arrows: each GPU activity's launching call
    launches = doc["launches"]
    starts = dict(zip(launches["key"], launches["api_start"]))
    assert [starts[e["key"]] for e in gpu] == [g[4] for g in GPU]
    rows = {i: r["id"] for i, r in enumerate(doc["rows"])}
    assert {rows[r] for r in launches["api_row"]} == {"t0.api", "t1.api"}
    # GPU idle gaps
    assert list(zip(doc["gaps"]["start"], doc["gaps"]["end"])) == GAPS and set(doc["gaps"]["device_id"]) == {0}
    assert doc["idle"] == {"0": sum(b - a for a, b in GAPS)} == {"0": 64000}
    n = len(MAIN_OPS) + len(GRAD_OPS) + len(MAIN_API) + len(GRAD_API) + len(GPU)
    assert doc["counts"] == {"events": n, "sent": n, "merged": 0} and n == 23


# the op whose call launched each GPU activity of iteration 1 (tests/profiles.training_profile)
LAUNCHING_OPS = [
    "/aten::to",
    "/aten::conv2d",
    "/aten::relu",
    "/aten::linear",
    "/aten::linear",  # the backward SGEMM: the bprop op shares the forward op's name
    "/aten::conv2d",
    "/Optimizer.step#SGD.step/aten::add_",
]


def test_launches_name_their_op_and_api_names_are_as_users_write_them(tb):
    doc = tb["api"].get("timeline", run="plugin_timeline/training/dlprof", iteration=1, width=2000)
    gpu = [e for e in events(doc) if e["row"]["id"] == "g0.7"]
    launches = doc["launches"]
    at = {k: i for i, k in enumerate(launches["key"])}
    assert [doc["names"][launches["op_name"][at[e["key"]]]] for e in gpu] == LAUNCHING_OPS
    ops = {
        o["op_index"]: (o["op_name"], o["direction"])
        for o in tb["api"].table("ops", run="plugin_timeline/training/dlprof")[1]
    }
    directions = [ops[launches["op"][at[e["key"]]]][1] for e in gpu]
    assert directions == ["fprop", "fprop", "fprop", "fprop", "bprop", "bprop", "fprop"]
    # API calls carry no nsys version (the database keeps the recorded cudaLaunchKernel_v7000)
    api_names = {e["name"] for e in events(doc) if e["kind"] == 11}
    assert api_names == {"cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaLaunchKernel"}
    raw = checks.db_rows(tb["db"]("training"), f"SELECT DISTINCT value FROM {K.STRINGS} WHERE value LIKE 'cuda%_v%'")
    assert {r[0] for r in raw} >= {"cudaLaunchKernel_v7000", "cudaDeviceSynchronize_v3020"}


def test_hidden_rows_are_named_not_the_shown_ones(tb):
    """`hide`: the groups whose events not to send (a user hides a few; asking for the shown ones would put every
    row of a 10^4-thread profile in the URL)."""
    api = tb["api"]
    whole = events(api.get("timeline", run="plugin_timeline/training/dlprof", iteration=1, width=2000))
    doc = api.get("timeline", run="plugin_timeline/training/dlprof", iteration=1, width=2000, hide="t1,g0.7")
    got = events(doc)
    assert [r["id"] for r in doc["rows"]] == ["t0.0", "t0.api", "t1.0", "t1.api", "g0.7"]  # listed all the same
    assert {e["row"]["group"] for e in got} == {"t0"}
    assert [(e["start"], e["name"]) for e in got] == [
        (e["start"], e["name"]) for e in whole if e["row"]["group"] == "t0"
    ]
    long = ",".join(f"t{k}" for k in range(2000))  # over the 4096 characters a parameter may have
    doc = api.get("timeline", expect=400, run="plugin_timeline/training/dlprof", iteration=1, hide=long)
    assert "too long" in doc["error"]


def test_what_the_cpu_did_in_a_gap(tb):
    doc = tb["api"].get("timeline_gap", run="plugin_timeline/training/dlprof", t0=T1 + 27000, t1=T1 + 37000)
    assert doc["interval"] == [T1 + 27000, T1 + 37000]
    (main,) = doc["threads"]
    assert main["label"] == "python (pid 100, tid 100)"
    assert main["ops_time"] == 9000 and main["ops"] == [{"name": "/aten::linear", "calls": 1, "overlap": 9000}]
    assert main["api_calls_time"] == 1000
    assert main["api_calls"] == [{"name": "cudaLaunchKernel", "calls": 1, "overlap": 1000}]
    # the first gap of the iteration: the sync of the loop before, then the dataloader's time (no op), then
    # aten::to and its copy call
    doc = tb["api"].get("timeline_gap", run="plugin_timeline/training/dlprof", t0=1_080_000, t1=T1 + 14000)
    (main,) = doc["threads"]
    assert [(o["name"], o["overlap"]) for o in main["ops"]] == [
        (SYNC, 5000),
        ("/aten::conv2d", 4000),
        ("/aten::to", 3000),
    ]
    assert main["ops_time"] == 5000 + 4000 + 3000  # longest first: the sync, conv2d from T1 + 10 us, to
    assert {a["name"]: a["overlap"] for a in main["api_calls"]} == {
        "cudaDeviceSynchronize": 5000,
        "cudaLaunchKernel": 1000,
        "cudaMemcpyAsync": 1000,
    }


# ---------------------------------------------------------------------------- windows against SQL


def _sql_keys(db: Path, t0: int, t1: int) -> dict:
    """Keys of the events overlapping [t0, t1), by a full scan of each table (no index, no binary search)."""
    over = "start < ? AND start + max(duration, 1) > ?"
    domain = checks.db_rows(db, f"SELECT domain_id FROM {K.RAW_DOMAINS} WHERE is_primary")[0][0]
    return {
        "ops": {
            r[0]
            for r in checks.db_rows(
                db,
                f"SELECT instance_id FROM {K.RAW_OP_INSTANCES} WHERE domain_id = ? AND kind != ? AND {over}",
                (domain, K.UNASSOCIATED_GPU, t1, t0),
            )
        },
        "api": {r[0] for r in checks.db_rows(db, f"SELECT api_id FROM {K.RAW_API_CALLS} WHERE {over}", (t1, t0))},
        "gpu": {
            r[0] for r in checks.db_rows(db, f"SELECT activity_id FROM {K.RAW_GPU_ACTIVITIES} WHERE {over}", (t1, t0))
        },
    }


def _busy(db: Path, t0: int, t1: int) -> int:
    """Summed durations of the events overlapping [t0, t1) (all three tables)."""
    over = "start < ? AND start + max(duration, 1) > ?"
    domain = checks.db_rows(db, f"SELECT domain_id FROM {K.RAW_DOMAINS} WHERE is_primary")[0][0]
    total = checks.db_rows(
        db,
        f"SELECT coalesce(sum(duration), 0) FROM {K.RAW_OP_INSTANCES} WHERE domain_id = ? AND kind != ? AND {over}",
        (domain, K.UNASSOCIATED_GPU, t1, t0),
    )[0][0]
    for table in (K.RAW_API_CALLS, K.RAW_GPU_ACTIVITIES):
        total += checks.db_rows(db, f"SELECT coalesce(sum(duration), 0) FROM {table} WHERE {over}", (t1, t0))[0][0]
    return total


def test_windows_send_exactly_the_events_in_view(tb):
    api, db = tb["api"], tb["db"]("bench")
    its = api.get("iterations", run="plugin_timeline/bench/dlprof")["iterations"]
    assert len(its) == KERNELS // 1000 + 1
    lo, hi = its[1]["start"], its[-2]["end"]
    rng = random.Random(7)
    windows = [(its[5]["start"], its[5]["end"])]  # an iteration
    for _ in range(6):
        span = rng.choice([20_000, 300_000, 2_000_000, 15_000_000])
        a = rng.randrange(lo, hi - span)
        windows.append((a, a + span))
    for t0, t1 in windows:
        # wide enough that nothing is under a pixel: every event comes as itself
        doc = api.get("timeline", run="plugin_timeline/bench/dlprof", t0=t0, t1=t1, width=20_000)
        got = events(doc)
        expected = _sql_keys(db, t0, t1)
        if (t1 - t0) / 20_000 <= 400:  # the shortest events last 500 ns
            assert all(e["n"] == 1 for e in got)
            kinds = {"ops": 10, "api": 11}
            for name, keys in expected.items():
                mine = {e["key"] for e in got if (e["kind"] == kinds[name] if name in kinds else e["kind"] < 10)}
                assert mine == keys, (name, t0, t1)
        assert doc["counts"]["events"] == sum(len(k) for k in expected.values())


def test_events_under_a_pixel_are_merged_into_bounded_boxes(tb):
    api, db = tb["api"], tb["db"]("bench")
    its = api.get("iterations", run="plugin_timeline/bench/dlprof")["iterations"]
    t0, t1 = its[1]["start"], its[-2]["end"]  # 19 iterations of 4,000 events
    for width in (200, 1000):
        doc = api.get("timeline", run="plugin_timeline/bench/dlprof", t0=t0, t1=t1, width=width)
        got = events(doc)
        n_events = sum(len(k) for k in _sql_keys(db, t0, t1).values())
        assert doc["counts"]["events"] == n_events == 76_000
        assert sum(e["n"] for e in got) == n_events  # every event is in one box
        assert sum(e["busy"] for e in got) == _busy(db, t0, t1)
        per_row = {}
        for e in got:
            per_row[e["row"]["id"]] = per_row.get(e["row"]["id"], 0) + 1
        assert max(per_row.values()) <= 2 * width + 2 and len(got) < n_events / 10
        ns_per_px = (t1 - t0) / width
        for e in got:  # a box is an event of a pixel or more, or merges neighbours, or is alone
            assert e["n"] > 1 or e["end"] - e["start"] >= ns_per_px or e["key"] is not None
            assert (e["key"] is None) == (e["n"] > 1)


def test_rows_select_the_groups_sent(tb):
    api = tb["api"]
    full = api.get("timeline", run="plugin_timeline/training/dlprof", iteration=1, width=2000)
    part = api.get("timeline", run="plugin_timeline/training/dlprof", iteration=1, width=2000, rows="t1,g0.7")
    assert [r["id"] for r in part["rows"]] == [r["id"] for r in full["rows"]]  # rows are still listed
    sent = {part["rows"][r]["group"] for r in part["events"]["row"]}
    assert sent == {"t1", "g0.7"}
    assert part["gaps"] == full["gaps"]


@pytest.mark.parametrize(
    "params,status,text",
    [
        ({}, 400, "'iteration'"),
        ({"iteration": 99}, 404, "unknown iteration 99"),
        ({"t0": 5}, 400, "both t0 and t1"),
        ({"t0": 10, "t1": 10}, 400, "'t1' must be greater"),
        ({"iteration": 1, "width": 0}, 400, "'width' must be at least 1"),
        ({"iteration": 1, "width": 10**6}, 400, "at most"),
        ({"iteration": "x"}, 400, "must be an integer"),
    ],
)
def test_bad_requests(tb, params, status, text):
    doc = tb["api"].get("timeline", expect=status, run="plugin_timeline/training/dlprof", **params)
    assert text in doc["error"]
    doc = tb["api"].get(
        "timeline_gap", expect=status if "width" not in params else 200, run="plugin_timeline/training/dlprof", **params
    )
    if "width" not in params:
        assert text in doc["error"]


def test_a_window_of_too_many_events_is_refused(tb, monkeypatch):
    """More events than a request reads: 413 with how many (at least), at once (in process, with a small cap)."""
    from werkzeug.test import Client

    from dlprof_plugin import timeline
    from dlprof_plugin.viewer import build_app

    monkeypatch.setattr(timeline, "MAX_EVENTS", 5000)
    client = Client(build_app([str(tb["db"]("bench"))]))
    its = client.get("/iterations?run=dlprof_dldb").get_json()["iterations"]
    ok = client.get(f"/timeline?run=dlprof_dldb&iteration={its[3]['iteration']}")
    assert ok.status_code == 200 and ok.get_json()["counts"]["events"] == 4000
    reply = client.get(f"/timeline?run=dlprof_dldb&t0={its[3]['start']}&t1={its[5]['end']}")
    doc = reply.get_json()
    assert reply.status_code == 413 and "more than 5,000 events" in doc["error"] and "zoom in" in doc["error"]
    assert doc["max_events"] == 5000 and doc["events"] > 5000
