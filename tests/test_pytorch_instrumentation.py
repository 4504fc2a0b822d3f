"""dlprof_profiler.pytorch: markers through a recording backend, and one real Nsight Systems capture."""

from __future__ import annotations

import ast
import concurrent.futures
import contextlib
import functools
import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import threading
import types
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dlprof_profiler.pytorch as dp  # noqa: E402
from dlprof_profiler.pytorch import backward as dp_backward  # noqa: E402
from dlprof_profiler.pytorch.backend import NvtxBackend, RecordingBackend  # noqa: E402
from tests.torch_models_train import TinyTransformer  # noqa: E402

pytestmark = pytest.mark.torch

HERE = Path(__file__).resolve()
ROOT = HERE.parents[1]
EXAMPLE = ROOT / "examples" / "pytorch_train_cpu.py"


def _tag_lines() -> dict:
    lines = {}
    for number, text in enumerate(HERE.read_text().splitlines(), start=1):
        match = re.search(r"# <(\w+)>\s*$", text)
        if match:
            lines[match.group(1)] = number
    return lines


LINE = _tag_lines()
THIS = str(HERE)


# ---------------------------------------------------------------------------------------------- models


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3, padding=1)
        self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
        self.fc = nn.Linear(4 * 4 * 4, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))  # <conv1>
        x = F.relu(self.conv2(x))  # <conv2>
        x = torch.flatten(x, 1)  # <flatten>
        return self.fc(x)  # <fc>


def block(x):
    return torch.sigmoid(x)  # <block_body>


# ---------------------------------------------------------------------------------------------- helpers


@pytest.fixture
def rec():
    dp.uninstall()
    backend = RecordingBackend()
    dp.init(backend=backend)
    yield backend
    dp.uninstall()


def parse(text: str):
    if text.startswith('{"'):
        return json.loads(text)
    if text.startswith("{"):
        return ast.literal_eval(text)
    return None


def ops(backend: RecordingBackend, direction=None, op=None):
    """One record per argument marker: the marker's fields plus funcStack/trace of its trace marker."""
    out = []
    for rng in backend.ranges():
        value = parse(rng.text)
        if not isinstance(value, dict) or "op" not in value or "mod" not in value:
            continue
        trace = next(a for a in rng.ancestors() if a.text.startswith("{'traceMarker'"))
        tvalue = ast.literal_eval(trace.text)
        rec = dict(value)
        rec.update(funcStack=tvalue.get("funcStack"), trace=tvalue["traceMarker"], range=rng, trace_range=trace)
        if (direction is None or rec["dir"] == direction) and (op is None or rec["op"] == op):
            out.append(rec)
    return out


def configs(backend: RecordingBackend):
    """The config markers' values (Python literals, like the other markers, so torch.profiler can carry them)."""
    return [ast.literal_eval(t)["model_config"] for t in backend.texts() if t.startswith("{'model_config'")]


def tail(func_stack: str, n: int) -> str:
    return "/".join(func_stack.split("/")[-n:])


def trace_value(record: dict) -> dict:
    """The trace marker of an ops() record, parsed."""
    return ast.literal_eval(record["trace_range"].text)


# ---------------------------------------------------------------------------------------------- names


def outermost_user_frame_is_the_test(test):
    """Run `test` on a thread of its own, beneath which lie only the standard library's frames, so the test
    function is the outermost user frame whatever runs the suite: pytest-xdist's workers run tests beneath
    execnet's bootstrap code, compiled from a string (`<string>`), which counts as user code as `python -c`
    does, so funcStack would start there."""

    @functools.wraps(test)
    def run(*args, **kwargs):
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(test, *args, **kwargs).result()

    return run


@outermost_user_frame_is_the_test
def test_forward_names_hierarchy_and_numbering(rec):
    torch.manual_seed(0)
    model = Net()
    x = torch.randn(2, 3, 4, 4)
    rec.clear()
    model(x)  # <call>
    fwd = ops(rec, "fprop")
    assert [r["op"] for r in fwd] == ["conv2d", "relu", "conv2d", "relu", "flatten", "linear"]
    assert [r["mod"] for r in fwd] == ["torch.nn.functional"] * 4 + ["torch", "torch.nn.functional"]
    me = sys._getframe().f_code.co_name
    stacks = [r["funcStack"] for r in fwd]
    prefix = f"/{me}/model/"  # the root module by the variable that holds it, submodules by attribute
    assert stacks == [
        prefix + "conv1/conv2d",
        prefix + "relu",
        prefix + "conv2/conv2d",
        prefix + "relu(2)",
        prefix + "flatten",
        prefix + "fc/linear",
    ]
    # class names: one (element, class) pair per module element of funcStack
    assert [trace_value(r)["modules"] for r in fwd] == [
        [("model", "Net"), ("conv1", "Conv2d")],
        [("model", "Net")],
        [("model", "Net"), ("conv2", "Conv2d")],
        [("model", "Net")],
        [("model", "Net")],
        [("model", "Net"), ("fc", "Linear")],
    ]
    # the three markers nest: trace > argument, and the backend saw balanced push/pop
    for r in fwd:
        assert r["range"].parent is r["trace_range"]
        assert r["trace_range"].parent is None


@outermost_user_frame_is_the_test
def test_same_call_site_keeps_name_two_call_sites_get_numbers(rec):
    model = Net()
    x = torch.randn(2, 3, 4, 4)
    y = torch.randn(3)
    rec.clear()
    for _ in range(3):
        model(x)  # <loop_call>
        block(y)  # <block_site1>
    block(y)  # <block_site2>
    convs = ops(rec, "fprop", "conv2d")
    assert len(convs) == 6
    names = [r["funcStack"] for r in convs]
    assert names[0::2] == [names[0]] * 3 and names[1::2] == [names[1]] * 3
    assert names[0].endswith("/model/conv1/conv2d") and names[1].endswith("/model/conv2/conv2d")
    sig = [r["funcStack"] for r in ops(rec, "fprop", "sigmoid")]
    me = sys._getframe().f_code.co_name
    assert sig == ["/%s/block/sigmoid" % me] * 3 + ["/%s/block(2)/sigmoid" % me]
    # one module called from more sites: numbered in the order the sites are met (the loop above was first)
    rec.clear()
    model(x)
    model(x)
    model(x)
    assert [r["funcStack"] for r in ops(rec, "fprop", "linear")] == [
        f"/{me}/model(2)/fc/linear",
        f"/{me}/model(3)/fc/linear",
        f"/{me}/model(4)/fc/linear",
    ]


def test_names_do_not_depend_on_module_hooks(rec):
    model = Net()
    x = torch.randn(2, 3, 4, 4)

    def names(hook: bool):
        handle = model.conv1.register_forward_hook(lambda mod, inp, out: None) if hook else None
        try:
            rec.clear()
            model(x)
        finally:
            if handle is not None:
                handle.remove()
        return [r["funcStack"] for r in ops(rec, "fprop")]

    plain, hooked = [names(flag) for flag in (False, True)]  # one call site for both
    assert hooked == plain


def test_sequential_layers_are_distinct_by_default():
    """nn.Sequential calls its layers from one line: their attribute paths (0, 1) keep them apart."""
    dp.uninstall()
    backend = RecordingBackend()
    seq = nn.Sequential(nn.Linear(3, 3), nn.ReLU(), nn.Linear(3, 3))
    x = torch.randn(2, 3)
    with dp.instrumented(backend=backend):
        for _ in range(2):
            seq(x)
    names = [tail(r["funcStack"], 3) for r in ops(backend, "fprop")]
    assert names == ["seq/0/linear", "seq/1/relu", "seq/2/linear"] * 2


def test_distinguish_instances_option():
    """Modules without an attribute path (kept in a plain list) share a name, unless distinguish_instances."""
    dp.uninstall()
    blocks = [nn.Linear(3, 3), nn.Linear(3, 3)]
    x = torch.randn(2, 3)

    def run(**options):
        backend = RecordingBackend()
        with dp.instrumented(backend=backend, **options):
            for _ in range(2):
                for block in blocks:
                    block(x)  # <list_call>
        return [tail(r["funcStack"], 2) for r in ops(backend, "fprop", "linear")]

    assert run() == ["block/linear"] * 4
    assert run(distinguish_instances=True) == ["block/linear", "block(2)/linear"] * 2


