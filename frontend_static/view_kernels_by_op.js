// Kernels by Op: iteration -> its ops -> that op's kernels in that iteration.

import {showKernel, showOp} from "./details.js";
import {card} from "./dom.js";
import {scope} from "./state.js";
import {DataTable} from "./table.js";
import {iterationTable} from "./view_kernels_by_iteration.js";

export function mount(el) {
  const its = card("Iterations", {wide: true, id: "kbo-iterations", tooltip: "Select an iteration to list its ops."});
  const ops = card("Ops", {wide: true, id: "kbo-ops", tooltip: "Ops with instances starting in the selected iteration, with their calls and time in it."});
  const ks = card("Kernels", {wide: true, id: "kbo-kernels", tooltip: "Kernel launches of the selected op in the selected iteration."});
  let iteration = null;
  const kernels = new DataTable({route: "table/iteration_op_kernels", scope, extra: null, exportName: "iteration_op_kernels",
    selectable: true, emptyText: "Select an op to list its kernels in the iteration.", onSelect: (row, t) => showKernel(row, t.columns)});
  const opTable = new DataTable({route: "table/iteration_ops", scope, extra: null, exportName: "iteration_ops", selectable: true,
    rowKey: "op_index", emptyText: "Select an iteration to list its ops.",
    onSelect: (row) => {
      ks.card.querySelector(".card-title").firstChild.textContent = `Kernels of ${row.op_id || row.op_name} in iteration ${iteration}`;
      kernels.setExtra({iteration, op_index: row.op_index});
      showOp(row.op_index, {withKernels: false});
    }});
  const iterations = iterationTable((row) => {
    iteration = row.iteration;
    ops.card.querySelector(".card-title").firstChild.textContent = `Ops of iteration ${iteration}`;
    ks.card.querySelector(".card-title").firstChild.textContent = "Kernels";
    opTable.setExtra({iteration});
    kernels.setExtra(null, "Select an op to list its kernels in the iteration.");
  }, {exportName: "iterations"});
  its.body.appendChild(iterations.el);
  ops.body.appendChild(opTable.el);
  ks.body.appendChild(kernels.el);
  el.append(its.card, ops.card, ks.card);
}
