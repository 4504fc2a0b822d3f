"""Op names: scope path + `/` + label, the k-th sibling of a label suffixed `[k]`; a DLProf trace marker's
funcStack is the whole name (DESIGN.md "Correlation").

Names are built as integer codes into a table of distinct strings, level by level down the range trees,
so millions of instances share a few thousand string objects. Names are built one time segment at a time:
ranges that started in an earlier segment (context ranges) keep the names given to them then, and the
sibling counters of groups still open at a segment's end carry into the next segment.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from dlprof_profiler.engine import markers as nm
from dlprof_profiler.engine.structure import levels, nearest_flagged_ancestor
from dlprof_profiler.engine.trace import combined_codes, rank_within

_ANGLE = re.compile(r"<([^<>/]*)>")
_REPEAT = re.compile(r"\((\d+)\)(?=/|$)")


def func_stack_path(func_stack: str) -> str:
    """DLProf's op name from a funcStack: `<module>` -> `module`, `(N)` -> `[N]`."""
    text = _ANGLE.sub(r"\1", func_stack)
    text = _REPEAT.sub(r"[\1]", text)
    return text if text.startswith("/") else "/" + text


@dataclass
class NamingCarry:
    """What naming passes from one time segment to the next."""

    names: dict = field(default_factory=dict)  # range_id -> name of a naming range still open
    ends: dict = field(default_factory=dict)  # range_id -> its end
    counters: dict = field(default_factory=dict)  # sibling group key -> (siblings so far, group end)


def first_rows(codes: np.ndarray) -> np.ndarray:
    """Index of the first element of each code (codes are dense 0..m-1)."""
    first = np.full(int(codes.max()) + 1 if codes.size else 0, -1, dtype=np.int64)
    first[codes[::-1]] = np.arange(codes.size - 1, -1, -1)
    return first


def distinct_texts(codes: np.ndarray, text_of_row) -> np.ndarray:
    """Strings per dense code, computed from one representative row each."""
    out = np.empty(int(codes.max()) + 1 if codes.size else 0, dtype=object)
    out[:] = [text_of_row(i) for i in first_rows(codes)]
    return out


_STEP_COUNTER = re.compile(r"#\d+$")


def scope_labels(labels: np.ndarray, is_scope: np.ndarray) -> np.ndarray:
    """Scope labels without a trailing `#N` counter (ProfilerStep#5 -> ProfilerStep): the counter changes
    every iteration, so the names of the ops under it would never match across iterations."""
    if not is_scope.any():
        return labels
    out = labels.copy()
    out[is_scope] = nm.per_unique(labels[is_scope], lambda t: _STEP_COUNTER.sub("", t) if isinstance(t, str) else t)
    return out