@pytest.mark.slow
@outermost_user_frame_is_the_test
def test_transformer_encoder_layers_have_attribute_paths(rec):
    """A 2-layer TransformerEncoder: every layer's ops get their own name, as torch.profiler's module
    hierarchy names them; helper methods (_sa_block, _ff_block) add nothing; classes go to 'modules'."""
    torch.manual_seed(0)
    model = TinyTransformer()
    x = torch.randn(3, 5, 16)
    rec.clear()
    model(x)
    me = sys._getframe().f_code.co_name
    fwd = ops(rec, "fprop")
    by_op: dict = {}
    for r in fwd:
        by_op.setdefault(r["op"], []).append(r["funcStack"][len(f"/{me}/") :])
    assert by_op["linear"] == [
        "model/encoder/layers.0/linear1/linear",
        "model/encoder/layers.0/linear2/linear",
        "model/encoder/layers.1/linear1/linear",
        "model/encoder/layers.1/linear2/linear",
        "model/head/linear",
    ]
    assert by_op["multi_head_attention_forward"] == [
        f"model/encoder/layers.{i}/self_attn/multi_head_attention_forward" for i in (0, 1)
    ]
    assert by_op["layer_norm"] == [f"model/encoder/layers.{i}/norm{n}/layer_norm" for i in (0, 1) for n in (1, 2)]
    # each op of one forward pass has a name of its own: nothing merges the two layers
    names = [r["funcStack"] for r in fwd]
    assert len(set(names)) == len(names)
    linear1 = next(r for r in fwd if r["funcStack"].endswith("layers.1/linear1/linear"))
    assert trace_value(linear1)["modules"] == [
        ("model", "TinyTransformer"),
        ("encoder", "TransformerEncoder"),
        ("layers.1", "TransformerEncoderLayer"),
        ("linear1", "Linear"),
    ]
    # backward ranges carry the forward call's names
    rec.clear()
    model(x).sum().backward()
    fwd = {r["callid"]: r["funcStack"] for r in ops(rec, "fprop")}
    bwd = ops(rec, "bprop")
    assert bwd and all(b["funcStack"] == fwd[b["fwdCallid"]] for b in bwd)
    assert {b["funcStack"] for b in bwd if b["op"] == "linear"} == {n for n in fwd.values() if n.endswith("/linear")}


class _Trainer:
    def __init__(self) -> None:
        self.net = nn.Linear(2, 2)

    def step(self, x):
        return self.net(x)


@outermost_user_frame_is_the_test
def test_root_module_names(rec):
    """A module called from outside any module is named by the variable or attribute holding it, else by
    its class; methods of modules that are not being called (construction) keep Class::method frames."""
    x = torch.randn(1, 2)
    criterion = nn.MSELoss()
    trainer = _Trainer()
    rec.clear()
    criterion(x, x)
    trainer.step(x)
    nn.Linear(2, 2)(x)  # held by nothing: its class
    me = sys._getframe().f_code.co_name
    got = [r["funcStack"] for r in ops(rec, "fprop") if r["op"] in ("mse_loss", "linear")]
    assert got == [f"/{me}/criterion/mse_loss", f"/{me}/_Trainer::step/net/linear", f"/{me}/Linear/linear"]
    rec.clear()
    Net()
    built = [r["funcStack"] for r in ops(rec, "fprop")]
    assert built and all(f.startswith(f"/{me}/Net::__init__/") for f in built)
    # (Conv2d.__init__ runs _ConvNd.__init__ on the same object: the runtime class names both frames)
    assert (
        f"/{me}/Net::__init__/Conv2d::__init__/Conv2d::__init__/Conv2d::reset_parameters/kaiming_uniform_/uniform_"
        in built
    )


