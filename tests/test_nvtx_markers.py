"""Range texts' per-call fields: the vectorized parsing gives exactly what the grammar's regular
expressions (nvtx_markers._PT_FIELDS and the seq / op_id patterns, run by Arrow's RE2) give."""

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from dlprof_profiler.engine import markers as nm

TEXTS = [
    "aten::mm, seq = 1, op_id = 2",
    "aten::mm, op_id = 2",
    "aten::mm, seq = -3",
    "x, seq = , seq = 4",
    "aten::add, seq = 1\nmore, op_id = 3",
    "multi\nline, seq = 5",
    "trailing, seq = 1\n",
    "a, sizes = [[1, 2], [3]], op_id = 4",
    "b, input_op_ids = [1, 2]",
    "aten::relu, seq = 007, op_id = 1",
    "ProfilerStep#3",
    "Optimizer.step#SGD.step, op_id = 0",
    "",
    "é, seq = 5, op_id = 6",
    "aten::mm, seq = x, op_id = 7",
    "aten::mm, seq = --1",
    "aten::mm, seq = 1, seq = 2",
    "MulBackward0, seq = 12",
    "autograd::engine::evaluate_function: MulBackward0, op_id = 44",
    "aten::x, seq = 1234567890123456789012",
    "a, op_id = 1, seq = 2",
    "aten::mm, seq = 1, op_id = 2, sizes = []",
    "no fields, just, commas = 3",
    "{'mod': 'torch.nn.functional', 'op': 'conv2d', 'callid': 4, 'args': []}",
]


def regex_seq(texts: pa.Array, mask: np.ndarray) -> list:
    """The regex's seq, as an int where it fits int64."""
    found = pc.struct_field(pc.extract_regex(texts, r", seq = (?P<seq>-?\d+)"), [0]).to_pylist()
    return [int(v) if m and v is not None and abs(int(v)) < 10**18 else -1 for v, m in zip(found, mask)]


@pytest.mark.parametrize("repeat", [1, 50])
def test_call_fields_parse_as_the_regexes_do(repeat):
    texts = pa.array(TEXTS * repeat)
    stripped, marker_at = nm._strip_call_fields(texts)
    assert stripped.to_pylist() == pc.replace_substring_regex(texts, nm._PT_FIELDS, "").to_pylist()
    for marker, pos in marker_at.items():
        assert pos.tolist() == [t.encode().find(marker.encode()) for t in texts.to_pylist()]
    plain = ~np.asarray(pc.starts_with(texts, "{").to_numpy(zero_copy_only=False), dtype=bool)
    has, seq = nm._int_fields(texts, marker_at, plain)
    expected_has = (
        np.asarray(
            pc.match_substring_regex(texts, r", (?:seq|op_id) = -?\d+").to_numpy(zero_copy_only=False), dtype=bool
        )
        & plain
    )
    assert has.tolist() == expected_has.tolist()
    assert seq.tolist() == regex_seq(texts, has)


def test_seq_too_long_for_int64_is_no_seq():
    """A seq of more digits than int64 holds is no seq (it used to stop the run with an Arrow error)."""
    texts = pa.array(
        [
            "aten::x, seq = 1234567890123456789012",
            "aten::y, seq = , seq = 99999999999999999999",
            "aten::z, seq = 999999999999999999, op_id = 1",
        ]
    )
    _, marker_at = nm._strip_call_fields(texts)
    has, seq = nm._int_fields(texts, marker_at, np.ones(3, dtype=bool))
    assert has.tolist() == [True, True, True]
    assert seq.tolist() == [-1, -1, 999999999999999999]


def test_classification_of_per_call_fields():
    info = nm.classify_ranges(pa.array(TEXTS), np.array(["default"] * len(TEXTS), dtype=object))
    by_text = dict(zip(TEXTS, info.itertuples()))
    assert by_text["aten::mm, seq = 1, op_id = 2"].label == "aten::mm"
    assert by_text["aten::mm, seq = 1, op_id = 2"].seq == 1
    assert by_text["aten::relu, seq = 007, op_id = 1"].seq == 7
    assert by_text["x, seq = , seq = 4"].seq == 4 and by_text["x, seq = , seq = 4"].label == "x"
    assert by_text["aten::mm, seq = -3"].seq == -3
    assert by_text["multi\nline, seq = 5"].label == "multi\nline"
    assert by_text["aten::add, seq = 1\nmore, op_id = 3"].label == "aten::add, seq = 1\nmore"
    assert by_text["MulBackward0, seq = 12"].backward
    assert by_text["a, sizes = [[1, 2], [3]], op_id = 4"].input_shapes == "<1, 2>; <3>"
    assert by_text["ProfilerStep#3"].kind == nm.SCOPE
    assert by_text["Optimizer.step#SGD.step, op_id = 0"].kind == nm.SCOPE
    # equal shared parts get equal codes, whatever their per-call fields
    assert by_text["aten::mm, seq = 1, op_id = 2"].text_code == by_text["aten::mm, op_id = 2"].text_code


# ---------------------------------------------------------------------------- the classification's outcome
# correlate.classify_trace classifies a trace's ranges in one batch, store.model.StoreAnalysis.classify the
# store's parts batch by batch: both through RangeClassifier.

CLASSIFIED = [
    ("{'model_config': {'batch_size': 8}}", "default"),
    ("aten::mm, seq = 1, op_id = 2", "default"),
    ("{'model_config': {'batch_size': 16, 'lr': 0.1}}", "default"),
    ("Conv2D: model/conv1/Conv2D", "default"),
    ("dataloader", "default"),
]


def _classified(mode, batches):
    classifier = nm.RangeClassifier(mode)
    infos = [
        classifier.classify(pa.array([t for t, _ in b], pa.string()), np.array([d for _, d in b])) for b in batches
    ]
    return infos, classifier.outcome()


@pytest.mark.parametrize("split", [1, 2, 5])
def test_the_classification_does_not_depend_on_the_batches(split):
    whole, outcome = _classified(None, [CLASSIFIED])
    parts, split_outcome = _classified(None, [CLASSIFIED[i : i + split] for i in range(0, len(CLASSIFIED), split)])
    assert split_outcome == outcome
    for column in ("kind", "label", "op_type", "dataloader"):
        assert np.concatenate([p[column].to_numpy() for p in parts]).tolist() == whole[0][column].tolist()
    # PyTorch markers come first; the later config marker's entries win
    assert outcome == ("pytorch", "pytorch", {"batch_size": 16, "lr": 0.1})


def test_the_mode_follows_the_markers_present():
    tf = [("Conv2D: model/conv1/Conv2D", "default")]
    assert _classified(None, [tf])[1] == ("tensorflow2", "tensorflow", {})
    assert _classified(None, [[("step", "default")]])[1] == ("nvtx", None, {})
    # a mode given reads only its markers: TensorFlow texts are scopes under pytorch
    infos, outcome = _classified("pytorch", [tf])
    assert outcome == ("pytorch", "pytorch", {}) and infos[0]["kind"].tolist() == [nm.SCOPE]


def test_without_ranges_or_in_simple_mode_there_is_no_op_analysis():
    assert _classified(None, [[]])[1] == ("simple", None, {})
    assert _classified("pytorch", [[], []])[1] == ("pytorch", None, {})
    infos, outcome = _classified("simple", [CLASSIFIED])
    assert outcome == ("simple", None, {})  # config markers too are read only with op analysis
    assert nm.PT_OP not in infos[0]["kind"].tolist() and infos[0]["dataloader"].tolist()[-1]
