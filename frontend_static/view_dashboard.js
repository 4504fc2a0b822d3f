// Dashboard: the ten panels of DLProf's viewer, all from the `dashboard` route.

import {actionControls} from "./actions.js";
import {tryGet} from "./api.js";
import {COLORS, donut, iterationBars, iterationLegend, legend} from "./charts.js";
import {showOp} from "./details.js";
import {card, h, loading, placeholder, replace} from "./dom.js";
import {fmtBool, fmtInt, fmtNs, fmtNsExact, fmtPct} from "./format.js";
import {definition} from "./metrics.js";
import {isPyTorch, scope, state} from "./state.js";
import {tensorBoardBody} from "./theme.js";

export const BREAKDOWN = [
  {key: "tc", field: "tc_duration_pct", label: "Tensor Core kernels"},
  {key: "non_tc", field: "non_tc_duration_pct", label: "Non-Tensor Core kernels"},
  {key: "memory", field: "memory_duration_pct", label: "Memory"},
  {key: "dataloader", field: "dataloader_duration_pct", label: "Dataloader"},
  {key: "io", field: "io_duration_pct", label: "I/O"},
  {key: "cpu", field: "cpu_duration_pct", label: "CPU"},
  {key: "other", field: "other_duration_pct", label: "Other"},
];

function metric(label, value, key, {exact, emphasis} = {}) {
  return h("div", {class: ["metric", emphasis ? "emphasis" : ""], dataset: {metric: key}, title: definition(key)},
    h("div", {class: "metric-label"}, label),
    h("div", {class: "metric-value", title: exact || ""}, value));
}

function gpuUtilization(summary) {
  const {card: c, body} = card("GPU Utilization", {tooltip: definition("gpu_utilization"), id: "panel-gpu-utilization"});
  body.appendChild(donut(BREAKDOWN.map((b) => ({
    key: b.key, label: b.label, value: summary[b.field], color: COLORS[b.key], title: `${b.label}: ${fmtPct(summary[b.field])} — ${definition(b.field)}`,
  })), {center: fmtPct(summary.gpu_utilization), centerSub: "GPU utilization", ariaLabel: "Time breakdown"}));
  return c;
}

function summaryTable(rows, countLabel, id, title, tooltip) {
  const {card: c, body} = card(title, {tooltip, id});
  body.appendChild(h("table", {class: "kv-table summary-table"},
    h("thead", {}, h("tr", {}, h("th", {}, ""),
      h("th", {class: "num", title: definition("gpu_time")}, "GPU Time"),
      h("th", {class: "num", title: definition("cpu_time")}, "CPU Time"),
      h("th", {class: "num", title: definition(countLabel[1])}, countLabel[0]))),
    h("tbody", {}, rows.map(([label, data, key]) => h("tr", {dataset: {row: key}},
      h("th", {scope: "row", title: definition(key)}, label),
      h("td", {class: "num", title: fmtNsExact(data && data.gpu_time)}, fmtNs(data && data.gpu_time)),
      h("td", {class: "num", title: fmtNsExact(data && data.cpu_time)}, fmtNs(data && data.cpu_time)),
      h("td", {class: "num"}, fmtInt(data && data.count)))))));
  return c;
}

function tensorCorePanel(tc) {
  const {card: c, body} = card("Tensor Core Kernel Efficiency", {tooltip: definition("tc_utilization"), id: "panel-tensor-core"});
  const util = Number(tc.tc_utilization) || 0;
  body.appendChild(h("div", {class: "tc-panel"},
    donut([
      {key: "tc", label: "Tensor Core kernels", value: util, color: COLORS.tc},
      {key: "non_tc", label: "Other kernels of eligible ops", value: Math.max(0, 100 - util), color: COLORS.other},
    ], {center: fmtPct(util), centerSub: "TC kernels", legend: false, size: 160, ariaLabel: "Tensor Core kernel utilization"}),
    h("div", {class: "tc-counts"},
      metric("Ops eligible for Tensor Cores", fmtInt(tc.eligible_ops), "eligible_ops"),
      metric("Eligible ops using Tensor Cores", fmtInt(tc.using_tc_ops), "using_tc_ops"),
      metric("Eligible ops not using Tensor Cores", fmtInt(tc.eligible_not_using_ops), "eligible_not_using_ops"))));
  return c;
}