def range_names(
    ranges: pd.DataFrame,
    info: pd.DataFrame,
    kinds: np.ndarray,
    parent: np.ndarray,
    depth: np.ndarray,
    op_root: np.ndarray,
    instance_range: np.ndarray,
    bounds: np.ndarray,
    context: np.ndarray,
    lo: int,
    hi: int,
    carry: NamingCarry,
) -> np.ndarray:
    """Full op names of the naming ranges (scopes outside op markers, instance ranges) of one segment;
    None for the others. Context ranges take their names from `carry`, which is updated for the next
    segment [lo, hi)."""
    n = len(ranges)
    names = np.full(n, None, dtype=object)
    if n == 0:
        return names
    range_id = ranges["range_id"].to_numpy(np.int64)
    is_scope = (kinds == nm.SCOPE) & (op_root < 0)
    naming = is_scope | instance_range
    scope_parent = nearest_flagged_ancestor(parent, depth, is_scope)
    trace_anc = nearest_flagged_ancestor(parent, depth, kinds == nm.DL_TRACE)
    label_code, label_text = _factorized_per_text(
        info, "label", is_scope, lambda labels, scope: scope_labels(labels, scope)
    )
    label_text = np.asarray(label_text, dtype=object)
    # DLProf markers: the trace marker around an argument marker names the op by its funcStack.
    fs_code, fs_text = _factorized_per_text(info, "func_stack")  # None -> -1
    stack = np.full(n, -1, dtype=np.int64)
    has_trace = (kinds == nm.DL_ARG) & (trace_anc >= 0)
    stack[has_trace] = fs_code[trace_anc[has_trace]]
    own_trace = kinds == nm.DL_TRACE
    stack[own_trace] = fs_code[own_trace]
    fs_text = np.asarray(fs_text, dtype=object)
    if fs_text.size:
        stack[(stack >= 0) & (fs_text[np.maximum(stack, 0)] == "")] = -1
    use_stack = (stack >= 0) & naming
    numbered = naming & ~use_stack & (kinds != nm.TF_OP) & ~context
    starts = ranges["start"].to_numpy(np.int64)
    ends = ranges["end"].to_numpy(np.int64)
    tids = ranges["global_tid"].to_numpy(np.int64)
    k = np.zeros(n, dtype=np.int64)
    rows = np.flatnonzero(numbered)
    if rows.size:
        k[rows] = _sibling_numbers(
            rows, scope_parent, range_id, ends, tids, starts, label_code, label_text, bounds, lo, hi, carry
        )
    # element of a name: a funcStack path, or a label with its [k] repeat number
    element_code = combined_codes(
        np.where(use_stack, stack, -1), np.where(use_stack, -1, label_code), np.where(use_stack, 0, k)
    )
    element_text = _element_texts(element_code, use_stack, stack, fs_text, label_code, label_text, k)
    # a label that begins with `/` (ONNX node names of TensorRT layers) joins its scope without a second one
    label_slash = np.array([str(t).startswith("/") for t in label_text] + [False], dtype=bool)
    slash_led = (
        use_stack
        | ((kinds == nm.TF_OP) & (scope_parent < 0))
        | (label_slash[np.where(label_code >= 0, label_code, len(label_text))] & ~use_stack)
    )
    name_code = np.full(n, -1, dtype=np.int64)
    preset_names: list[str] = []
    preset = np.flatnonzero(context & naming)
    for row in preset:
        name = carry.names.get(int(range_id[row]))
        if name is not None:
            name_code[row] = len(preset_names)
            preset_names.append(name)
    tables = [_objects(preset_names)]
    table_size = len(preset_names)
    for idx in levels(depth):
        idx = idx[naming[idx] & (name_code[idx] < 0)]
        if idx.size == 0:
            continue
        # a funcStack is the op's whole call hierarchy: the scope ranges around it (optimizer step,
        # DataLoader, ProfilerStep, module ranges, the user's own) do not enter its name
        sp = np.where(use_stack[idx], -1, scope_parent[idx])
        base = np.where(sp >= 0, name_code[np.maximum(sp, 0)], -1)
        pair = combined_codes(base, slash_led[idx], element_code[idx])
        first = first_rows(pair)
        table_so_far = np.concatenate(tables) if len(tables) > 1 else tables[0]
        tables = [table_so_far]
        parent_name = np.full(first.size, "", dtype=object)
        has_base = base[first] >= 0
        parent_name[has_base] = table_so_far[base[first][has_base]]
        separator = np.where(slash_led[idx[first]], "", "/").astype(object)
        # one string per distinct (parent, element): numpy's object + joins the Python strings
        tables.append(parent_name + separator + element_text[element_code[idx[first]]])
        name_code[idx] = table_size + pair
        table_size += first.size
    table_array = np.concatenate(tables) if len(tables) > 1 else tables[0]
    named = name_code >= 0
    names[named] = table_array[name_code[named]]
    # naming ranges still open at the segment's end keep their names for the next segments
    still_open = naming & named & (ends > hi)
    carry.names = {rid: name for rid, name in carry.names.items() if carry.ends.get(rid, hi + 1) > hi}
    carry.ends = {rid: end for rid, end in carry.ends.items() if end > hi}
    for row in np.flatnonzero(still_open):
        rid = int(range_id[row])
        carry.names[rid] = names[row]
        carry.ends[rid] = int(ends[row])
    return names


def _objects(values) -> np.ndarray:
    out = np.empty(len(values), dtype=object)
    out[:] = values
    return out


def _element_texts(element_code, use_stack, stack, fs_text, label_code, label_text, k) -> np.ndarray:
    """The text of each distinct name element (per code): a funcStack path, or a label with its `[k]`."""
    first = first_rows(element_code)
    out = np.empty(first.size, dtype=object)
    by_stack = use_stack[first]
    if by_stack.any():
        codes = stack[first[by_stack]]
        paths = _objects([func_stack_path(t) for t in fs_text])  # per distinct funcStack
        out[by_stack] = paths[codes]
    rows = first[~by_stack]
    if rows.size:
        text = _objects(label_text)[label_code[rows]]
        numbered = k[rows] > 0
        if numbered.any():
            label_str = _objects([str(t) for t in label_text])  # per distinct label
            at = rows[numbered]
            text[numbered] = label_str[label_code[at]] + "[" + k[at].astype(str).astype(object) + "]"
        out[~by_stack] = text
    return out


def _factorized_per_text(info: pd.DataFrame, column: str, flag: np.ndarray | None = None, transform=None):
    """pd.factorize(transform(info[column], flag)) for a column that is a function of the range's stripped
    text (`text_code`, from classification): computed on one row per (text, flag) and spread back, the same
    codes in the same order as over every row."""
    values = info[column].to_numpy(dtype=object)
    flag = np.zeros(len(values), dtype=bool) if flag is None else flag
    if "text_code" not in info:
        return pd.factorize(transform(values, flag) if transform else values)
    per_text = combined_codes(info["text_code"].to_numpy(), flag)
    first = first_rows(per_text)  # in row order: first appearances stay in order
    codes, uniques = pd.factorize(transform(values[first], flag[first]) if transform else values[first])
    return codes[per_text], uniques