class _Unhashable(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(2, 2)

    def __eq__(self, other):  # without __hash__: instances are unhashable (named_modules() fails on them)
        return self is other

    def forward(self, x):
        return self.inner(x)


@pytest.mark.slow
def test_unhashable_modules_are_named(rec):
    m = _Unhashable()
    x = torch.randn(1, 2)
    rec.clear()
    m(x)
    assert [tail(r["funcStack"], 3) for r in ops(rec, "fprop")] == ["m/inner/linear"]


@outermost_user_frame_is_the_test
def test_stack_trace_user_frames_script_first(rec):
    model = Net()
    x = torch.randn(2, 3, 4, 4)
    rec.clear()
    model(x)  # <trace_call>
    conv1, _, conv2 = ops(rec, "fprop")[:3]
    assert conv1["trace"] == ["%s:%d" % (THIS, LINE["trace_call"]), "%s:%d" % (THIS, LINE["conv1"])]
    assert conv2["trace"] == ["%s:%d" % (THIS, LINE["trace_call"]), "%s:%d" % (THIS, LINE["conv2"])]
    for r in ops(rec):
        assert all(not f.startswith(os.path.dirname(torch.__file__)) for f in r["trace"])
        assert all("dlprof_profiler" not in f for f in r["trace"])


# ---------------------------------------------------------------------------------------------- arguments


def test_shapes_dtypes_scalars_and_keywords(rec):
    x = torch.randn(2, 3, 8, 8)
    w = torch.randn(5, 3, 3, 3)
    a = torch.arange(6)
    rec.clear()
    F.conv2d(x, w, stride=2, padding=(1, 1))
    torch.add(a, a, alpha=2)
    x.to(torch.bfloat16)
    torch.cat([a, a], dim=0)
    torch.clamp(x, min=float("-inf"), max=float("inf"))
    x[:, 0]
    recs = ops(rec, "fprop")
    assert [(r["mod"], r["op"]) for r in recs] == [
        ("torch.nn.functional", "conv2d"),
        ("torch", "add"),
        ("Tensor", "to"),
        ("torch", "cat"),
        ("torch", "clamp"),
        ("Tensor", "__getitem__"),
    ]
    conv, add, to, cat, clamp, getitem = (r["args"] for r in recs)
    assert conv == [
        {"name": "", "type": "tensor", "shape": (2, 3, 8, 8), "dtype": "float32"},
        {"name": "", "type": "tensor", "shape": (5, 3, 3, 3), "dtype": "float32"},
        {"name": "stride", "type": "int", "value": 2},
        {"name": "padding", "type": "tuple", "value": (1, 1)},
    ]
    assert add[0]["dtype"] == "int64" and add[0]["shape"] == (6,)
    assert add[2] == {"name": "alpha", "type": "int", "value": 2}
    assert to[1] == {"name": "", "type": "dtype", "value": "bfloat16"}
    assert cat == [{"name": "", "type": "tensor", "shape": (6,), "dtype": "int64"}] * 2 + [
        {"name": "dim", "type": "int", "value": 0}
    ]
    assert clamp[1:] == [
        {"name": "min", "type": "float", "value": "-inf"},
        {"name": "max", "type": "float", "value": "inf"},
    ]
    assert getitem[1] == {"name": "", "type": "slice", "value": (None, None, None)}
    assert getitem[2] == {"name": "", "type": "int", "value": 0}
    for text in rec.texts():  # every marker reads back with literal_eval / json
        assert parse(text) is not None or text.startswith(("enumerate(", "Optimizer.step#"))


def test_positional_scalars_carry_parameter_names(rec):
    x = torch.randn(1, 3, 8, 8)
    w = torch.randn(4, 3, 3, 3)
    rec.clear()
    F.conv2d(x, w, None, 2, 1)  # builtin: names from its docstring signature
    x.sum(1, True)  # tensor method: self first
    torch.arange(5)  # docstring "arange(start=0, end, ...)" is ambiguous: no name
    F.dropout(x, 0.5, False)  # Python function: its signature
    conv, total, arange, dropout = (r["args"] for r in ops(rec, "fprop"))
    assert conv[2:] == [
        {"name": "bias", "type": "NoneType", "value": None},
        {"name": "stride", "type": "int", "value": 2},
        {"name": "padding", "type": "int", "value": 1},
    ]
    assert conv[0]["name"] == conv[1]["name"] == ""  # tensors stay unnamed, as in PyProf
    assert total[1:] == [{"name": "dim", "type": "int", "value": 1}, {"name": "keepdim", "type": "bool", "value": True}]
    assert arange == [{"name": "", "type": "int", "value": 5}]
    assert dropout[1:] == [
        {"name": "p", "type": "float", "value": 0.5},
        {"name": "training", "type": "bool", "value": False},
    ]


def test_inner_torch_calls_are_not_annotated(rec):
    x = torch.randn(4)
    rec.clear()
    F.relu(x)  # F.relu calls torch.relu inside
    F.softmax(x, dim=0)  # calls Tensor.softmax inside
    recs = ops(rec)
    assert [(r["mod"], r["op"]) for r in recs] == [("torch.nn.functional", "relu"), ("torch.nn.functional", "softmax")]


def test_rnn_module_marker(rec):
    lstm = nn.LSTM(4, 8, batch_first=True)
    x = torch.randn(2, 5, 4)
    rec.clear()
    lstm(x)
    (r,) = ops(rec, "fprop")
    assert (r["mod"], r["op"]) == ("torch.nn.modules.rnn", "LSTM")
    assert r["funcStack"].endswith("/lstm/LSTM")  # the module's name, then the op: its class
    module = r["range"].parent
    assert ast.literal_eval(module.text) == {"mod": "torch.nn.modules.rnn", "strRepr": "4, 8, batch_first=True"}
    assert module.parent is r["trace_range"]
    assert r["args"][0] == {"name": "", "type": "tensor", "shape": (2, 5, 4), "dtype": "float32"}
    # backward of the LSTM links to its forward call
    rec.clear()
    out, _ = lstm(x)
    out.sum().backward()
    fwd = ops(rec, "fprop", "LSTM")[0]
    assert {b["fwdCallid"] for b in ops(rec, "bprop", "LSTM")} == {fwd["callid"]}


# ---------------------------------------------------------------------------------------------- direction


def _train_step(model, x, y):
    out = model(x)
    loss = F.cross_entropy(out, y)
    loss.backward()
    return loss


def _check_direction(rec):
    fwd = {r["callid"]: r for r in ops(rec, "fprop")}
    bwd = ops(rec, "bprop")
    assert bwd, "no backward markers"
    for b in bwd:
        f = fwd[b["fwdCallid"]]
        assert (b["mod"], b["op"], b["funcStack"], b["args"]) == (f["mod"], f["op"], f["funcStack"], f["args"])
        assert b["trace"] == f["trace"]
        assert b["range"].parent is b["trace_range"] and b["trace_range"].parent is None
        assert b["range"].start > f["range"].end
    linked = {(fwd[b["fwdCallid"]]["op"], b["node"]) for b in bwd}
    assert {
        ("conv2d", "ConvolutionBackward0"),
        ("relu", "ReluBackward0"),
        ("linear", "AddmmBackward0"),
        ("flatten", "ViewBackward0"),
        ("cross_entropy", "NllLossBackward0"),
        ("cross_entropy", "LogSoftmaxBackward0"),
    } <= linked
    # every forward op that needs a gradient got a backward range, each fwdCallid of one op only
    assert {fwd[b["fwdCallid"]]["op"] for b in bwd} == {"conv2d", "relu", "flatten", "linear", "cross_entropy"}
    return fwd, bwd


@pytest.mark.slow
def test_direction_without_emit_nvtx(rec):
    model = Net()
    x, y = torch.randn(2, 3, 4, 4), torch.tensor([1, 2])
    rec.clear()
    _train_step(model, x, y)
    fwd, bwd = _check_direction(rec)
    # backward runs in reverse order of the forward ops
    order = [fwd[b["fwdCallid"]]["op"] for b in bwd]
    assert order[0] == "cross_entropy" and order[-1] == "conv2d"
    # the backward ranges enclose PyTorch's node work: they are not zero-length
    assert all(b["range"].end >= b["range"].start for b in bwd)


@pytest.mark.slow
def test_direction_with_emit_nvtx_or_autograd_profiler(rec):
    """With emit_nvtx (CUDA builds) or, on CPU-only builds where emit_nvtx cannot run, the autograd
    profiler (same RecordFunction machinery), markers and links are unchanged."""
    model = Net()
    x, y = torch.randn(2, 3, 4, 4), torch.tensor([1, 2])
    rec.clear()
    if torch.cuda.is_available():
        with torch.autograd.profiler.emit_nvtx(record_shapes=True):
            _train_step(model, x, y)
    else:
        with torch.autograd.profiler.profile(record_shapes=True):
            _train_step(model, x, y)
        assert configs(rec)[-1]["autograd_profile"] is True
        # the emit_nvtx switch: an enabled emit_nvtx entered (this one stops at its re-entry check, before
        # touching CUDA or the profiler state)
        entered = types.SimpleNamespace(enabled=True, entered=True, record_shapes=False)
        with pytest.raises(RuntimeError, match="reentrant"):
            torch.autograd.profiler.emit_nvtx.__enter__(entered)
    _check_direction(rec)
    assert configs(rec)[-1]["emit_nvtx"] is True


def test_backward_nodes_of_one_call_share_a_backward_callid(rec, monkeypatch):
    """linear builds AddmmBackward0 and TBackward0: two bprop ranges, one backward call. Both carry the
    forward callid (fwdCallid) and one backward callid, new for each backward pass, never a forward one.
    The AccumulateGrad nodes of its inputs (bias, x, weight), which autograd runs right after the node that
    feeds them, are in the same backward call."""
    for graph_task_id in (dp_backward._graph_task_id, None):  # autograd's graph task id, and the fallback
        monkeypatch.setattr(dp_backward, "_graph_task_id", graph_task_id)
        lin = nn.Linear(3, 2)
        x = torch.randn(4, 3, requires_grad=True)
        rec.clear()
        out = lin(x)
        out.sum().backward(retain_graph=True)
        out.sum().backward()  # a second pass over the same nodes
        (fwd,) = ops(rec, "fprop", "linear")
        bwd = ops(rec, "bprop", "linear")
        one_pass = ["AddmmBackward0", "AccumulateGrad", "AccumulateGrad", "TBackward0", "AccumulateGrad"]
        assert [b["node"] for b in bwd] == one_pass * 2
        assert {b["fwdCallid"] for b in bwd} == {fwd["callid"]}
        first, second = bwd[0]["callid"], bwd[5]["callid"]
        assert {b["callid"] for b in bwd[:5]} == {first} and {b["callid"] for b in bwd[5:]} == {second}
        assert first != second
        forward_ids = {r["callid"] for r in ops(rec, "fprop")}
        assert not forward_ids & {first, second}
        # in the export the engine strips the call ids before parsing: the texts of a node are one text
        texts = {re.sub(r"'callid': \d+, ", "", b["range"].text) for b in bwd}
        assert len(texts) == 3


def test_backward_on_another_thread(rec):
    model = Net()
    x, y = torch.randn(2, 3, 4, 4), torch.tensor([1, 2])
    loss = F.cross_entropy(model(x), y)
    rec.clear()
    worker = threading.Thread(target=loss.backward)
    worker.start()
    worker.join()
    bwd = ops(rec, "bprop")
    assert bwd and {b["range"].thread for b in bwd} == {worker.ident}


def test_no_backward_links_under_no_grad(rec):
    model = Net()
    x = torch.randn(2, 3, 4, 4)
    with torch.no_grad():
        out = model(x)
    assert out.grad_fn is None
    assert ops(rec, "bprop") == []


def test_in_place_op_on_a_view_owns_copyslices_and_the_regenerated_view(rec):
    """`flat[:2].relu_()` on a view of `h`: autograd gives h's base the node CopySlices (made by relu_) and, when
    `sum` then reads `flat`, makes flat's grad_fn afresh (AsStridedBackward0). Both run in relu_'s backward call;
    flatten's own node is replaced and never runs; w's AccumulateGrad runs in the backward call of mul, whose
    node feeds it."""
    w = torch.randn(3, 4, requires_grad=True)
    rec.clear()
    h = w * 2
    flat = h.flatten()
    flat[:2].relu_()
    flat.sum().backward()
    fwd = {r["callid"]: r for r in ops(rec, "fprop")}
    by_op: dict = {}
    for b in ops(rec, "bprop"):
        by_op.setdefault(fwd[b["fwdCallid"]]["op"], []).append(b)
    assert set(by_op) == {"sum", "relu_", "__mul__"}
    assert sorted(b["node"] for b in by_op["relu_"]) == ["AsStridedBackward0", "CopySlices"]
    assert [b["node"] for b in by_op["__mul__"]] == ["MulBackward0", "AccumulateGrad"]
    for nodes in by_op.values():
        assert len({b["callid"] for b in nodes}) == 1  # one backward call per forward call
        assert all(b["range"].parent is b["trace_range"] for b in nodes)


@pytest.mark.slow
def test_accumulate_grad_follows_its_producer_in_every_iteration(rec):
    """A parameter's AccumulateGrad node outlives the iteration: in each backward pass it joins the backward
    call of the node that produced the gradient in that pass."""
    lin = nn.Linear(3, 2)
    rec.clear()
    for _ in range(2):
        lin(torch.randn(4, 3)).sum().backward()
    fwd = {r["callid"]: r for r in ops(rec, "fprop") if r["op"] == "linear"}
    assert len(fwd) == 2
    for callid in fwd:
        nodes = [b for b in ops(rec, "bprop", "linear") if b["fwdCallid"] == callid]
        assert sorted(b["node"] for b in nodes) == ["AccumulateGrad", "AccumulateGrad", "AddmmBackward0", "TBackward0"]
        assert len({b["callid"] for b in nodes}) == 1


class _OddNames(nn.Module):
    """A submodule whose attribute name holds a double quote and a backslash (a ModuleDict key)."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = nn.ModuleDict({'odd"name\\x': nn.Linear(2, 2)})

    def forward(self, x):
        return self.layers['odd"name\\x'](x)


def test_marker_texts_hold_no_quote_backslash_or_control_character(rec):
    """Kineto writes event names into its JSON unescaped: every marker text must do without `"`, `\\` and
    control characters, and still parse. A module attribute and a string argument that hold them are
    written with those characters replaced."""
    model = _OddNames()
    rec.clear()
    model(torch.randn(1, 2))
    F.pad(torch.randn(2, 2), (1, 1), mode="constant")
    torch.einsum("ij,jk->ik", torch.randn(2, 2), torch.randn(2, 2))
    texts = rec.texts()
    assert texts and not [t for t in texts if '"' in t or "\\" in t or not t.isprintable()]
    for text in texts:
        if text.startswith("{"):
            assert isinstance(ast.literal_eval(text), dict)
    linear = next(r for r in ops(rec, "fprop") if r["op"] == "linear")
    assert linear["funcStack"].endswith("/model/layers.odd`name_x/linear")
    value = dp.markers.describe_args(('it\'s a "q" \\ \n',), {})
    text = dp.markers.arg_marker("torch", "op", 1, value)
    assert ast.literal_eval(text)["args"][0]["value"] == "it`s a `q` /  "


def _odd_step(model, x):
    model(x).sum().backward()


@pytest.mark.slow
def test_record_function_backend_puts_the_markers_in_the_torch_profiler_trace(tmp_path):
    """The same markers as NVTX ranges, as torch.profiler ranges: the exported trace is valid JSON (a quote
    in a marker would break it) and holds them as events named by the marker texts."""
    rec = RecordingBackend()
    model, x = _OddNames(), torch.randn(3, 2)
    prof = torch.profiler.profile()
    for backend, profiler in ((rec, contextlib.nullcontext()), (dp.RecordFunctionBackend(), prof)):
        with dp.instrumented(backend=backend), profiler:
            _odd_step(model, x)  # one call site: the same stack trace in both markers
    expected = rec.texts()
    path = tmp_path / "t.json"
    prof.export_chrome_trace(str(path))
    names = [e["name"] for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]
    strip = re.compile(r"'(?:callid|fwdCallid)': \d+")
    recorded = sorted(strip.sub("", n) for n in names if n.startswith("{'") and "model_config" not in n)
    assert recorded == sorted(strip.sub("", t) for t in expected if t.startswith("{'") and "model_config" not in t)
    assert any("'op': 'linear'" in n and "'dir': 'bprop'" in n and "odd`key" not in n for n in recorded)


def test_nvtx_library_backend(monkeypatch):
    """The auto backend calls the NVTX C API (libnvToolsExt.so.1) when it is there: no Python package needed."""
    try:
        backend = dp.LibNvtxBackend(enabled=True)
    except ImportError:
        pytest.skip("no libnvToolsExt.so.1 and no CUDA PyTorch NVTX")
    backend.push("range with ünï text")
    backend.pop()
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/opt/nsys/libToolsInjection64.so")
    monkeypatch.delenv("NVTX_DISABLE", raising=False)
    monkeypatch.delenv("DLPROF_DISABLE", raising=False)
    auto = dp.backend.resolve_backend("auto")
    assert isinstance(auto, dp.LibNvtxBackend) and auto.enabled


# ---------------------------------------------------------------------------------------------- foreach, linalg


def test_foreach_optimizers_and_clip_grad_norm_are_annotated(rec):
    """AdamW and SGD with foreach=True and clip_grad_norm_ run torch._foreach_* ops: each is one op with its
    tensor lists described element by element (the parameters' shapes)."""
    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2))
    shapes = [(4, 3), (4,), (2, 4), (2,)]
    adamw = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    sgd = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, foreach=True)
    for opt in (adamw, sgd):
        model(torch.randn(5, 3)).sum().backward()
        rec.clear()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        opt.step()
        step = f"Optimizer.step#{type(opt).__name__}.step"
        recs = ops(rec)
        in_step = [r for r in recs if step in [a.text for a in r["range"].ancestors()]]
        clip = [r for r in recs if "/clip_grad_norm_/" in r["funcStack"]]
        foreach = {r["op"] for r in in_step if r["op"].startswith("_foreach_")}
        if opt is adamw:
            assert {
                "_foreach_lerp_",
                "_foreach_addcmul_",
                "_foreach_addcdiv_",
                "_foreach_sqrt",
                "_foreach_mul_",
            } <= foreach
        else:
            assert "_foreach_add_" in foreach
        assert all(r["mod"] == "torch" for r in in_step if r["op"].startswith("_foreach_"))
        assert {r["op"] for r in clip} >= {"_foreach_norm", "linalg_vector_norm", "_foreach_mul_"}
        norm = next(r for r in clip if r["op"] == "_foreach_norm")
        assert [a["shape"] for a in norm["args"] if a["type"] == "tensor"] == shapes  # the gradients
        vector_norm = next(r for r in clip if r["op"] == "linalg_vector_norm")
        assert vector_norm["mod"] == "torch.linalg"


