// Kernels by Op: iteration -> its ops -> that op's kernels in that iteration.

import {showKernel, showOp} from "./details.js";
import {card} from "./dom.js";
import {scope, state, update} from "./state.js";
import {DataTable} from "./table.js";
import {LAUNCH_TABLE, iterationTable} from "./view_kernels_by_iteration.js";

/** The iteration and op kept in the URL are selected again when the view mounts. */
export const restoresSelection = true;

export function mount(el) {
  const its = card("Iterations", {wide: true, id: "kbo-iterations", tooltip: "Select an iteration to list its ops."});
  const ops = card("Ops", {wide: true, id: "kbo-ops", tooltip: "Ops with instances starting in the selected iteration, with their calls and time in it."});
  const ks = card("Kernels", {wide: true, id: "kbo-kernels", tooltip: "Kernel launches of the selected op in the selected iteration."});
  let iteration = null;
  const title = (c, text) => {
    c.card.querySelector(".card-title").firstChild.textContent = text;
  };
  const kernels = new DataTable({route: "table/iteration_op_kernels", scope, extra: null, exportName: "iteration_op_kernels",
    selectable: true, emptyText: "Select an op to list its kernels in the iteration.", onSelect: (row, t) => showKernel(row, t.columns), ...LAUNCH_TABLE});
  const chooseOp = (opIndex, label) => {
    title(ks, `Kernels of ${label} in iteration ${iteration}`);
    kernels.setExtra({iteration, op_index: opIndex});
    return showOp(opIndex, {withKernels: false});
  };
  const opTable = new DataTable({route: "table/iteration_ops", scope, extra: null, exportName: "iteration_ops", selectable: true,
    rowKey: "op_index", emptyText: "Select an iteration to list its ops.",
    onSelect: (row) => chooseOp(row.op_index, row.op_id || row.op_name)});
  const chooseIteration = (it) => {
    iteration = it;
    title(ops, `Ops of iteration ${iteration}`);
    title(ks, "Kernels");
    opTable.setExtra({iteration});
    kernels.setExtra(null, "Select an op to list its kernels in the iteration.");
    update({iteration});
  };
  const iterations = iterationTable((row) => chooseIteration(row.iteration), {exportName: "iterations"});
  if (state.iteration !== null) {
    const op = state.op;
    iterations.selectedKey = state.iteration;
    chooseIteration(state.iteration);
    if (op !== null) {
      opTable.selectedKey = op;
      chooseOp(op, `op ${op}`).then((o) => {
        if (o) title(ks, `Kernels of ${o.op_id || o.op_name} in iteration ${iteration}`);
      });
    }
  } else if (state.op !== null) {
    showOp(state.op, {withKernels: false});
  }
  its.body.appendChild(iterations.el);
  ops.body.appendChild(opTable.el);
  ks.body.appendChild(kernels.el);
  el.append(its.card, ops.card, ks.card);
}