// The steady iteration figures lead (the median of the complete aggregated iterations, their range, the partial
// ones named); databases of earlier versions have none (null) and show DLProf's figures only.
function steadyMetrics(sm) {
  if (sm.median_iteration_time === null || sm.median_iteration_time === undefined) return [];
  const partial = sm.partial_iterations || [];
  const complete = sm.complete_iterations
    ? `${fmtInt(sm.complete_start)} – ${fmtInt(sm.complete_stop)} (${fmtInt(sm.complete_iterations)})` : "none";
  const median = metric("Median Iteration Time", fmtNs(sm.median_iteration_time), "median_iteration_time",
    {exact: fmtNsExact(sm.median_iteration_time), emphasis: true});
  median.title = sm.complete_iterations
    ? "Median duration of the complete aggregated iterations (the steady figure: start-up and tear-down left out)."
    : "Median duration of the aggregated iterations (none is complete).";
  const range = metric("Complete Iterations", complete, "complete_iterations");
  range.title = partial.length
    ? `Partial iterations, left out of the median: ${partial.join(", ")} (up to the first key node, after the last one).`
    : "Every aggregated iteration is complete.";
  return [median, range];
}

function performancePanel(sm) {
  const {card: c, body} = card("Performance Summary", {id: "panel-performance"});
  const range = `${fmtInt(sm.iter_start)} – ${fmtInt(sm.iter_stop)}`;
  body.appendChild(h("div", {class: "metrics"},
    metric("Wall Clock Time", fmtNs(sm.wall_time), "wall_time", {exact: fmtNsExact(sm.wall_time), emphasis: true}),
    metric("Tensor Core Kernel Utilization", fmtPct(sm.tc_utilization), "tc_utilization", {emphasis: true}),
    metric("GPU Utilization", fmtPct(sm.gpu_utilization), "gpu_utilization", {emphasis: true}),
    ...steadyMetrics(sm),
    metric("Total Iterations", fmtInt(sm.iter_total), "iter_total"),
    metric("Aggregated Iterations", fmtInt(sm.iter_aggregated), "iter_aggregated"),
    metric("Iteration Range", range, "iter_range"),
    metric("Average Iteration Time", fmtNs(sm.avg_iteration_time), "avg_iteration_time", {exact: fmtNsExact(sm.avg_iteration_time)}),
    metric("Iteration Time Std. Dev.", fmtNs(sm.iteration_time_std_dev), "iteration_time_std_dev", {exact: fmtNsExact(sm.iteration_time_std_dev)}),
    metric("GPUs", fmtInt(sm.n_visible_gpus), "n_visible_gpus")));
  body.appendChild(h("div", {class: ["key-node", sm.key_found === 0 || sm.key_found === false ? "warn" : ""], dataset: {metric: "key_node"}, title: definition("key_node")},
    h("span", {class: "metric-label"}, "Key node"), h("code", {}, sm.key_node || "(none)"),
    sm.key_found === 0 || sm.key_found === false ? h("span", {class: "badge warn"}, "not found") : null));
  c.querySelector('[data-metric="iter_range"]').title = "Aggregated iterations, Start – Stop (inclusive).";
  return c;
}

function iterationPanel(data) {
  const sm = data.summary || {};
  const {card: c, body} = card("Iteration Summary", {id: "panel-iterations", wide: true,
    tooltip: "Per iteration: the time breakdown's classes (Tensor Core kernels, other kernels, memory, data loading, I/O, CPU, other); the aggregated range is shaded."});
  const its = data.iterations || [];
  if (!its.length) {
    body.appendChild(placeholder("No iterations."));
    return c;
  }
  body.appendChild(iterationBars(its, {range: [sm.iter_start, sm.iter_stop], height: 220, ariaLabel: "Iteration summary"}));
  body.appendChild(legend(iterationLegend(its, definition)));
  return c;
}