def test_linalg_functions_are_wrapped(rec):
    linalg_functions = [
        n for n, f in vars(torch.linalg).items() if not n.startswith("_") and callable(f) and not isinstance(f, type)
    ]
    assert all(getattr(getattr(torch.linalg, n), "__dlprof_original__", None) is not None for n in linalg_functions)
    foreach = [n for n in vars(torch) if n.startswith("_foreach_")]
    assert foreach and all(getattr(torch, n).__dlprof_original__ is not None for n in foreach)
    a = torch.randn(3, 3)
    rec.clear()
    torch.linalg.norm(a)
    torch.norm(a)
    torch.linalg.matmul(a, a)
    assert [(r["mod"], r["op"]) for r in ops(rec)] == [
        ("torch.linalg", "linalg_norm"),
        ("torch", "norm"),
        ("torch.linalg", "linalg_matmul"),
    ]
    assert ops(rec)[2]["args"] == [{"name": "", "type": "tensor", "shape": (3, 3), "dtype": "float32"}] * 2


# ---------------------------------------------------------------------------------------------- scopes, config


@pytest.mark.slow
def test_dataloader_and_optimizer_scopes(rec):
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = torch.utils.data.TensorDataset(torch.randn(8, 3, 4, 4), torch.randint(0, 10, (8,)))
    loader = torch.utils.data.DataLoader(data, batch_size=4)
    rec.clear()
    for x, y in loader:
        opt.zero_grad()
        _train_step(model, x, y)
        opt.step()
    ranges = rec.ranges()
    loads = [r for r in ranges if r.text == "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"]
    steps = [r for r in ranges if r.text == "Optimizer.step#SGD.step"]
    assert len(loads) == 3 and len(steps) == 2  # the third __next__ raises StopIteration
    assert all(r.parent is None and not r.children for r in loads)  # collate ops are not annotated
    assert all(r.parent is None for r in steps)
    inside = [r for r in ranges if r.parent in steps and r.text.startswith("{'traceMarker'")]
    assert inside and all("SGD::step" in ast.literal_eval(r.text)["funcStack"] for r in inside)
    # nothing annotated while the iterator was created (sampler seed)
    first_load = loads[0].index
    assert not [r for r in ranges[:first_load] if r.text.startswith("{'traceMarker'")]
    cfg = configs(rec)[-1]
    assert (cfg["batch_size"], cfg["num_workers"], cfg["pin_memory"]) == (4, 0, False)


