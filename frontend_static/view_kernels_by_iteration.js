// Kernels by Iteration: the iteration summary; selecting an iteration lists its kernel launches.

import {progress} from "./charts.js";
import {showKernel} from "./details.js";
import {card, h} from "./dom.js";
import {fmtNs, fmtNsExact, fmtOffsetNs, fmtPct} from "./format.js";
import {scope, state, update} from "./state.js";
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

/** Kernel launch tables: start times from the iteration's start, every nanosecond shown (so they order); the
 * absolute capture-clock times stay in the exports and the kernel details. */
const offset = (absoluteKey) => (v, row) => h("span", {title: `${fmtNsExact(v)} after the iteration's start; ${fmtNsExact(row[absoluteKey])} on the capture clock`}, fmtOffsetNs(v));
export const LAUNCH_TABLE = {
  renderers: {gpu_start_offset: offset("gpu_start"), api_start_offset: offset("api_start")},
  hidden: ["gpu_start", "api_start"],
  order: ["op_id", "op_name", "direction", "op_type", "kernel_name", "device_id", "gpu_start_offset", "gpu_duration", "api_start_offset"],
};

export function iterationTable(onSelect, opts = {}) {
  return new DataTable({route: "table/iterations", scope, exportName: "iterations", selectable: true, rowKey: "iteration",
    renderers: ITERATION_RENDERERS, hidden: ITERATION_HIDDEN, onSelect, pageSize: 10, ...opts});
}

export function mount(el) {
  const its = card("Iterations", {wide: true, id: "iterations-table", tooltip: "Per iteration: start, duration, kernel launches and the average kernel time per GPU. Select an iteration to list its kernels."});
  const ks = card("Kernels", {wide: true, id: "iteration-kernels", tooltip: "Kernel launches of the selected iteration, in launch order."});
  const kernels = new DataTable({route: "table/iteration_kernels", scope, extra: null, exportName: "iteration_kernels",
    selectable: true, emptyText: "Select an iteration above to list its kernels.", onSelect: (row, t) => showKernel(row, t.columns), ...LAUNCH_TABLE});
  const choose = (iteration) => {
    ks.card.querySelector(".card-title").firstChild.textContent = `Kernels of iteration ${iteration}`;
    kernels.setExtra({iteration});
    update({iteration});
  };
  const iterations = iterationTable((row) => choose(row.iteration));
  if (state.iteration !== null) {
    iterations.selectedKey = state.iteration;
    choose(state.iteration);
  }
  its.body.appendChild(iterations.el);
  ks.body.appendChild(kernels.el);
  el.append(its.card, ks.card);
}