function topOpsPanel(data) {
  const {card: c, body} = card("Top 10 GPU Ops", {id: "panel-top-ops", wide: true, tooltip: "The ten ops with the most GPU time. Select one for its details."});
  const ops = data.top_ops || [];
  if (!ops.length) {
    body.appendChild(placeholder("No ops."));
    return c;
  }
  const pt = isPyTorch();
  const cols = [
    ["op_id", "Op ID", ""], ["op_name", "Op Name", ""], pt ? ["direction", "Direction", ""] : null, ["op_type", "Op Type", ""],
    ["num_calls", "No. Calls", "num"], ["gpu_total", "GPU Time", "ns"], ["cpu_total", "CPU Time", "ns"],
    ["tc_eligible", "TC Eligible", "bool"], ["using_tc", "Using TC", "bool"],
  ].filter(Boolean);
  const tips = {gpu_total: definition("gpu_time"), cpu_total: definition("cpu_time"), tc_eligible: definition("eligible_ops"),
    using_tc: definition("using_tc_ops")};
  const maxGpu = Math.max(1, ...ops.map((o) => Number(o.gpu_total) || 0));
  const table = h("table", {class: "dt selectable top-ops"},
    h("thead", {}, h("tr", {}, h("th", {class: "num"}, "#"), cols.map(([k, label, t]) => h("th", {class: t === "num" || t === "ns" ? "num" : "", title: tips[k] || ""}, label)))),
    h("tbody", {}, ops.map((op, i) => {
      const tr = h("tr", {tabindex: 0, dataset: {opIndex: op.op_index}},
        h("td", {class: "num rank"}, String(i + 1)),
        cols.map(([k, , t]) => {
          if (t === "ns") {
            const bar = k === "gpu_total" ? h("span", {class: "inline-bar", style: {width: `${(100 * (Number(op[k]) || 0)) / maxGpu}%`}}) : null;
            return h("td", {class: "num", title: fmtNsExact(op[k]), dataset: {key: k}}, bar ? h("span", {class: "bar-cell"}, bar, h("span", {}, fmtNs(op[k]))) : fmtNs(op[k]));
          }
          if (t === "num") return h("td", {class: "num", dataset: {key: k}}, fmtInt(op[k]));
          if (t === "bool") return h("td", {dataset: {key: k}}, fmtBool(op[k]));
          const text = op[k] ?? "";
          const wrap = k !== "op_id" && String(text).length > 24;
          return h("td", {dataset: {key: k}, class: k === "op_name" ? "mono" : ""}, wrap ? h("div", {class: "wrap-cell compact"}, text) : text);
        }));
      const pick = () => {
        for (const other of table.querySelectorAll("tr.selected")) other.classList.remove("selected");
        tr.classList.add("selected");
        showOp(op.op_index);
      };
      if (state.op !== null && Number(op.op_index) === Number(state.op)) tr.classList.add("selected");
      tr.addEventListener("click", pick);
      tr.addEventListener("keydown", (ev) => {
        if (ev.key === "Enter" || ev.key === " ") {
          ev.preventDefault();
          pick();
        }
      });
      return tr;
    })));
  body.appendChild(h("div", {class: "dt-scroll"}, table));
  return c;
}

function systemPanel(sys) {
  const {card: c, body} = card("System Configuration", {id: "panel-system"});
  const rows = [
    ["GPU Count", fmtInt(sys.gpu_count)],
    ["GPU Name(s)", Array.isArray(sys.gpu_names) ? sys.gpu_names.join(", ") : sys.gpu_names],
    ["CPU Model", sys.cpu_model], ["GPU Driver Version", sys.driver_version], ["Framework", sys.framework],
    ["CUDA Version", sys.cuda_version], ["Nsight Systems Version", sys.nsys_version], ["DLProf Version", sys.dlprof_version, "dlprof_version"],
    ["DLProf Plugin Version", sys.plugin_version, "plugin_version"],
    ["TensorBoard Version", sys.tensorboard_version, "tensorboard_version"],
  ];
  const tips = {dlprof_version: "The dlprof that analysed this profile", plugin_version: "The DLProf plugin serving this page",
    tensorboard_version: tensorBoardBody() ? "The TensorBoard serving this page" : "The TensorBoard installed with dlprofviewer (which serves this page)"};
  body.appendChild(h("dl", {class: "kv"}, rows.map(([k, v, key]) => [h("dt", {title: tips[key] || ""}, k),
    h("dd", {dataset: {field: key || ""}}, v === null || v === undefined || v === "" ? "—" : String(v))])));
  return c;
}