def test_config_marker(rec, monkeypatch):
    first = configs(rec)[0]
    assert first["torch_version"] == torch.__version__
    assert first["cuda_version"] == torch.version.cuda
    for key in (
        "cudnn_version",
        "cudnn_benchmark",
        "cudnn_benchmark_disabled",
        "amp_enabled",
        "autocast",
        "detect_anomaly",
        "gradcheck",
        "gradgradcheck",
        "autograd_profile",
        "emit_nvtx",
        "num_workers",
        "pin_memory",
        "batch_size",
        "gpu_total_memory",
        "gpu_name",
    ):
        assert key in first
    assert first["batch_size"] is None and first["autocast"] is False
    if not torch.cuda.is_available():
        assert first["gpu_total_memory"] is None
    model = Net()
    x = torch.randn(6, 3, 4, 4)
    model(x)  # first model input gives the batch size
    assert configs(rec)[-1]["batch_size"] == 6
    with torch.autocast("cpu", dtype=torch.bfloat16):
        model(x)
    assert configs(rec)[-1]["autocast"] is True and configs(rec)[-1]["amp_enabled"] is True
    with pytest.warns(UserWarning), torch.autograd.detect_anomaly():
        model(x).sum().backward()
    assert configs(rec)[-1]["detect_anomaly"] is True
    inp = torch.randn(3, dtype=torch.double, requires_grad=True)
    torch.autograd.gradcheck(torch.sin, (inp,))
    assert configs(rec)[-1]["gradcheck"] is True
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    opt.step()
    last = configs(rec)[-1]
    assert last["cudnn_benchmark"] is True and last["cudnn_benchmark_disabled"] is False
    # config markers are zero-length ranges at the top level
    for r in rec.ranges():
        if r.text.startswith("{'model_config'"):
            assert r.parent is None and not r.children


# ---------------------------------------------------------------------------------------------- install


def _snapshot():
    from torch.utils.data import dataloader

    return {
        "torch.conv2d": torch.conv2d,
        "torch.add": torch.add,
        "torch.einsum": torch.einsum,
        "F.relu": F.relu,
        "F.conv2d": F.conv2d,
        "F.linear": F.linear,
        "Tensor.add": torch.Tensor.add,
        "Tensor.__add__": torch.Tensor.__add__,
        "Tensor.__getitem__": torch.Tensor.__getitem__,
        "Tensor.split": torch.Tensor.split,
        "next": dataloader._BaseDataLoaderIter.__dict__["__next__"],
        "iter": dataloader.DataLoader.__dict__["__iter__"],
        "LSTM.forward": nn.LSTM.__dict__["forward"],
        "emit_nvtx.__enter__": torch.autograd.profiler.emit_nvtx.__enter__,
        "gradcheck": torch.autograd.gradcheck,
        "tensor_dict": dict(torch.Tensor.__dict__),
        "torch_dict": dict(vars(torch)),
        "linalg_dict": dict(vars(torch.linalg)),
        "F_dict": dict(vars(F)),
    }


def test_uninstall_restores_torch():
    dp.uninstall()
    before = _snapshot()
    dp.init(backend=RecordingBackend())
    assert torch.conv2d is not before["torch.conv2d"]
    assert torch.Tensor.__add__ is not before["Tensor.__add__"]
    assert "__add__" in torch.Tensor.__dict__  # inherited from TensorBase, now our own attribute
    dp.uninstall()
    after = _snapshot()
    for key in before:
        if key.endswith("_dict"):
            assert after[key].keys() == before[key].keys(), key
            assert all(after[key][k] is before[key][k] for k in before[key]), key
        else:
            assert after[key] is before[key], key
    assert not dp.is_installed() and not dp.is_active()


@pytest.mark.slow
def test_init_twice_is_harmless(rec):
    original = torch.conv2d.__dlprof_original__
    dp.init()
    dp.init(record_shapes=True)
    assert dp.get_backend() is rec
    assert torch.conv2d.__dlprof_original__ is original
    x = torch.ones(2)
    rec.clear()
    torch.relu(x)
    assert len(ops(rec)) == 1 and len(rec.events) == 4


def test_instrumented_context_manager():
    dp.uninstall()
    original = torch.matmul
    backend = RecordingBackend()
    x = torch.ones(2, 2)
    with dp.instrumented(backend=backend) as got:
        assert got is backend and torch.matmul is not original
        torch.matmul(x, x)
    assert torch.matmul is original
    assert [r["op"] for r in ops(backend)] == ["matmul"]


def test_inactive_backend_passes_through():
    dp.uninstall()
    backend = RecordingBackend(enabled=False)
    with dp.instrumented(backend=backend):
        assert dp.is_installed() and not dp.is_active()
        model = Net()
        F.cross_entropy(model(torch.randn(2, 3, 4, 4)), torch.tensor([0, 1])).backward()
    assert backend.events == []


def test_forked_child_is_inactive():
    """A fork() child (DataLoader worker) records nothing: is_active() is false there and torch calls pass
    straight through; enable() in the child switches annotation on again; the parent is unaffected."""
    if not hasattr(os, "fork"):
        pytest.skip("no fork()")
    dp.uninstall()
    backend = RecordingBackend()
    ones = torch.ones(2)
    with dp.instrumented(backend=backend):
        assert dp.is_active()
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: report and leave without running pytest's teardown
            try:
                before = len(backend.events)
                torch.relu(ones)
                quiet = (dp.is_active(), len(backend.events) - before)
                dp.enable()
                torch.relu(ones)
                os.write(write, json.dumps([*quiet, dp.is_active(), len(backend.events) - before]).encode())
            finally:
                os._exit(0)
        os.close(write)
        os.waitpid(pid, 0)
        with os.fdopen(read) as pipe:
            report = json.loads(pipe.read())
        assert report == [False, 0, True, 4]  # nothing, then trace + argument markers pushed and popped
        assert dp.is_active()
        rec_before = len(backend.events)
        torch.relu(ones)
        assert len(backend.events) == rec_before + 4


