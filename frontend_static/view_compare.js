// Compare: the selected run and aggregation (the navigation's) against a baseline: the run's own baseline when it
// was analysed with `dlprof --baseline` (kept in its database: the diff report's comparison), else one chosen here,
// another aggregation of the run or any run of the list (never an unrelated run by default). On top the headline
// figures (the diff summary) before / after / change, then per op (name, direction) and per kernel name their time
// in both and its change, largest change first: the rows of the diff report, computed by the same engine module on
// the server. A chosen baseline is kept in the URL (base_run, base_aggr); none there is the run's own.

import {getJSON, reportError} from "./api.js";
import {card, h, loading, placeholder, replace} from "./dom.js";
import {fmtInt, fmtNs, fmtNsExact, fmtPct} from "./format.js";
import {term} from "./metrics.js";
import {runLabel, runLabelOf, scope, state, update} from "./state.js";
import {DataTable} from "./table.js";

// which way is better for each headline figure (1: more is better, -1: less is better, 0: neither)
const BETTER = {avg_iteration_time: -1, gpu_utilization: 1, total_gpu_time: -1, kernel_gpu_time: -1, wall_time: 0,
  aggregated_iterations: 0, tc_utilization: 1};
// the term of each headline figure (the route's keys are the diff report's)
const TERM = {avg_iteration_time: "avg_iteration_time", gpu_utilization: "gpu_utilization", total_gpu_time: "total_gpu_time",
  kernel_gpu_time: "compute_kernel_time", wall_time: "wall_time", aggregated_iterations: "iter_aggregated",
  tc_utilization: "tc_utilization"};
const STORED = "";          // the baseline run's <select> value for the run's own baseline (dlprof --baseline)
const NONE = "__none__";    // nothing chosen yet

function figureText(row, value) {
  if (value === null || value === undefined) return "—";
  if (row.kind === "pct") return fmtPct(value);
  if (row.key === "aggregated_iterations") return fmtInt(value);
  return fmtNs(value);
}

function signed(text, value) {
  return Number(value) > 0 ? `+${text}` : text.replace(/^-/, "−");
}

function deltaText(row) {
  const v = row.delta;
  if (v === null || v === undefined) return "—";
  const text = row.kind === "pct" ? `${fmtPct(v).replace(" %", "")} pp` : figureText(row, v);
  return signed(text, v);
}

function tone(key, delta) {
  const way = BETTER[key] || 0;
  if (!way || !Number(delta)) return "";
  return way * Number(delta) > 0 ? "better" : "worse";
}

/** GPU time changes: less is better. */
function deltaCell(v) {
  if (v === null || v === undefined) return "—";
  const n = Number(v);
  return h("span", {class: ["delta", n < 0 ? "better" : n > 0 ? "worse" : ""], title: fmtNsExact(v)}, signed(fmtNs(v), n));
}

function pctCell(v) {
  if (v === null || v === undefined) return h("span", {class: "muted", title: "The baseline has no GPU time here"}, "new");
  const n = Number(v);
  return h("span", {class: ["delta", n < 0 ? "better" : n > 0 ? "worse" : ""]}, signed(fmtPct(v), n));
}

const RENDERERS = {delta: deltaCell, delta_pct: pctCell};
// the change next to the name; the figures it comes from after it
const ORDER = ["op_name", "kernel_name", "direction", "delta", "delta_pct", "gpu_time", "baseline_gpu_time", "presence", "calls", "baseline_calls"];

function aggrText(a) {
  const range = a.iter_start === a.iter_stop ? `iteration ${a.iter_start}` : `iterations ${a.iter_start}–${a.iter_stop}`;
  return `#${a.aggr_id} · ${range}${a.key_node ? ` · ${a.key_node}` : ""}`;
}

/** Whether the run keeps the baseline it was analysed with (`dlprof --baseline`). */
function hasStoredBaseline() {
  return state.aggregations.some((a) => a.baseline);
}

/** The baseline the view opens on: the URL's, else the run's own baseline, else the run's previous aggregation;
 * never an unrelated run. */
