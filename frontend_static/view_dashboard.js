// Dashboard: the ten panels of DLProf's viewer, all from the `dashboard` route.

import {actionControls} from "./actions.js";
import {tryGet} from "./api.js";
import {COLORS, TIME_CLASSES, donut, iterationBars, iterationLegend, legend} from "./charts.js";
import {showOp} from "./details.js";
import {card, h, loading, placeholder, replace} from "./dom.js";
import {fmtBool, fmtInt, fmtNs, fmtNsExact, fmtPct} from "./format.js";
import {definition, term} from "./metrics.js";
import {isPyTorch, scope, state} from "./state.js";

/** The time classes of the summary (the `*_duration_pct` fields), in stacking order (charts.TIME_CLASSES). */
export const BREAKDOWN = TIME_CLASSES.map((c) => ({key: c.key, term: c.term, field: `${c.key}_duration_pct`}));

function metric(key, value, {exact, emphasis, metricKey} = {}) {
  return h("div", {class: ["metric", emphasis ? "emphasis" : ""], dataset: {metric: metricKey || key}, title: definition(key)},
    term("div", key, {class: "metric-label"}),
    h("div", {class: "metric-value", title: exact || ""}, value));
}

function gpuUtilization(summary) {
  const {card: c, body} = card("GPU Utilization", {tooltip: definition("gpu_utilization"), id: "panel-gpu-utilization"});
  body.appendChild(donut(BREAKDOWN.map((b) => ({
    key: b.key, term: b.term, value: summary[b.field], color: COLORS[b.key],
  })), {center: fmtPct(summary.gpu_utilization), centerSub: "GPU utilization", ariaLabel: "Time breakdown"}));
  return c;
}

/** A summary panel: rows [term, figures] under the columns [term, field, format]. */
function summaryTable(rows, columns, id, title, tooltip) {
  const {card: c, body} = card(title, {tooltip, id});
  const cell = (data, field, fmt) => {
    const v = data && data[field];
    return fmt === "ns" ? h("td", {class: "num", title: fmtNsExact(v)}, fmtNs(v)) : h("td", {class: "num"}, fmtInt(v));
  };
  body.appendChild(h("table", {class: "kv-table summary-table"},
    h("thead", {}, h("tr", {}, h("th", {}, ""), columns.map(([key]) => term("th", key, {class: "num"})))),
    h("tbody", {}, rows.map(([key, data]) => h("tr", {dataset: {row: key}},
      term("th", key, {scope: "row"}),
      columns.map(([, field, fmt]) => cell(data, field, fmt)))))));
  return c;
}

/** The GPU time breakdowns (DESIGN.md "GPU time breakdowns"): communication and its overlap, short kernels, and
 * per GPU the busy wall time of each class (they may overlap) and the idle time's split. No panel for a database
 * written before them or a profile without GPU work. */
function gpuBreakdownPanel(bd) {
  if (!bd || !(bd.gpus || []).length) return null;   // before schema 3.2, or no GPU ran anything
  const {card: c, body} = card("GPU Time Breakdown", {id: "panel-gpu-breakdown", wide: true,
    tooltip: "Per GPU: the wall time compute kernels, collective kernels and memory operations ran (each counted once where they overlap each other), the idle time and its split by what the GPU waited for."});
  const launches = Number(bd.launches) || 0;
  body.appendChild(h("div", {class: "metrics"},
    metric("communication_time", fmtNs(bd.communication_time), {exact: fmtNsExact(bd.communication_time)}),
    metric("overlapped_communication_pct", fmtPct(bd.overlapped_communication_pct)),
    metric("short_kernels", launches ? `${fmtInt(bd.short_kernels)} of ${fmtInt(launches)} launches` : "no launches")));
  const cols = [
    ["bd_computation", "computation_busy"], ["bd_communication", "communication_busy"], ["bd_memory", "memory_busy"],
    ["bd_overlapped", "overlapped_communication"], ["bd_idle", "gpu_idle"], ["idle_host_wait", "host_wait"],
    ["idle_kernel_wait", "kernel_wait"], ["idle_other", "other_wait"],
  ];
  body.appendChild(h("div", {class: "dt-scroll"}, h("table", {class: "dt gpu-breakdown"},
    h("thead", {}, h("tr", {}, term("th", "device_id"), cols.map(([t]) => term("th", t, {class: "num"})))),
    h("tbody", {}, (bd.gpus || []).map((g) => h("tr", {dataset: {device: g.device_id}},
      h("td", {}, `GPU ${g.device_id}`),
      cols.map(([, f]) => h("td", {class: "num", title: fmtNsExact(g[f]), dataset: {key: f, ns: g[f]}}, fmtNs(g[f])))))))));
  return c;
}