def test_enable_disable():
    dp.uninstall()
    backend = RecordingBackend()
    x = torch.ones(1)
    with dp.instrumented(backend=backend):
        dp.disable()
        torch.relu(x)
        dp.enable()
        torch.sigmoid(x)
    assert [r["op"] for r in ops(backend)] == ["sigmoid"]


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_torchscript_and_tracing_still_work(rec):
    def scripted_fn(x):
        return F.relu(torch.sigmoid(x) + 1)

    model = nn.Sequential(nn.Linear(2, 2), nn.ReLU())
    x = torch.ones(1, 2)
    expected = model(x)
    assert torch.equal(torch.jit.script(scripted_fn)(x), F.relu(torch.sigmoid(x) + 1))
    assert torch.equal(torch.jit.script(model)(x), expected)
    assert torch.equal(torch.jit.trace(model, x)(x), expected)
    assert torch.conv2d.__dlprof_original__ is not None  # wrappers are back after scripting
    rec.clear()
    model(x)
    assert [r["op"] for r in ops(rec)] == ["linear", "relu"]


def test_auto_backend_needs_a_profiler(monkeypatch):
    for name in (
        "NVTX_INJECTION64_PATH",
        "NVTX_INJECTION32_PATH",
        "NVTX_DISABLE",
        "DLPROF_DISABLE",
        "DLPROF_FORCE_NVTX",
    ):
        monkeypatch.delenv(name, raising=False)
    assert NvtxBackend().enabled is False
    monkeypatch.setenv("NVTX_INJECTION64_PATH", "/opt/nsys/libToolsInjection64.so")
    assert NvtxBackend().enabled is True
    monkeypatch.setenv("DLPROF_DISABLE", "1")
    assert NvtxBackend().enabled is False


# ---------------------------------------------------------------------------------------------- engine

DLPROF_18_DETAIL_COLUMNS = [  # dlprof_detailed.csv of DLProf 1.8 (reference/dlprof_outputs.md 4.2)
    "Op ID",
    "Op Name",
    "Direction",
    "Op Type",
    "No. Calls",
    "TC Eligible",
    "Using TC",
    "Total CPU Time (ns)",
    "Avg. CPU Time (ns)",
    "Min CPU Time (ns)",
    "Max CPU Time (ns)",
    "Total GPU Time (ns)",
    "Avg. GPU Time (ns)",
    "Min GPU Time (ns)",
    "Max GPU Time (ns)",
    "Total CPU Overhead (ns)",
    "Avg. CPU Overhead (ns)",
    "Min CPU Overhead (ns)",
    "Max CPU Overhead (ns)",
    "Total GPU Idle (ns)",
    "Avg. GPU Idle (ns)",
    "Min GPU Idle (ns)",
    "Max GPU Idle (ns)",
    "Data Type",
    "Stack Trace",
]
OLD_STACK = "/<module>/Net::_call_impl/Net::forward/Conv2d::_call_impl(2)/Conv2d::forward/conv2d"
NEW_STACK = "/<module>/main/model/encoder/layers.1/linear1/linear"


def _tensor(shape, dtype="float16"):
    return {"name": "", "type": "tensor", "shape": tuple(shape), "dtype": dtype}


def marker_profile(path: Path) -> Path:
    """Old (nvidia_dlprof_pytorch_nvtx) and new (attribute path) markers with hand-written texts.

    main thread: [0, 1000) old conv2d marker set -> kernel [60, 260)
                 [2000, 3000) new linear call, batch 8, callid 12 -> kernel [2100, 2300)
                 [3200, 3400) Optimizer.step#SGD.step: the end of iteration 0 (so the two linear calls are
                 one op called twice, once per iteration, not two ops of one iteration)
                 [4000, 5000) the same call site, batch 4, callid 14 -> kernel [4100, 4200)
    autograd thread: the backward of callid 12, AddmmBackward0 [6000, 6500) and TBackward0 [7000, 7200),
                 one backward call (callid 20), each node inside its trace marker."""
    from tests.nsys_builder import NsysExport

    exp = NsysExport(schema="2022.4")
    exp.add_gpu(device_id=0)
    main = exp.add_thread(pid=100, tid=100, name="python", process_name="python")
    grad = exp.add_thread(pid=100, tid=101, name="pt_autograd_0")
    exp.push_pop(main, 0, 1000, repr({"traceMarker": ["train.py:57", "model.py:30"], "funcStack": OLD_STACK}))
    exp.push_pop(
        main,
        20,
        980,
        repr(
            {
                "mod": "torch.nn.functional",
                "op": "conv2d",
                "callid": 1,
                "args": [_tensor((8, 3, 64, 64)), _tensor((16, 3, 3, 3))],
            }
        ),
    )
    exp.launch(main, 40, 50, 60, 260, kernel="volta_fp16_s884cudnn_fp16_128x128_ldg8_relu_f2f_exp_small_nhwc_tn_v1")
    modules = [
        ("model", "TinyTransformer"),
        ("encoder", "TransformerEncoder"),
        ("layers.1", "TransformerEncoderLayer"),
        ("linear1", "Linear"),
    ]
    trace = repr({"traceMarker": ["train.py:9", "model.py:20"], "funcStack": NEW_STACK, "modules": modules})
    exp.push_pop(main, 3200, 3400, "Optimizer.step#SGD.step")
    for start, callid, batch in ((2000, 12, 8), (4000, 14, 4)):
        exp.push_pop(main, start, start + 1000, trace)
        exp.push_pop(
            main,
            start + 10,
            start + 990,
            repr(
                {
                    "mod": "torch.nn.functional",
                    "op": "linear",
                    "callid": callid,
                    "dir": "fprop",
                    "args": [_tensor((batch, 256)), _tensor((64, 256)), _tensor((64,))],
                }
            ),
        )
        exp.launch(
            main, start + 20, start + 30, start + 100, start + 100 + 200 // (8 // batch), kernel="volta_sgemm_128x64_nn"
        )
    for start, end, node in ((6000, 6500, "AddmmBackward0"), (7000, 7200, "TBackward0")):
        exp.push_pop(grad, start, end, trace)
        exp.push_pop(
            grad,
            start + 10,
            end - 10,
            repr(
                {
                    "mod": "torch.nn.functional",
                    "op": "linear",
                    "callid": 20,
                    "dir": "bprop",
                    "fwdCallid": 12,
                    "node": node,
                    "args": [_tensor((8, 256)), _tensor((64, 256)), _tensor((64,))],
                }
            ),
        )
    return exp.write(path)


@pytest.mark.slow
def test_engine_reads_old_and_new_markers(tmp_path):
    """Old funcStacks keep their DLProf names; attribute paths become names as they are; the backward
    nodes of one call carry what the engine needs to count one bprop call: (pid, callid) = (100, 20)."""
    from tests.analysis import analyze

    a = analyze(marker_profile(tmp_path / "p.sqlite"))
    old = "/module/Net::_call_impl/Net::forward/Conv2d::_call_impl[2]/Conv2d::forward/conv2d"
    new = "/module/main/model/encoder/layers.1/linear1/linear"
    assert a.op_names() == {old, new}
    assert a.op(old)["op_type"] == "conv2d" and a.op(new, "fprop")["op_type"] == "linear"
    assert a.op(new, "bprop")["op_type"] == "linear"
    info, ranges = a.corr.range_info, a.trace.ranges
    bprop = (info["direction"] == "bprop").to_numpy()
    assert info["callid"].to_numpy()[bprop].tolist() == [20, 20]
    assert info["fwd_callid"].to_numpy()[bprop].tolist() == [12, 12]
    assert ranges["pid"].to_numpy()[bprop].tolist() == [100, 100]


