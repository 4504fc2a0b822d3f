// The details pane: op details (every statistic, data type, stack trace, its kernels) and kernel details.

import {tryGet} from "./api.js";
import {card, clear, h, loading, placeholder} from "./dom.js";
import {fmtBool, fmtInt, fmtNs, fmtNsExact, formatCell} from "./format.js";
import {definition} from "./metrics.js";
import {isPyTorch, scope} from "./state.js";
import {DataTable, collapsible, displayLabel} from "./table.js";

let pane = null;
let opSlot = null;
let kernelSlot = null;
let seq = 0;

export function initDetails(el) {
  pane = el;
  clearDetails();
}

export function clearDetails() {
  if (!pane) return;
  seq += 1;
  clear(pane);
  pane.hidden = true;
}

function ensureLayout() {
  if (opSlot && pane.contains(opSlot)) return;
  clear(pane);
  const close = h("button", {type: "button", class: "icon-button", "aria-label": "Close details", title: "Close details", onClick: clearDetails}, "×");
  opSlot = h("div", {class: "details-op"});
  kernelSlot = h("div", {class: "details-kernel"});
  pane.append(h("div", {class: "details-head"}, h("h2", {}, "Details"), close), h("div", {class: "details-grid"}, opSlot, kernelSlot));
}

const STAT_ROWS = [
  ["CPU Time", "cpu", "cpu_time"],
  ["GPU Time", "gpu", "gpu_time"],
  ["CPU Overhead", "overhead", "cpu_overhead"],
  ["GPU Idle", "idle", "gpu_idle"],
];

function statsTable(op) {
  const cell = (v) => h("td", {class: "num", title: fmtNsExact(v)}, fmtNs(v));
  return h("table", {class: "kv-table stats"},
    h("thead", {}, h("tr", {}, h("th", {}, ""), ["Total", "Average", "Minimum", "Maximum"].map((t) => h("th", {class: "num"}, t)))),
    h("tbody", {}, STAT_ROWS.map(([label, prefix, def]) => h("tr", {},
      h("th", {scope: "row", title: definition(def)}, label),
      cell(op[`${prefix}_total`]), cell(op[`${prefix}_avg`]), cell(op[`${prefix}_min`]), cell(op[`${prefix}_max`])))));
}

function field(label, value, {title = "", key} = {}) {
  return [h("dt", {title}, label), h("dd", {dataset: {field: key || ""}}, value)];
}

/** Show an op (by op_index). opts.withKernels: also list its kernels (when the view does not already). */
export async function showOp(opIndex, {withKernels = true} = {}) {
  if (!pane) return;
  const my = ++seq;
  pane.hidden = false;
  ensureLayout();
  clear(kernelSlot);
  clear(opSlot).appendChild(loading("Loading op…"));
  const op = await tryGet("op", {...scope(), op_index: opIndex});
  if (my !== seq) return;
  if (!op) {
    replaceWith(opSlot, placeholder("Could not load the op."));
    return;
  }
  const {card: c, body} = card(`Op: ${op.op_id || op.op_name || opIndex}`, {id: "op-details"});
  const dl = h("dl", {class: "kv"},
    field("Op ID", op.op_id, {key: "op_id"}),
    field("Op Name", h("span", {class: "mono"}, op.op_name ?? ""), {key: "op_name"}),
    "direction" in op && isPyTorch() ? field("Direction", op.direction || "—", {key: "direction"}) : null,
    field("Op Type", op.op_type, {key: "op_type"}),
    field("No. Calls", fmtInt(op.num_calls), {key: "num_calls"}),
    field("TC Eligible", fmtBool(op.tc_eligible), {key: "tc_eligible", title: definition("eligible_ops")}),
    field("Using TC", fmtBool(op.using_tc), {key: "using_tc", title: definition("using_tc_ops")}),
    op.data_type ? field("Data Type", op.data_type, {key: "data_type"}) : null,
    op.kernel_calls !== undefined ? field("Kernel Calls", fmtInt(op.kernel_calls), {key: "kernel_calls"}) : null);
  body.append(dl, statsTable(op));
  if (isPyTorch() && op.stack_trace) {
    body.append(h("h3", {class: "sub"}, "Stack Trace"), h("div", {class: "stack"}, collapsible(String(op.stack_trace), 120)));
  }
  if (withKernels) {
    const kernels = new DataTable({
      route: "table/kernels", scope, extra: {op_index: opIndex}, title: "Kernels of this op", selectable: true,
      exportName: `kernels_${op.op_id || opIndex}`, pageSize: 10, emptyText: "This op launched no kernels.", rowKey: "kernel_name",
      onSelect: (row, table) => showKernel(row, table.columns),
    });
    body.append(kernels.el);
  }
  replaceWith(opSlot, c);
}

function replaceWith(slot, node) {
  clear(slot).appendChild(node);
}

/** Show one kernel row (an object keyed by column) with the table's columns for labels and types. */
export function showKernel(row, columns) {
  if (!pane) return;
  pane.hidden = false;
  ensureLayout();
  const {card: c, body} = card(`Kernel: ${row.kernel_name || row.name || ""}`, {id: "kernel-details"});
  const dl = h("dl", {class: "kv"});
  for (const col of columns || []) {
    if (col.hidden && col.key !== "long_name") continue;
    const {text, title} = formatCell(col.type, row[col.key]);
    const long = text.length > 60;
    dl.append(h("dt", {title: col.tooltip || definition(col.key) || ""}, displayLabel(col)),
      h("dd", {title, dataset: {field: col.key}, class: long ? "mono wrap" : ""}, text));
  }
  body.appendChild(dl);
  replaceWith(kernelSlot, c);
  c.scrollIntoView({block: "nearest"});
}