function defaultBaseline() {
  const fromUrl = state.base_run && state.runs.some((r) => r.run === state.base_run);
  if (fromUrl) return {base_run: state.base_run, base_aggr: state.base_aggr};
  if (hasStoredBaseline()) return {base_run: STORED, base_aggr: null};
  const earlier = state.aggregations.filter((a) => Number(a.aggr_id) < Number(state.aggr));
  if (earlier.length) return {base_run: state.run, base_aggr: String(earlier[earlier.length - 1].aggr_id)};
  return {base_run: NONE, base_aggr: null};
}

export function mount(el) {
  let alive = true;
  const runSelect = h("select", {id: "compare-base-run"});
  const aggrSelect = h("select", {id: "compare-base-aggr"});
  const aggrField = h("div", {class: "field"}, h("label", {for: "compare-base-aggr"}, "Baseline aggregation"), aggrSelect);
  const afterText = h("div", {class: "muted", id: "compare-after"});
  const table = h("div", {id: "compare-figures"});
  // the diff's headline figures head the view; what is compared with what just above them
  const summary = card("Change against the baseline", {wide: true, id: "compare-summary",
    tooltip: "The headline figures of the baseline and of the selected aggregation, and the change (after − baseline), as the diff report (dlprof --baseline) gives them. Total GPU Time (ops) is the sum of the ops' GPU time, so the op changes below add up to its change; Compute Kernel Time leaves memory operations out, so the kernel changes add up to its change."});
  summary.body.append(h("div", {class: "form-row compare-pick"},
    h("div", {class: "field"}, h("label", {for: "compare-base-run"}, "Baseline"), runSelect), aggrField), afterText, table);
  const opsCard = card("Ops", {wide: true, id: "compare-ops",
    tooltip: "Per op (name and direction): Total GPU Time in the selected aggregation and in the baseline, and the change, largest first. Ops of one side only count 0 on the other."});
  const kernelsCard = card("Kernels", {wide: true, id: "compare-kernels",
    tooltip: "Per compute kernel name (over every op launching it): launches and the sum of its durations in both, and the change, largest first."});
  el.append(summary.card, opsCard.card, kernelsCard.card);
  table.appendChild(loading());

  let tables = null;
  const baseline = () => (state.base_run ? {base_run: state.base_run, base_aggr: state.base_aggr} : {});
  // Answers can arrive out of order (the initial baseline's while the user already picked another): each
  // choice and each load takes a number, and only the newest one's answer is shown.
  let choice = 0;
  let loads = 0;
  let nothingChosen = false;

  function renderSummary(doc) {
    const rows = (doc.summary || []).map((r) => h("tr", {dataset: {key: r.key}},
      term("th", TERM[r.key] || r.key, {scope: "row"}),
      h("td", {class: "num", dataset: {field: "baseline"}, title: r.kind === "pct" ? "" : fmtNsExact(r.baseline)}, figureText(r, r.baseline)),
      h("td", {class: "num", dataset: {field: "after"}, title: r.kind === "pct" ? "" : fmtNsExact(r.after)}, figureText(r, r.after)),
      h("td", {class: ["num", "delta", tone(r.key, r.delta)], dataset: {field: "delta"}}, deltaText(r))));
    const side = (x) => `${x.stored ? x.source : `${runLabelOf(x.run)} · aggregation ${x.aggr}`}${x.iterations ? ` (iterations ${x.iterations[0]}–${x.iterations[1]} of ${x.iterations[2]})` : ""}`;
    const counts = (c, what) => `${fmtInt(c.both)} ${what} in both, ${fmtInt(c["after only"])} only in the selected run, ${fmtInt(c["baseline only"])} only in the baseline`;
    replace(table,
      h("table", {class: "kv-table compare-table"},
        h("thead", {}, h("tr", {}, h("th", {}, ""), term("th", "baseline", {class: "num"}), term("th", "after", {class: "num"}),
          term("th", "change", {class: "num"}))),
        h("tbody", {}, rows)),
      h("p", {class: "muted", id: "compare-counts"}, `${counts(doc.ops, "ops")}; ${counts(doc.kernels, "compute kernels")}.`));
    const b = doc.baseline;
    const kept = b.stored ? ` — the run's own baseline (dlprof --baseline), analysed with aggregation #${b.compared_aggr}'s options` : "";
    afterText.textContent = `Selected: ${side(doc.after)} · baseline: ${side(b)}${kept}. Changes are selected − baseline.`;
    el.dataset.baseline = b.stored ? "stored" : "run";
    el.dataset.ready = "1";
  }

  async function load() {
    const mine = ++loads;
    el.dataset.ready = "";
    if (nothingChosen) {
      replace(table, placeholder("Choose the run (or another aggregation of this run) to compare with."));
      return;
    }
    const params = {...scope(), ...baseline()};
    try {
      const doc = await getJSON("compare", params);
      if (!alive || mine !== loads) return;
      renderSummary(doc);
    } catch (err) {
      if (!alive || mine !== loads) return;
      replace(table, placeholder(`Could not compare: ${err.message}`));
      reportError(err);
      return;
    }
    if (!tables) {
      tables = {
        ops: new DataTable({route: "table/compare_ops", scope, extra: baseline(), exportName: "compare_ops", pageSize: 25, renderers: RENDERERS, order: ORDER}),
        kernels: new DataTable({route: "table/compare_kernels", scope, extra: baseline(), exportName: "compare_kernels", pageSize: 10, renderers: RENDERERS, order: ORDER}),
      };
      opsCard.body.appendChild(tables.ops.el);
      kernelsCard.body.appendChild(tables.kernels.el);
    } else {
      tables.ops.setExtra(baseline());
      tables.kernels.setExtra(baseline());
    }
  }

  async function fillAggregations(run, wanted, mine) {
    let data;
    try {
      data = await getJSON("aggregations", {run});
    } catch (err) {
      reportError(err);
      return null;
    }
    if (mine !== choice) return null;
    const aggs = (data.aggregations || []).slice().sort((a, b) => Number(a.aggr_id) - Number(b.aggr_id));
    const ids = aggs.map((a) => String(a.aggr_id));
    const chosen = wanted !== null && wanted !== undefined && ids.includes(String(wanted)) ? String(wanted)
      : String(data.newest ?? ids[ids.length - 1]);
    replace(aggrSelect, ...aggs.map((a) => h("option", {value: a.aggr_id, selected: String(a.aggr_id) === chosen},
      `${aggrText(a)}${String(a.aggr_id) === String(data.newest) ? " (newest)" : ""}`)));
    return chosen;
  }

  async function choose(run, aggr) {
    const mine = ++choice;
    nothingChosen = run === NONE;
    if (run === STORED || run === NONE) {
      aggrField.hidden = true;
      update({base_run: null, base_aggr: null});
      await load();
      return;
    }
    aggrField.hidden = false;
    // the previous run's aggregations must not be picked while this run's are on their way
    replace(aggrSelect, h("option", {value: ""}, "Loading…"));
    aggrSelect.disabled = true;
    const chosen = await fillAggregations(run, aggr, mine);
    if (!alive || mine !== choice) return;
    aggrSelect.disabled = false;
    if (chosen === null) return;
    update({base_run: run, base_aggr: chosen});
    await load();
  }

  const current = state.aggregations.find((a) => String(a.aggr_id) === String(state.aggr)) || {};
  const kept = (state.aggregations.find((a) => a.baseline) || {}).baseline;
  replace(runSelect,
    kept ? h("option", {value: STORED, title: kept}, `Its baseline (dlprof --baseline): ${String(kept).split(/[\\/]/).pop()}`) : null,
    kept ? null : h("option", {value: NONE, disabled: true}, "Choose a baseline…"),
    h("option", {value: state.run}, `This run, another aggregation${current.aggr_id ? ` (selected: #${current.aggr_id})` : ""}`),
    ...state.runs.filter((r) => r.run !== state.run).map((r) => h("option", {value: r.run}, runLabel(r))));
  runSelect.addEventListener("change", () => choose(runSelect.value, null));
  aggrSelect.addEventListener("change", () => {
    choice += 1; // a baseline run still being chosen must not override this pick
    update({base_run: runSelect.value, base_aggr: aggrSelect.value});
    load();
  });
  const start = defaultBaseline();
  runSelect.value = start.base_run;
  choose(start.base_run, start.base_aggr);

  return () => {
    alive = false;
  };
}