@pytest.mark.slow
def test_input_shapes_in_detailed_report_and_viewer(tmp_path):
    """Input Shapes: the shapes of each op's first call, the last column of the detailed report (DLProf 1.8's
    columns unchanged before it) and a column of the viewer's ops table."""
    import csv

    from werkzeug.test import Client

    from dlprof_plugin.viewer import build_app
    from tests.profiles import run_dlprof

    export = marker_profile(tmp_path / "p.sqlite")
    out = tmp_path / "out"
    run_dlprof(f"--database={export}", f"--output_path={out}", "--reports=detail", "--formats=csv,json")
    rows = list(csv.reader((out / "dlprof_detailed.csv").open()))
    assert rows[1] == DLPROF_18_DETAIL_COLUMNS + ["Input Shapes", "FLOPs per Call", "Achieved TFLOP/s"]
    table = {(r[1], r[2]): dict(zip(rows[1], r)) for r in rows[2:]}
    linear = "<N:8, K:256>; <M:64, K:256>; <64>"  # the first call's (batch 8), not the second's (batch 4)
    expected = {
        (
            "/module/Net::_call_impl/Net::forward/Conv2d::_call_impl[2]/Conv2d::forward/conv2d",
            "fprop",
        ): "<N:8, C:3, H:64, W:64>; <K:16, C:3, R:3, S:3>",
        ("/module/main/model/encoder/layers.1/linear1/linear", "fprop"): linear,
        ("/module/main/model/encoder/layers.1/linear1/linear", "bprop"): linear,
    }
    assert {k: v["Input Shapes"] for k, v in table.items()} == expected
    assert table[("/module/main/model/encoder/layers.1/linear1/linear", "fprop")]["No. Calls"] == "2"
    doc = json.loads((out / "dlprof_detailed.json").read_text())
    assert json.dumps(doc).count(linear) == 2  # the JSON report carries the column too
    # the viewer's ops table: the same values, sortable and filterable
    client = Client(build_app([str(out / "dlprof_dldb.sqlite")]))

    def table_rows(**params):
        reply = client.get("/data/plugin/dlprof/table/ops", query_string=dict(run="dlprof_dldb", limit=100, **params))
        assert reply.status_code == 200, reply.get_data()[:300]
        body = json.loads(reply.get_data())
        keys = [c["key"] for c in body["columns"]]
        assert "input_shapes" in keys
        return [dict(zip(keys, r)) for r in body["rows"]]

    assert {(r["op_name"], r["direction"]): r["input_shapes"] for r in table_rows()} == expected
    by_shape = [r["input_shapes"] for r in table_rows(sort="input_shapes", order="asc")]
    assert by_shape == sorted(expected.values())
    assert [r["op_name"] for r in table_rows(**{"col.input_shapes": "K:16"})] == [
        "/module/Net::_call_impl/Net::forward/Conv2d::_call_impl[2]/Conv2d::forward/conv2d"
    ]


# ---------------------------------------------------------------------------------------------- nsys

NSYS_TIMEOUT = 180


def _kill_nsys_agents(frontend_pid: int) -> None:
    """Kill the agent of our own nsys session (it outlives a killed front-end)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"--start-agent" in args and any(
            a.startswith(b"--session-name=") and a.endswith(b"-%d" % frontend_pid) for a in args
        ):
            try:
                os.kill(int(entry.name), 9)
            except OSError:
                pass


def _nsys_profile(tmp_path: Path, script: Path, *args: str) -> tuple[Path, str]:
    """Run ``python script args`` under Nsight Systems with dlprof's startup hook in its environment (as
    ``dlprof python script`` runs it: an unmodified script is annotated, one calling init() is annotated
    once); returns the SQLite export and the script's stdout.

    ``--cpuctxsw=none``: on this container nsys 2022.4 often hangs after the target exits while it
    finishes CPU context-switch tracing (the agent spins, the report is never written); without that
    trace it finishes in seconds. NVTX and CUDA tracing are unaffected."""
    from dlprof_profiler.capture import torch_startup

    nsys = shutil.which("nsys")
    if nsys is None:
        pytest.skip("nsys not on PATH")
    out = tmp_path / "rep"
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    for name in ("NVTX_DISABLE", "DLPROF_DISABLE"):
        env.pop(name, None)
    env = torch_startup.environment(init=torch_startup.init_config("auto"), base=env)
    cmd = [
        nsys,
        "profile",
        "-t",
        "cuda,nvtx",
        "-s",
        "none",
        "--cpuctxsw=none",
        "--export=sqlite",
        "-o",
        str(out),
        sys.executable,
        str(script),
        *args,
    ]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = proc.communicate(timeout=NSYS_TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        _kill_nsys_agents(proc.pid)
        pytest.fail("nsys profile did not finish within %d s" % NSYS_TIMEOUT)
    db = tmp_path / "rep.sqlite"
    assert proc.returncode == 0 and db.exists(), stdout[-2000:] + stderr[-2000:]
    assert "startup hook" not in stderr, stderr[-2000:]  # no warning: the hook annotated torch
    return db, stdout


@pytest.fixture(scope="module")
def nsys_capture(tmp_path_factory) -> Path:
    """The example run once under Nsight Systems, exported to SQLite."""
    return _nsys_profile(tmp_path_factory.mktemp("nsys"), EXAMPLE, "--iterations", "3")[0]


@pytest.mark.slow
@pytest.mark.nsys
def test_example_under_nsys(nsys_capture):
    """The unmodified example, annotated by the startup hook alone."""
    db = nsys_capture
    con = sqlite3.connect(str(db))
    rows = con.execute(
        "SELECT n.start, n.end, n.globalTid, coalesce(s.value, n.text) FROM NVTX_EVENTS n "
        "LEFT JOIN StringIds s ON s.id = n.textId WHERE n.eventType = 59 ORDER BY n.start"
    ).fetchall()
    con.close()
    texts = [r[3] for r in rows if r[3]]
    traces = [ast.literal_eval(t) for t in texts if t.startswith("{'traceMarker'")]
    args = [ast.literal_eval(t) for t in texts if t.startswith("{'mod'") and "'op'" in t]
    cfgs = [ast.literal_eval(t)["model_config"] for t in texts if t.startswith("{'model_config'")]
    assert traces and args and cfgs
    example = str(EXAMPLE)
    convs = [a for a in args if a["op"] == "conv2d" and a["dir"] == "fprop"]
    assert len(convs) == 6  # 3 iterations x 2 convolutions
    assert convs[0]["args"][0] == {"name": "", "type": "tensor", "shape": (8, 3, 32, 32), "dtype": "float32"}
    assert convs[0]["args"][1]["shape"] == (8, 3, 3, 3)
    stacks = {t["funcStack"] for t in traces}
    assert "/<module>/main/train/model/conv1/conv2d" in stacks and "/<module>/main/train/model/conv2/conv2d" in stacks
    conv_trace = next(t for t in traces if t["funcStack"].endswith("/conv2d"))
    assert conv_trace["traceMarker"] and all(f.startswith(example + ":") for f in conv_trace["traceMarker"])
    fwd_ids = {a["callid"] for a in args if a["dir"] == "fprop"}
    bwd = [a for a in args if a["dir"] == "bprop"]
    assert bwd and all(b["fwdCallid"] in fwd_ids for b in bwd)
    assert {b["op"] for b in bwd} >= {"conv2d", "linear", "relu", "max_pool2d", "cross_entropy"}
    assert texts.count("Optimizer.step#SGD.step") == 3
    assert "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__" in texts
    assert cfgs[-1]["batch_size"] == 8 and cfgs[-1]["torch_version"] == torch.__version__


@pytest.mark.slow
@pytest.mark.nsys
def test_example_under_nsys_detail_report(nsys_capture, tmp_path):
    """Engine-level check: `dlprof --database` on the capture lists our ops in the detail report."""
    try:
        import dlprof_profiler.run.single  # noqa: F401
        from dlprof_profiler.cli.main import main as dlprof_main
    except Exception as exc:  # the engine is written separately
        pytest.skip("dlprof_profiler.run.single does not import: %s" % exc)
    import csv

    db = nsys_capture
    out = tmp_path / "out"
    code = dlprof_main(
        ["--database=%s" % db, "--output_path=%s" % out, "--reports=detail", "--mode=pytorch", "--force=true"]
    )
    assert code == 0
    rows = list(csv.reader((out / "dlprof_detailed.csv").open()))
    header = next(i for i, r in enumerate(rows) if r and r[0] == "Op ID")
    table = [dict(zip(rows[header], r)) for r in rows[header + 1 :] if len(r) == len(rows[header])]
    by_type = {}
    for r in table:
        by_type.setdefault((r["Op Type"], r["Direction"]), []).append(r)
    for op in ("conv2d", "linear", "relu", "max_pool2d", "cross_entropy"):
        assert (op, "fprop") in by_type and (op, "bprop") in by_type, op
    conv = by_type[("conv2d", "fprop")]
    assert {r["Op Name"] for r in conv} == {
        "/module/main/train/model/conv1/conv2d",
        "/module/main/train/model/conv2/conv2d",
    }
    assert all(r["Data Type"] == "float32" for r in conv)
    assert all(str(EXAMPLE) in r["Stack Trace"] for r in conv)


# ---------------------------------------------------------------------------------------------- real models, nsys

MODELS = ROOT / "tests" / "torch_models_train.py"


@pytest.fixture(scope="module")
def models_capture(tmp_path_factory):
    """tests/torch_models_train.py (a 2-layer TransformerEncoder with AdamW, a Sequential of two Linear with
    SGD and clip_grad_norm_, a DataLoader with one forked worker) under Nsight Systems: the export, what the
    worker said, the main pid, and the engine's outputs of the export."""
    from tests.profiles import run_dlprof

    tmp_path = tmp_path_factory.mktemp("models")
    report = tmp_path / "worker.txt"
    db, stdout = _nsys_profile(tmp_path, MODELS, "--iterations", "2", "--worker-report", str(report))
    out = tmp_path / "out"
    run_dlprof(f"--database={db}", f"--output_path={out}", "--reports=detail", "--mode=pytorch")
    main_pid = int(re.search(r"pid (\d+) annotations on", stdout).group(1))
    worker_pid, worker_active = (int(v) for v in report.read_text().split())
    return types.SimpleNamespace(db=db, out=out, main_pid=main_pid, worker_pid=worker_pid, worker_active=worker_active)