function tensorCorePanel(tc) {
  const {card: c, body} = card("Tensor Core Kernel Efficiency", {tooltip: definition("tc_utilization"), id: "panel-tensor-core"});
  const util = Number(tc.tc_utilization) || 0;
  body.appendChild(h("div", {class: "tc-panel"},
    donut([
      {key: "tc", term: "kernels_tc", value: util, color: COLORS.tc},
      {key: "non_tc", term: "kernels_other", value: Math.max(0, 100 - util), color: COLORS.other},
    ], {center: fmtPct(util), centerSub: "TC kernels", legend: false, size: 160, ariaLabel: "Tensor Core kernel utilization"}),
    h("div", {class: "tc-counts"},
      metric("eligible_ops", fmtInt(tc.eligible_ops)),
      metric("using_tc_ops", fmtInt(tc.using_tc_ops)),
      metric("ops_eligible_not_using", fmtInt(tc.eligible_not_using_ops), {metricKey: "eligible_not_using_ops"}))));
  return c;
}

// The steady iteration figures lead (the median of the complete aggregated iterations, their range, the partial
// ones named); databases of earlier versions have none (null) and show DLProf's figures only.
function steadyMetrics(sm) {
  if (sm.median_iteration_time === null || sm.median_iteration_time === undefined) return [];
  const partial = sm.partial_iterations || [];
  const complete = (sm.complete_iterations
    ? `${fmtInt(sm.complete_start)} – ${fmtInt(sm.complete_stop)} (${fmtInt(sm.complete_iterations)})` : "none")
    + (partial.length ? `; partial: ${partial.map(fmtInt).join(", ")}` : "");
  return [
    metric("median_iteration_time", fmtNs(sm.median_iteration_time), {exact: fmtNsExact(sm.median_iteration_time), emphasis: true}),
    metric("complete_iterations", complete),
  ];
}

function performancePanel(sm) {
  const {card: c, body} = card("Performance Summary", {id: "panel-performance"});
  const range = `${fmtInt(sm.iter_start)} – ${fmtInt(sm.iter_stop)}`;
  body.appendChild(h("div", {class: "metrics"},
    metric("wall_time", fmtNs(sm.wall_time), {exact: fmtNsExact(sm.wall_time), emphasis: true}),
    metric("tc_utilization", fmtPct(sm.tc_utilization), {emphasis: true}),
    metric("gpu_utilization", fmtPct(sm.gpu_utilization), {emphasis: true}),
    ...steadyMetrics(sm),
    metric("iter_total", fmtInt(sm.iter_total)),
    metric("iter_aggregated", fmtInt(sm.iter_aggregated)),
    metric("iter_range", range),
    metric("avg_iteration_time", fmtNs(sm.avg_iteration_time), {exact: fmtNsExact(sm.avg_iteration_time)}),
    metric("iteration_time_std_dev", fmtNs(sm.iteration_time_std_dev), {exact: fmtNsExact(sm.iteration_time_std_dev)}),
    metric("n_visible_gpus", fmtInt(sm.n_visible_gpus))));
  const notFound = sm.key_found === 0 || sm.key_found === false;
  body.appendChild(h("div", {class: ["key-node", notFound ? "warn" : ""], dataset: {metric: "key_node"}, title: definition("key_node")},
    term("span", "key_node", {class: "metric-label"}), h("code", {}, sm.key_node || "(none)"),
    notFound ? h("span", {class: "badge warn"}, "not found") : null));
  return c;
}

