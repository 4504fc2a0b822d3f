// Compare: the selected run and aggregation (the navigation's) against a baseline chosen here, any run of the
// list or another aggregation of the same run. On top the headline figures (iteration time, GPU utilization,
// total GPU time) before / after / change, then per op (name, direction) and per kernel name the GPU time of
// both and its change, largest change first: the rows of the diff report (`dlprof --baseline`), computed by
// the same engine module on the server. The baseline is kept in the URL (base_run, base_aggr).

import {getJSON, reportError} from "./api.js";
import {card, h, loading, placeholder, replace} from "./dom.js";
import {fmtInt, fmtNs, fmtNsExact, fmtPct} from "./format.js";
import {scope, state, update} from "./state.js";
import {DataTable} from "./table.js";

// which way is better for each headline figure (1: more is better, -1: less is better, 0: neither)
const BETTER = {avg_iteration_time: -1, gpu_utilization: 1, total_gpu_time: -1, kernel_gpu_time: -1, wall_time: 0,
  aggregated_iterations: 0, tc_utilization: 1};
const LABELS = {avg_iteration_time: "Average iteration time", gpu_utilization: "GPU utilization",
  total_gpu_time: "Total GPU time (ops)", kernel_gpu_time: "Kernel GPU time", wall_time: "Wall clock time",
  aggregated_iterations: "Aggregated iterations", tc_utilization: "Tensor Core kernel utilization"};

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

function runLabel(run) {
  return run === "." ? "(logdir)" : run;
}

function aggrText(a) {
  const range = a.iter_start === a.iter_stop ? `iteration ${a.iter_start}` : `iterations ${a.iter_start}–${a.iter_stop}`;
  return `#${a.aggr_id} · ${range}${a.key_node ? ` · ${a.key_node}` : ""}`;
}

/** The default baseline: another run when there is one, else another aggregation of this run. */
function defaultBaseline() {
  const others = state.runs.filter((r) => r.run !== state.run);
  if (others.length) return {base_run: others[0].run, base_aggr: null};
  const earlier = state.aggregations.filter((a) => String(a.aggr_id) !== String(state.aggr));
  return {base_run: state.run, base_aggr: earlier.length ? String(earlier[earlier.length - 1].aggr_id) : String(state.aggr)};
}

export function mount(el) {
  let alive = true;
  const runSelect = h("select", {id: "compare-base-run"});
  const aggrSelect = h("select", {id: "compare-base-aggr"});
  const afterText = h("div", {class: "muted", id: "compare-after"});
  const pick = card("Baseline", {wide: true, id: "compare-pick",
    tooltip: "The profile the selected run and aggregation are compared with: any run, or another aggregation of the same run. Changes are the selected one minus the baseline."});
  pick.body.append(h("div", {class: "form-row"},
    h("div", {class: "field"}, h("label", {for: "compare-base-run"}, "Baseline run"), runSelect),
    h("div", {class: "field"}, h("label", {for: "compare-base-aggr"}, "Baseline aggregation"), aggrSelect)), afterText);
  const summary = card("Change", {wide: true, id: "compare-summary",
    tooltip: "Headline figures of the baseline and of the selected aggregation, and the change (selected − baseline). Total GPU time is the sum of the ops' GPU time (the summary's All ops), so the op changes below add up to its change."});
  const opsCard = card("Ops", {wide: true, id: "compare-ops",
    tooltip: "Per op (name and direction): GPU time in the selected aggregation and in the baseline, and the change, largest first. Ops of one side only count 0 on the other."});
  const kernelsCard = card("Kernels", {wide: true, id: "compare-kernels",
    tooltip: "Per kernel name (over every op launching it): launches and GPU time in both, and the change, largest first."});
  el.append(pick.card, summary.card, opsCard.card, kernelsCard.card);
  summary.body.appendChild(loading());

  let tables = null;
  const baseline = () => ({base_run: state.base_run, base_aggr: state.base_aggr});
  // Answers can arrive out of order (the initial baseline's while the user already picked another): each
  // choice and each load takes a number, and only the newest one's answer is shown.
  let choice = 0;
  let loads = 0;

  function renderSummary(doc) {
    const rows = (doc.summary || []).map((r) => h("tr", {dataset: {key: r.key}},
      h("th", {scope: "row", title: r.label}, LABELS[r.key] || r.label),
      h("td", {class: "num", dataset: {field: "baseline"}, title: r.kind === "pct" ? "" : fmtNsExact(r.baseline)}, figureText(r, r.baseline)),
      h("td", {class: "num", dataset: {field: "after"}, title: r.kind === "pct" ? "" : fmtNsExact(r.after)}, figureText(r, r.after)),
      h("td", {class: ["num", "delta", tone(r.key, r.delta)], dataset: {field: "delta"}}, deltaText(r))));
    const side = (s) => `${runLabel(s.run)} · aggregation ${s.aggr}${s.iterations ? ` (iterations ${s.iterations[0]}–${s.iterations[1]} of ${s.iterations[2]})` : ""}`;
    const counts = (c, what) => `${fmtInt(c.both)} ${what} in both, ${fmtInt(c["after only"])} only in the selected run, ${fmtInt(c["baseline only"])} only in the baseline`;
    replace(summary.body,
      h("table", {class: "kv-table compare-table"},
        h("thead", {}, h("tr", {}, h("th", {}, ""), h("th", {class: "num", title: side(doc.baseline)}, "Baseline"),
          h("th", {class: "num", title: side(doc.after)}, "Selected (after)"), h("th", {class: "num"}, "Change"))),
        h("tbody", {}, rows)),
      h("p", {class: "muted", id: "compare-counts"}, `${counts(doc.ops, "ops")}; ${counts(doc.kernels, "kernels")}.`));
    afterText.textContent = `Selected: ${side(doc.after)} · baseline: ${side(doc.baseline)}. Changes are selected − baseline.`;
    el.dataset.ready = "1";
  }

  async function load() {
    const mine = ++loads;
    el.dataset.ready = "";
    const params = {...scope(), ...baseline()};
    try {
      const doc = await getJSON("compare", params);
      if (!alive || mine !== loads) return;
      renderSummary(doc);
    } catch (err) {
      if (!alive || mine !== loads) return;
      replace(summary.body, placeholder(`Could not compare: ${err.message}`));
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

  replace(runSelect, ...state.runs.map((r) => h("option", {value: r.run}, runLabel(r.run))));
  runSelect.addEventListener("change", () => choose(runSelect.value, null));
  aggrSelect.addEventListener("change", () => {
    choice += 1; // a baseline run still being chosen must not override this pick
    update({base_run: runSelect.value, base_aggr: aggrSelect.value});
    load();
  });
  const known = state.runs.some((r) => r.run === state.base_run);
  const start = known ? {base_run: state.base_run, base_aggr: state.base_aggr} : defaultBaseline();
  runSelect.value = start.base_run;
  choose(start.base_run, start.base_aggr);

  return () => {
    alive = false;
  };
}
