// The details pane: op details (every statistic, data type, stack trace, its GRAPHS node, its kernels) and
// kernel details, in a drawer on the right of the window: it opens where it is seen whatever the page's scroll,
// and nothing in it is wider than the drawer (wide tables scroll inside it).

import {tryGet} from "./api.js";
import {card, clear, h, loading, placeholder} from "./dom.js";
import {fmtBool, fmtInt, fmtNs, fmtNsExact, formatCell} from "./format.js";
import {term} from "./metrics.js";
import {isPyTorch, scope, state, update} from "./state.js";
import {DataTable, collapsible, columnLabelAttrs, copyText, displayLabel} from "./table.js";

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

const STAT_ROWS = [["cpu_time", "cpu"], ["gpu_time", "gpu"], ["cpu_overhead", "overhead"], ["gpu_idle", "idle"]];

function statsTable(op) {
  const cell = (v) => h("td", {class: "num", title: fmtNsExact(v)}, fmtNs(v));
  return h("table", {class: "kv-table stats"},
    h("thead", {}, h("tr", {}, h("th", {}, ""), ["stat_total", "stat_avg", "stat_min", "stat_max"].map((k) => term("th", k, {class: "num"})))),
    h("tbody", {}, STAT_ROWS.map(([key, prefix]) => h("tr", {},
      term("th", key, {scope: "row"}),
      cell(op[`${prefix}_total`]), cell(op[`${prefix}_avg`]), cell(op[`${prefix}_min`]), cell(op[`${prefix}_max`])))));
}

function field(key, value, opts = {}) {
  return [term("dt", key), h("dd", {dataset: {field: opts.field || key}}, value)];
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
    field("op_id", op.op_id),
    field("op_name", h("span", {class: "mono"}, op.op_name ?? "")),
    "direction" in op && isPyTorch() ? field("direction", op.direction || "—") : null,
    field("op_type", op.op_type),
    field("num_calls", fmtInt(op.num_calls)),
    field("tc_eligible", fmtBool(op.tc_eligible)),
    field("using_tc", fmtBool(op.using_tc)),
    op.data_type ? field("data_type", op.data_type) : null,
    op.kernel_calls !== undefined ? field("kernel_calls", fmtInt(op.kernel_calls)) : null,
    op.graph_node ? field("graph_node", graphNode(op.graph_node)) : null);
  body.append(dl, statsTable(op));
  if (isPyTorch() && op.stack_trace) {
    body.append(term("h3", "stack_trace", {class: "sub"}), h("div", {class: "stack"}, collapsible(String(op.stack_trace), 120)));
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
    dl.append(h("dt", columnLabelAttrs(col), displayLabel(col)),
      h("dd", {title, dataset: {field: col.key}, class: long ? "mono wrap" : ""}, text));
  }
  body.appendChild(dl);
  replaceWith(kernelSlot, c);
  c.scrollIntoView({block: "nearest"});
}
