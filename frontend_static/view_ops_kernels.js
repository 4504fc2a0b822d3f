// Ops and Kernels: the ops table; selecting an op fills its kernels table (and the details pane).

import {showKernel, showOp} from "./details.js";
import {card} from "./dom.js";
import {scope} from "./state.js";
import {DataTable} from "./table.js";

export function mount(el) {
  const ops = card("Ops", {wide: true, id: "ops", tooltip: "One row per op with calls in this aggregation. Select an op to list its kernels."});
  const kernels = card("Kernels", {wide: true, id: "op-kernels", tooltip: "One row per kernel name launched by the selected op."});
  const kernelTable = new DataTable({route: "table/kernels", scope, extra: null, exportName: "kernels", selectable: true, rowKey: "kernel_name",
    emptyText: "Select an op above to list its kernels.", onSelect: (row, t) => showKernel(row, t.columns)});
  const opTable = new DataTable({route: "table/ops", scope, exportName: "ops", selectable: true, rowKey: "op_index",
    onSelect: (row) => {
      kernels.card.querySelector(".card-title").firstChild.textContent = `Kernels of ${row.op_id || row.op_name}`;
      kernelTable.setExtra({op_index: row.op_index});
      showOp(row.op_index, {withKernels: false});
    }});
  ops.body.appendChild(opTable.el);
  kernels.body.appendChild(kernelTable.el);
  el.append(ops.card, kernels.card);
}
