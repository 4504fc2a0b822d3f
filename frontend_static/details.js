// The details pane: op details (every statistic, data type, stack trace, its GRAPHS node, its kernels) and
// kernel details, in a drawer on the right of the window: it opens where it is seen whatever the page's scroll,
// and nothing in it is wider than the drawer (wide tables scroll inside it).

import {tryGet} from "./api.js";
import {card, clear, h, loading, placeholder} from "./dom.js";
import {fmtBool, fmtInt, fmtNs, fmtNsExact, formatCell} from "./format.js";
import {definition} from "./metrics.js";
import {isPyTorch, scope, state, update} from "./state.js";
import {DataTable, collapsible, copyText, displayLabel} from "./table.js";

let pane = null;
let opSlot = null;
let kernelSlot = null;
let seq = 0;

export function initDetails(el) {
  pane = el;
  pane.setAttribute("role", "complementary");
  pane.addEventListener("keydown", (ev) => {
    if (ev.key === "Escape") clearDetails();
  });
  clearDetails();
}

export function clearDetails() {
  if (!pane) return;
  seq += 1;
  clear(pane);
  pane.hidden = true;
  document.documentElement.classList.remove("details-open");
  if (state.op !== null) update({op: null});
}

function open() {
  const wasHidden = pane.hidden;
  pane.hidden = false;
  document.documentElement.classList.add("details-open");
  if (wasHidden) pane.scrollTop = 0;
}

function ensureLayout() {
  if (opSlot && pane.contains(opSlot)) return;
  clear(pane);
  const close = h("button", {type: "button", class: "icon-button", "aria-label": "Close details", title: "Close details (Esc)", onClick: clearDetails}, "×");
  opSlot = h("div", {class: "details-op"});
  kernelSlot = h("div", {class: "details-kernel"});
  pane.append(h("div", {class: "details-head"}, h("h2", {tabindex: -1}, "Details"), close), h("div", {class: "details-grid"}, opSlot, kernelSlot));
}

/** The op's node in TensorBoard's GRAPHS tab, with a button copying the name (for GRAPHS' node search). */
function graphNode(name) {
  const status = h("span", {class: "muted copy-status", role: "status"});
  const copy = h("button", {type: "button", class: "secondary small copy-node", title: "Copy the node name (paste it in GRAPHS' “Search nodes”)",
    onClick: async () => {
      status.textContent = (await copyText(name)) ? "Copied" : "Could not copy";
    }}, "Copy");
  return h("span", {class: "graph-node"}, h("code", {class: "mono"}, name), " ", copy, " ", status);
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
  if (!pane) return null;
  const my = ++seq;
  open();
  ensureLayout();
  if (state.op !== opIndex) update({op: opIndex});
  clear(kernelSlot);
  clear(opSlot).appendChild(loading("Loading op…"));
  const op = await tryGet("op", {...scope(), op_index: opIndex});
  if (my !== seq) return null;
  if (!op) {
    replaceWith(opSlot, placeholder("Could not load the op."));
    return null;
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
    op.kernel_calls !== undefined ? field("Kernel Calls", fmtInt(op.kernel_calls), {key: "kernel_calls"}) : null,
    op.graph_node ? field("GRAPHS node", graphNode(op.graph_node), {key: "graph_node",
      title: "The op's node in TensorBoard's GRAPHS tab (its name scopes are the op name's / parts); choose the run's dlprof/op_time tag there to colour nodes by compute time."}) : null);
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
  return op;
}

function replaceWith(slot, node) {
  clear(slot).appendChild(node);
}

/** Show one kernel row (an object keyed by column) with the table's columns for labels and types. */
export function showKernel(row, columns) {
  if (!pane) return;
  open();
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