const URL_RE = /(https?:\/\/[^\s)]+)/g;

/** Text with its URLs as links. */
export function linkify(text) {
  const parts = String(text || "").split(URL_RE);
  return parts.map((p, i) => (i % 2 ? h("a", {href: p, target: "_blank", rel: "noopener noreferrer"}, p) : p));
}

function findingsPanel(findings) {
  const {card: c, body} = card("Recommendations", {id: "panel-recommendations", cls: "span2", tooltip: "Expert systems: problems found in this aggregation and what to try."});
  if (!findings.length) {
    body.appendChild(placeholder("No problems detected."));
    return c;
  }
  body.appendChild(h("ul", {class: "findings"}, findings.map((f) => h("li", {class: `finding sev-${String(f.severity || "info").toLowerCase()}`, dataset: {expSys: f.exp_sys_id || ""}},
    h("div", {class: "finding-head"}, h("span", {class: "badge"}, f.severity || "info"), h("span", {class: "finding-problem"}, f.problem)),
    h("div", {class: "finding-rec"}, linkify(f.recommendation)),
    actionControls(f.action),
    f.link ? h("a", {href: f.link, target: "_blank", rel: "noopener noreferrer", class: "finding-link"}, "Learn more") : null))));
  return c;
}

function guidancePanel(guidance) {
  const {card: c, body} = card("Guidance", {id: "panel-guidance"});
  if (!guidance.length) {
    body.appendChild(placeholder("No guidance for this profile."));
    return c;
  }
  body.appendChild(h("ul", {class: "guidance"}, guidance.map((g) => h("li", {},
    h("div", {class: "guidance-title"}, g.link ? h("a", {href: g.link, target: "_blank", rel: "noopener noreferrer"}, g.title) : g.title),
    h("div", {class: "guidance-text"}, linkify(g.text))))));
  return c;
}

export function mount(el) {
  let alive = true;
  el.appendChild(loading("Loading dashboard…"));
  tryGet("dashboard", scope()).then((data) => {
    if (!alive) return;
    if (!data) {
      replace(el, placeholder("The dashboard could not be loaded."));
      return;
    }
    const sm = data.summary || {};
    const os = data.op_summary || {};
    const ks = data.kernel_summary || {};
    replace(el, h("div", {class: "dashboard"},
      performancePanel(sm),
      gpuUtilization(sm),
      tensorCorePanel({tc_utilization: sm.tc_utilization, ...(data.tensor_core || {})}),
      summaryTable([["All ops", os.all, "ops_all"], ["Ops using Tensor Cores", os.using_tc, "ops_using_tc"],
        ["Eligible, not using TC", os.eligible_not_using, "ops_eligible_not_using"], ["All other ops", os.other, "ops_other"]],
      ["# Ops", "count_ops"], "panel-op-summary", "Op Summary", "Ops by Tensor Core use: sums of the per-op totals."),
      summaryTable([["All kernels", ks.all, "kernels_all"], ["Kernels using Tensor Cores", ks.tc, "kernels_tc"],
        ["Memory", ks.memory, "kernels_memory"], ["All other kernels", ks.other, "kernels_other"]],
      ["# Kernels", "count_kernels"], "panel-kernel-summary", "Kernel Summary", "Kernels by class: GPU time = kernel durations, CPU time = launching API time, count = distinct names."),
      systemPanel(data.system || {}),
      iterationPanel(data),
      topOpsPanel(data),
      findingsPanel(data.findings || []),
      guidancePanel(data.guidance || [])));
    el.dataset.ready = "1";
  });
  return () => {
    alive = false;
  };
}