def _sibling_numbers(
    rows, scope_parent, range_id, ends, tids, starts, label_code, label_text, bounds, lo, hi, carry: NamingCarry
) -> np.ndarray:
    """k of each numbered row: its rank among the siblings of its label inside one parent instance (or, at
    the top level, inside one iteration on its thread), counting siblings of earlier segments; 0 for k = 1."""
    top = scope_parent[rows] < 0
    iteration = np.searchsorted(bounds, starts[rows], side="right")
    parent_id = np.where(top, -1, range_id[np.maximum(scope_parent[rows], 0)])
    group = combined_codes(parent_id, np.where(top, tids[rows], -1), np.where(top, iteration, -1), label_code[rows])
    rank = rank_within(group, [rows, starts[rows]]) + 1
    first = first_rows(group)
    counts = np.bincount(group)
    lo_iteration = int(np.searchsorted(bounds, lo, side="right"))
    hi_iteration = int(np.searchsorted(bounds, hi, side="right"))
    g_top = top[first]
    g_sp = scope_parent[rows][first]
    g_iter = iteration[first]
    g_end = np.where(g_top, -1, ends[np.maximum(g_sp, 0)])
    g_pstart = np.where(g_top, hi, starts[np.maximum(g_sp, 0)])
    # groups that may have siblings in earlier segments, and groups that go on after this one
    looked_up = (
        (g_top & (g_iter == lo_iteration)) | (~g_top & (g_pstart < lo))
        if carry.counters
        else np.zeros(first.size, dtype=bool)
    )
    goes_on = np.where(g_top, g_iter >= hi_iteration, g_end > hi)
    wanted = np.flatnonzero(looked_up | goes_on)
    g_parent = parent_id[first]
    g_tid = tids[rows][first]
    g_label = label_code[rows][first]
    keys = {
        int(i): (
            int(g_parent[i]),
            int(g_tid[i]) if g_top[i] else -1,
            int(g_iter[i]) if g_top[i] else -1,
            label_text[g_label[i]],
        )
        for i in wanted
    }
    offset = np.zeros(first.size, dtype=np.int64)
    for i in np.flatnonzero(looked_up):
        offset[i] = carry.counters.get(keys[int(i)], (0, 0))[0]
    rank = rank + offset[group]
    counters = {
        key: value
        for key, value in carry.counters.items()
        if (value[1] > hi if key[0] >= 0 else key[2] >= hi_iteration)
    }
    for i in np.flatnonzero(goes_on):
        counters[keys[int(i)]] = (int(offset[i] + counts[i]), int(g_end[i]))
    carry.counters = counters
    return np.where(rank >= 2, rank, 0)


def group_prefix_codes(op_names) -> tuple[np.ndarray, list[str]]:
    """The interior nodes of the op-name tree above each op ('/a/b/c' -> '/', '/a/', '/a/b/'), as codes:
    (codes[level, op], -1 below the op's depth; the distinct node names). They depend only on the name up to
    its last '/', of which a profile has few even when its op names are 10^6 (every call its own op), so they
    are computed per distinct such folder, with Arrow's string kernels."""
    import pyarrow as pa
    import pyarrow.compute as pc

    names = np.asarray(op_names, dtype=object)
    try:
        text = pa.array(names, pa.string())
        if text.null_count:
            raise pa.ArrowInvalid("missing names")
    except (pa.ArrowInvalid, pa.ArrowTypeError):  # not all str
        text = pa.array([n if isinstance(n, str) else str(n) for n in names], pa.string())
    folder = pc.dictionary_encode(pc.replace_substring_regex(text, r"[^/]*$", ""))
    folder_codes = folder.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    parts = pc.split_pattern(folder.dictionary, "/")
    depth = np.maximum(pc.list_value_length(parts).to_numpy(zero_copy_only=False) - 1, 0)
    max_depth = int(depth.max()) if depth.size else 0
    per_level = []
    for level in range(max_depth):
        rows = np.flatnonzero(depth > level)
        head = pc.list_slice(parts.take(pa.array(rows)), 0, level + 1)
        per_level.append((rows, pc.binary_join_element_wise(pc.binary_join(head, "/"), "/", "")))
    if not per_level:
        return np.full((0, len(folder_codes)), -1, dtype=np.int64), []
    node_codes, node_names = pd.factorize(pa.concat_arrays([p for _, p in per_level]).to_numpy(zero_copy_only=False))
    codes = np.full((max_depth, len(folder.dictionary)), -1, dtype=np.int64)
    at = 0
    for level, (rows, prefixes) in enumerate(per_level):
        codes[level, rows] = node_codes[at : at + len(prefixes)]
        at += len(prefixes)
    return codes[:, folder_codes], list(node_names)
