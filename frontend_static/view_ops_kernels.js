// Ops and Kernels: the ops table; selecting an op fills its kernels table (and the details pane).

import {showKernel, showOp} from "./details.js";
import {card} from "./dom.js";
import {scope, state} from "./state.js";
import {DataTable} from "./table.js";

/** The op kept in the URL is selected again when the view mounts. */
export const restoresSelection = true;

// GPU time (the default sort) right after the op's identity and calls, so it is on screen without scrolling
// sideways; exports keep DLProf's column order.
export const OPS_ORDER = ["op_id", "op_name", "direction", "op_type", "num_calls", "gpu_total", "gpu_avg", "gpu_min", "gpu_max"];

export function mount(el) {
  const ops = card("Ops", {wide: true, id: "ops", tooltip: "One row per op with calls in this aggregation. Select an op to list its kernels."});
  const kernels = card("Kernels", {wide: true, id: "op-kernels", tooltip: "One row per kernel name launched by the selected op."});
  const kernelTable = new DataTable({route: "table/kernels", scope, extra: null, exportName: "kernels", selectable: true, rowKey: "kernel_name",
    emptyText: "Select an op above to list its kernels.", onSelect: (row, t) => showKernel(row, t.columns)});
  const choose = (opIndex, label) => {
    kernels.card.querySelector(".card-title").firstChild.textContent = `Kernels of ${label}`;
    kernelTable.setExtra({op_index: opIndex});
    showOp(opIndex, {withKernels: false});
  };
  const opTable = new DataTable({route: "table/ops", scope, exportName: "ops", selectable: true, rowKey: "op_index", order: OPS_ORDER,
    onSelect: (row) => choose(row.op_index, row.op_id || row.op_name)});
  if (state.op !== null) {
    const opIndex = state.op;
    opTable.selectedKey = opIndex;
    kernelTable.setExtra({op_index: opIndex});
    showOp(opIndex, {withKernels: false}).then((op) => {
      if (op) kernels.card.querySelector(".card-title").firstChild.textContent = `Kernels of ${op.op_id || op.op_name}`;
    });
  }
  ops.body.appendChild(opTable.el);
  kernels.body.appendChild(kernelTable.el);
  el.append(ops.card, kernels.card);
}