def _export_texts(db: Path) -> list:
    """(pid, text) of every push/pop range of the export, in start order."""
    con = sqlite3.connect(str(db))
    try:
        rows = con.execute(
            "SELECT n.globalTid, coalesce(s.value, n.text) FROM NVTX_EVENTS n LEFT JOIN StringIds s "
            "ON s.id = n.textId WHERE n.eventType = 59 ORDER BY n.start"
        ).fetchall()
    finally:
        con.close()
    return [((tid >> 24) & 0xFFFFFF, text) for tid, text in rows if text]


@pytest.mark.slow
@pytest.mark.nsys
def test_models_under_nsys_markers(models_capture):
    cap = models_capture
    texts = _export_texts(cap.db)
    # the forked DataLoader worker: inactive, and nothing of it in the capture
    assert cap.worker_pid != cap.main_pid and cap.worker_active == 0
    assert {pid for pid, _ in texts} == {cap.main_pid}
    stacks = {ast.literal_eval(t)["funcStack"] for _, t in texts if t.startswith("{'traceMarker'")}
    prefix = "/<module>/main/"
    for layer in (0, 1):
        for name in (
            "self_attn/multi_head_attention_forward",
            "linear1/linear",
            "linear2/linear",
            "norm1/layer_norm",
            "norm2/layer_norm",
        ):
            assert f"{prefix}model/encoder/layers.{layer}/{name}" in stacks
    assert {prefix + "seq/0/linear", prefix + "seq/1/linear", prefix + "model/head/linear"} <= stacks
    # foreach optimizers and clip_grad_norm_ are annotated inside their step / clip frames
    args = [ast.literal_eval(t) for _, t in texts if t.startswith("{'mod'") and "'op'" in t]
    ops_seen = {a["op"] for a in args}
    assert {
        "_foreach_lerp_",
        "_foreach_addcdiv_",
        "_foreach_add_",
        "_foreach_norm",
        "linalg_vector_norm",
        "linalg_matrix_norm",
    } <= ops_seen
    # one backward call id per forward call (one backward pass each), never a forward call id
    forward_ids = {a["callid"] for a in args if a["dir"] == "fprop"}
    per_call: dict = {}
    for a in args:
        if a["dir"] == "bprop":
            assert a["fwdCallid"] in forward_ids
            per_call.setdefault(a["fwdCallid"], set()).add(a["callid"])
    assert per_call and all(len(ids) == 1 for ids in per_call.values())
    assert not forward_ids & set().union(*per_call.values())
    linear_nodes = [
        a["node"] for a in args if a["dir"] == "bprop" and a["op"] == "linear" and len(a["args"][0]["shape"]) == 2
    ]  # the Sequential's 2-D linears, with the AccumulateGrad of their weight and bias
    assert linear_nodes and set(linear_nodes) == {"AddmmBackward0", "TBackward0", "AccumulateGrad"}
    assert linear_nodes.count("AccumulateGrad") == 2 * linear_nodes.count("AddmmBackward0")


def _detail_rows(out: Path) -> list:
    import csv

    rows = list(csv.reader((out / "dlprof_detailed.csv").open()))
    return [dict(zip(rows[1], r)) for r in rows[2:]]


@pytest.mark.nsys
def test_models_under_nsys_detail_report_and_viewer(models_capture):
    """The engine's op names on the real capture: every layer an op of its own, in both directions; shapes
    in the report's and the viewer's Input Shapes; foreach and linalg ops as op types."""
    from werkzeug.test import Client

    from dlprof_plugin.viewer import build_app

    table = _detail_rows(models_capture.out)
    linears = {r["Op Name"]: r for r in table if r["Op Type"] == "linear" and r["Direction"] == "fprop"}
    base = "/module/main/"
    assert set(linears) == {f"{base}model/encoder/layers.{i}/linear{n}/linear" for i in (0, 1) for n in (1, 2)} | {
        base + "model/head/linear",
        base + "seq/0/linear",
        base + "seq/1/linear",
    }
    assert {r["Op Name"] for r in table if r["Op Type"] == "linear" and r["Direction"] == "bprop"} == set(linears)
    # shapes: batch 4, sequence 5, d_model 16, feed-forward 32; Sequential 8 -> 8 -> 2 (DLProf labels 2-D linears)
    assert linears[base + "model/encoder/layers.0/linear1/linear"]["Input Shapes"] == "<4, 5, 16>; <32, 16>; <32>"
    assert linears[base + "model/encoder/layers.1/linear2/linear"]["Input Shapes"] == "<4, 5, 32>; <16, 32>; <16>"
    assert linears[base + "seq/0/linear"]["Input Shapes"] == "<N:4, K:8>; <M:8, K:8>; <8>"
    assert linears[base + "seq/1/linear"]["Input Shapes"] == "<N:4, K:8>; <M:2, K:8>; <2>"
    # the key node is AdamW's step (the first optimizer): the transformer runs once in each of its two
    # iterations (one op, two calls); the Sequential's two SGD steps both fall in the last iteration, so each
    # of its linears is two ops of one call (an op is the n-th call of a name within an iteration)
    fprop = [r for r in table if r["Op Type"] == "linear" and r["Direction"] == "fprop"]
    calls = sorted((r["Op Name"], r["No. Calls"]) for r in fprop)
    assert calls == sorted(
        [(f"{base}model/encoder/layers.{i}/linear{n}/linear", "2") for i in (0, 1) for n in (1, 2)]
        + [(base + "model/head/linear", "2")]
        + [(base + f"seq/{i}/linear", "1") for i in (0, 1) for _ in range(2)]
    )
    assert len({r["Op ID"] for r in fprop}) == len(fprop)
    assert all(r["Data Type"] == "float32" for r in fprop)
    types_seen = {r["Op Type"] for r in table}
    assert {"_foreach_lerp_", "_foreach_addcdiv_", "_foreach_norm", "linalg_vector_norm"} <= types_seen
    # the viewer's ops table shows the same shapes for every op
    client = Client(build_app([str(models_capture.out / "dlprof_dldb.sqlite")]))
    reply = client.get("/data/plugin/dlprof/table/ops", query_string={"run": "dlprof_dldb", "limit": 1000})
    body = json.loads(reply.get_data())
    keys = [c["key"] for c in body["columns"]]
    viewer = {r[keys.index("op_id")]: r[keys.index("input_shapes")] or "" for r in body["rows"]}
    assert viewer == {r["Op ID"]: r["Input Shapes"] for r in table}
