// Ranks: the ranks of a multi-rank run side by side — every rank's iteration times, the cross-rank table
// (dlprof_ranks.csv) with the straggler highlighted, and the findings across ranks. Choosing a rank here (or in the
// navigation's Rank selector) makes every other view show that rank.

import {tryGet} from "./api.js";
import {isEmptyIteration, legend} from "./charts.js";
import {card, h, loading, placeholder, replace, s} from "./dom.js";
import {fmtInt, fmtNs, fmtPct} from "./format.js";
import {term} from "./metrics.js";
import {scope, state, update} from "./state.js";

const PALETTE = ["#3d7cc9", "#76b900", "#9b6ad0", "#26a69a", "#f0a02c", "#8d6e63", "#5c6bc0", "#00897b"];
const STRAGGLER = "#d9480f";
const MAX_POINTS = 400;   // iterations drawn per rank (the table has every figure)

const COLUMNS = [
  ["rank", (r) => String(r.rank), "num"],
  ["source_file", (r) => r.source_file || "—", "path"],
  ["n_visible_gpus", (r) => fmtInt(r.gpus), "num"],
  ["iter_aggregated", (r) => fmtInt(r.iterations), "num"],
  ["avg_iteration_time", (r) => fmtNs(r.avg_iteration_time), "num"],
  ["max_iteration_time", (r) => fmtNs(r.max_iteration_time), "num"],
  ["gpu_utilization", (r) => fmtPct(r.gpu_utilization), "num"],
  ["communication_time", (r) => fmtNs(r.communication_time), "num"],
  ["overlapped_communication_pct", (r) => fmtPct(r.overlapped_communication_pct), "num"],
  ["times_slowest", (r) => fmtInt(r.times_slowest), "num"],
];

function colorOf(rank, index, stragglers) {
  return stragglers.includes(rank) ? STRAGGLER : PALETTE[index % PALETTE.length];
}

/** Iteration time per rank, one line each over the iteration index (aggregated iterations). */
function iterationChart(data) {
  const W = 900, H = 260;
  const m = {left: 68, right: 12, top: 16, bottom: 34};
  const pw = W - m.left - m.right, ph = H - m.top - m.bottom;
  // an iteration a rank does not have (its tail after the last key node: no time) is absent from its line, not
  // a point at 0
  const series = data.ranks.map((r, i) => ({rank: r.rank, color: colorOf(r.rank, i, data.stragglers),
    points: (data.iterations[String(r.rank)] || []).filter((it) => it.aggregated && !isEmptyIteration(it)).slice(0, MAX_POINTS)}));
  const svg = s("svg", {viewBox: `0 0 ${W} ${H}`, class: "rank-lines", role: "img", "aria-label": "Iteration time per rank", preserveAspectRatio: "xMidYMid meet"});
  const all = series.flatMap((x) => x.points);
  if (!all.length) return svg;
  const maxIt = Math.max(1, ...all.map((p) => p.iteration));
  const minIt = Math.min(...all.map((p) => p.iteration));
  const maxDur = Math.max(1, ...all.map((p) => p.duration));
  const x = (it) => m.left + (maxIt === minIt ? pw / 2 : ((it - minIt) / (maxIt - minIt)) * pw);
  const y = (v) => m.top + ph - (v / maxDur) * ph;
  for (let k = 0; k <= 4; k++) {
    const v = (maxDur * k) / 4;
    svg.appendChild(s("line", {x1: m.left, x2: W - m.right, y1: y(v), y2: y(v), class: "grid"}));
    svg.appendChild(s("text", {x: m.left - 6, y: y(v) + 4, "text-anchor": "end", class: "axis"}, fmtNs(v)));
  }
  for (const ser of series) {
    const straggler = data.stragglers.includes(ser.rank);
    const g = s("g", {class: ["rank-series", straggler ? "straggler" : ""], dataset: {rank: ser.rank}});
    // one polyline per run of consecutive iterations: a gap where the rank has none
    const runs = [];
    for (const p of ser.points) {
      const run = runs[runs.length - 1];
      if (run && p.iteration === run[run.length - 1].iteration + 1) run.push(p);
      else runs.push([p]);
    }
    for (const run of runs) {
      g.appendChild(s("polyline", {points: run.map((p) => `${x(p.iteration)},${y(p.duration)}`).join(" "), fill: "none",
        stroke: ser.color, "stroke-width": straggler ? 3 : 1.5}));
    }
    for (const p of ser.points) {
      g.appendChild(s("circle", {cx: x(p.iteration), cy: y(p.duration), r: straggler ? 3.5 : 2.5, fill: ser.color},
        s("title", {}, `Rank ${ser.rank}, iteration ${p.iteration}: ${fmtNs(p.duration)}`)));
    }
    svg.appendChild(g);
  }
  svg.appendChild(s("text", {x: m.left, y: H - m.bottom + 15, class: "axis"}, String(minIt)));
  svg.appendChild(s("text", {x: W - m.right, y: H - m.bottom + 15, "text-anchor": "end", class: "axis"}, String(maxIt)));
  svg.appendChild(s("text", {x: m.left + pw / 2, y: H - 4, "text-anchor": "middle", class: "axis-title"}, "Iteration"));
  return svg;
}