function iterationPanel(data) {
  const sm = data.summary || {};
  const {card: c, body} = card("Iteration Summary", {id: "panel-iterations", wide: true,
    tooltip: "Per iteration: the time breakdown's classes (busy wall time); the aggregated range is shaded."});
  const its = data.iterations || [];
  if (!its.length) {
    body.appendChild(placeholder("No iterations."));
    return c;
  }
  body.appendChild(iterationBars(its, {range: [sm.iter_start, sm.iter_stop], height: 220, ariaLabel: "Iteration summary"}));
  body.appendChild(legend(iterationLegend(its)));
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
    ["op_id", ""], ["op_name", ""], pt ? ["direction", ""] : null, ["op_type", ""],
    ["num_calls", "num"], ["gpu_total", "ns"], ["cpu_total", "ns"], ["tc_eligible", "bool"], ["using_tc", "bool"],
  ].filter(Boolean);
  const maxGpu = Math.max(1, ...ops.map((o) => Number(o.gpu_total) || 0));
  const table = h("table", {class: "dt selectable top-ops"},
    h("thead", {}, h("tr", {}, term("th", "top_rank", {class: "num"}),
      cols.map(([k, t]) => term("th", k, {class: t === "num" || t === "ns" ? "num" : ""})))),
    h("tbody", {}, ops.map((op, i) => {
      const tr = h("tr", {tabindex: 0, dataset: {opIndex: op.op_index}},
        h("td", {class: "num rank"}, String(i + 1)),
        cols.map(([k, t]) => {
          if (t === "ns") {
            const bar = k === "gpu_total" ? h("span", {class: "inline-bar", style: {width: `${(100 * (Number(op[k]) || 0)) / maxGpu}%`}}) : null;
            return h("td", {class: "num", title: fmtNsExact(op[k]), dataset: {key: k}}, bar ? h("span", {class: "bar-cell"}, bar, h("span", {}, fmtNs(op[k]))) : fmtNs(op[k]));
          }
          if (t === "num") return h("td", {class: "num", dataset: {key: k}}, fmtInt(op[k]));
          if (t === "bool") return h("td", {dataset: {key: k}}, fmtBool(op[k]));
          const text = op[k] ?? "";
          const clip = k !== "op_id" && String(text).length > 24;
          return h("td", {dataset: {key: k}, class: k === "op_name" ? "mono" : ""}, clip ? h("span", {class: "clip-cell", title: text}, text) : text);
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
    ["gpu_count", fmtInt(sys.gpu_count)],
    ["gpu_names", Array.isArray(sys.gpu_names) ? sys.gpu_names.join(", ") : sys.gpu_names],
    ["cpu_model", sys.cpu_model], ["driver_version", sys.driver_version], ["framework", sys.framework],
    ["cuda_version", sys.cuda_version], ["nsys_version", sys.nsys_version], ["dlprof_version", sys.dlprof_version],
    ["plugin_version", sys.plugin_version], ["tensorboard_version", sys.tensorboard_version],
  ];
  body.appendChild(h("dl", {class: "kv"}, rows.map(([key, v]) => [term("dt", key),
    h("dd", {dataset: {field: key}}, v === null || v === undefined || v === "" ? "—" : String(v))])));
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
      summaryTable([["ops_all", os.all], ["ops_using_tc", os.using_tc], ["ops_eligible_not_using", os.eligible_not_using],
        ["ops_other", os.other]], [["gpu_total", "gpu_time", "ns"], ["cpu_total", "cpu_time", "ns"], ["num_ops", "count"]],
      "panel-op-summary", "Op Summary", "Ops by Tensor Core use: sums of the per-op totals."),
      summaryTable([["kernels_all", ks.all], ["kernels_tc", ks.tc], ["kernels_memory", ks.memory], ["kernels_other", ks.other]],
        [["kernel_time", "gpu_time", "ns"], ["api_time_total", "cpu_time", "ns"], ["kernel_count", "count"]],
        "panel-kernel-summary", "Kernel Summary", "Kernels and memory operations by class: the sums of their durations, of their launching API calls' durations, and their distinct names."),
      systemPanel(data.system || {}),
      gpuBreakdownPanel(data.gpu_breakdown),
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
