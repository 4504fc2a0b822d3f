// Kernels by Iteration: the iteration summary; selecting an iteration lists its kernel launches.

import {progress} from "./charts.js";
import {showKernel} from "./details.js";
import {card} from "./dom.js";
import {fmtNs, fmtNsExact, fmtPct} from "./format.js";
import {scope} from "./state.js";
import {DataTable} from "./table.js";

const pick = (row, ...keys) => {
  for (const k of keys) if (row[k] !== undefined && row[k] !== null) return Number(row[k]);
  return NaN;
};

/** Cells for the per-GPU kernel time columns: the time, a bar and its percentage. */
export const ITERATION_RENDERERS = {
  kernel_time_per_gpu: (v, row) => {
    const dur = pick(row, "duration");
    const pct = dur > 0 ? (100 * Number(v)) / dur : 0;
    return progress(pct, `${fmtNs(v)} (${fmtPct(pct)})`, `${fmtNsExact(v)}: ${fmtPct(pct)} of the iteration's duration`);
  },
  tc_kernel_time_per_gpu: (v, row) => {
    const all = pick(row, "kernel_time_per_gpu");
    const pct = all > 0 ? (100 * Number(v)) / all : 0;
    return progress(pct, `${fmtNs(v)} (${fmtPct(pct)})`, `${fmtNsExact(v)}: ${fmtPct(pct)} of the iteration's kernel time`);
  },
};

/** The per-class time columns are in the Iterations view's bars (and in the exports); hidden here. */
const ITERATION_HIDDEN = ["end", "tc_time", "non_tc_time", "memory_time", "dataloader_time", "io_time", "cpu_time", "other_time"];

export function iterationTable(onSelect, opts = {}) {
  return new DataTable({route: "table/iterations", scope, exportName: "iterations", selectable: true, rowKey: "iteration",
    renderers: ITERATION_RENDERERS, hidden: ITERATION_HIDDEN, labels: {start: "Timestamp"}, onSelect, pageSize: 10, ...opts});
}

export function mount(el) {
  const its = card("Iterations", {wide: true, id: "iterations-table", tooltip: "Per iteration: start, duration, kernel launches and the average kernel time per GPU. Select an iteration to list its kernels."});
  const ks = card("Kernels", {wide: true, id: "iteration-kernels", tooltip: "Kernel launches of the selected iteration, in launch order."});
  const kernels = new DataTable({route: "table/iteration_kernels", scope, extra: null, exportName: "iteration_kernels",
    selectable: true, emptyText: "Select an iteration above to list its kernels.", onSelect: (row, t) => showKernel(row, t.columns)});
  const iterations = iterationTable((row) => {
    ks.card.querySelector(".card-title").firstChild.textContent = `Kernels of iteration ${row.iteration}`;
    kernels.setExtra({iteration: row.iteration});
  });
  its.body.appendChild(iterations.el);
  ks.body.appendChild(kernels.el);
  el.append(its.card, ks.card);
}