function rankTable(data) {
  return h("div", {class: "dt-scroll"}, h("table", {class: "dt rank-table"},
    h("thead", {}, h("tr", {}, COLUMNS.map(([key, , cls]) => term("th", key, {class: cls})), h("th", {}, ""))),
    h("tbody", {}, data.ranks.map((r) => h("tr", {class: [r.straggler ? "straggler" : "", String(r.rank) === String(state.rank) ? "selected" : ""],
      dataset: {rank: r.rank}},
    COLUMNS.map(([key, fn, cls], i) => h("td", {class: cls, title: key === "source_file" ? r.source_file : null},
      fn(r), i === 0 && r.straggler ? h("span", {class: "badge straggler-badge", title: "Consistently slower than the median rank"}, "straggler") : null)),
    h("td", {}, h("button", {type: "button", class: "secondary", onClick: () => update({rank: String(r.rank), view: "dashboard"}),
      title: `Show rank ${r.rank} in every view`}, "Show")))))));
}

function findingsList(findings) {
  if (!findings.length) return placeholder("No problem found across the ranks.");
  return h("ul", {class: "findings"}, findings.map((f) => h("li", {class: `finding sev-${String(f.severity || "info").toLowerCase()}`, dataset: {expSys: f.exp_sys_id || ""}},
    h("div", {class: "finding-head"}, h("span", {class: "badge"}, f.severity || "info"), h("span", {class: "finding-problem"}, f.problem)),
    h("div", {class: "finding-rec"}, f.recommendation || ""),
    f.link ? h("a", {href: f.link, target: "_blank", rel: "noopener noreferrer", class: "finding-link"}, "Learn more") : null)));
}

export function mount(el) {
  let alive = true;
  el.appendChild(loading("Loading ranks…"));
  tryGet("rank_summary", scope()).then((data) => {
    if (!alive) return;
    if (!data) {
      replace(el, placeholder("Could not load the ranks."));
      return;
    }
    if (!data.ranks.length) {
      replace(el, placeholder("This run has one rank. Analyse the profiles of several ranks together " +
        "(dlprof --database=r0.sqlite,r1.sqlite,…, a folder or a glob) to compare them here."));
      return;
    }
    const chart = card("Iteration Time per Rank", {wide: true, id: "rank-iterations",
      tooltip: "Duration of every aggregated iteration of each rank, matched by iteration index; stragglers in red"});
    chart.body.appendChild(iterationChart(data));
    chart.body.appendChild(legend(data.ranks.map((r, i) => ({key: `rank-${r.rank}`, color: colorOf(r.rank, i, data.stragglers),
      label: `Rank ${r.rank}${r.straggler ? " (straggler)" : ""}`}))));
    const table = card("Ranks", {wide: true, id: "rank-table",
      tooltip: "One row per rank, as dlprof_ranks.csv: times over the aggregated iterations; Times Slowest counts the matched iterations the rank finished last"});
    table.body.appendChild(rankTable(data));
    const findings = card("Findings Across Ranks", {wide: true, id: "rank-findings"});
    findings.body.appendChild(findingsList(data.findings || []));
    replace(el, chart.card, table.card, findings.card);
  });
  return () => {
    alive = false;
  };
}
