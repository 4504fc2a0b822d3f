// Plain SVG / HTML charts: donut pie, per-iteration stacked bars, horizontal stacked bar, progress bar.

import {h, s} from "./dom.js";
import {fmtNs, fmtPct} from "./format.js";
import {definition, label, termAttrs} from "./metrics.js";

export const COLORS = {
  tc: "#76b900",          // NVIDIA green: Tensor Core kernels
  non_tc: "#3d7cc9",
  memory: "#f0a02c",
  dataloader: "#9b6ad0",
  io: "#26a69a",
  cpu: "#e0605a",
  other: "#b9c0c8",
  outside: "#e4e7eb",
  marker: "#d9480f",
};

function arcPath(cx, cy, r, inner, a0, a1) {
  const large = a1 - a0 > Math.PI ? 1 : 0;
  const p = (rad, ang) => [cx + rad * Math.sin(ang), cy - rad * Math.cos(ang)];
  const [x0, y0] = p(r, a0);
  const [x1, y1] = p(r, a1);
  const [x2, y2] = p(inner, a1);
  const [x3, y3] = p(inner, a0);
  return `M${x0},${y0} A${r},${r} 0 ${large} 1 ${x1},${y1} L${x2},${y2} A${inner},${inner} 0 ${large} 0 ${x3},${y3} Z`;
}

/**
 * Donut chart. slices: [{key, term (its label and definition), value (percent or any weight), color}].
 * Returns an element holding the SVG and a legend.
 */
export function donut(slices, {size = 180, center = "", centerSub = "", legend = true, ariaLabel = "Pie chart"} = {}) {
  const total = slices.reduce((acc, sl) => acc + Math.max(0, Number(sl.value) || 0), 0);
  const r = size / 2 - 2;
  const inner = r * 0.62;
  const c = size / 2;
  const svg = s("svg", {viewBox: `0 0 ${size} ${size}`, width: size, height: size, role: "img", "aria-label": ariaLabel, class: "donut"});
  if (total <= 0) {
    svg.appendChild(s("circle", {cx: c, cy: c, r: (r + inner) / 2, fill: "none", stroke: COLORS.outside, "stroke-width": r - inner}));
  } else {
    let angle = 0;
    for (const sl of slices) {
      const v = Math.max(0, Number(sl.value) || 0);
      if (v <= 0) continue;
      const sweep = (v / total) * 2 * Math.PI;
      const title = s("title", {}, `${label(sl.term)}: ${fmtPct((100 * v) / total)} — ${definition(sl.term)}`);
      if (sweep >= 2 * Math.PI - 1e-6) {
        svg.appendChild(s("circle", {cx: c, cy: c, r: (r + inner) / 2, fill: "none", stroke: sl.color, "stroke-width": r - inner, dataset: {key: sl.key}}, title));
      } else {
        svg.appendChild(s("path", {d: arcPath(c, c, r, inner, angle, angle + sweep), fill: sl.color, class: "slice", dataset: {key: sl.key}}, title));
      }
      angle += sweep;
    }
  }
  if (center) svg.appendChild(s("text", {x: c, y: c + (centerSub ? 2 : 7), "text-anchor": "middle", class: "donut-center"}, center));
  if (centerSub) svg.appendChild(s("text", {x: c, y: c + 20, "text-anchor": "middle", class: "donut-sub"}, centerSub));
  const wrap = h("div", {class: "donut-wrap"}, svg);
  if (legend) {
    wrap.appendChild(h("ul", {class: "legend"}, slices.map((sl) => h("li", termAttrs(sl.term, {dataset: {key: sl.key}}),
      h("span", {class: "swatch", style: {background: sl.color}}),
      h("span", {class: "legend-label"}, label(sl.term)),
      h("span", {class: "legend-value"}, sl.display !== undefined ? sl.display : fmtPct(sl.value))))));
  }
  return wrap;
}

function niceStep(max, ticks) {
  const raw = max / ticks;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const norm = raw / mag;
  const step = norm <= 1 ? 1 : norm <= 2 ? 2 : norm <= 2.5 ? 2.5 : norm <= 5 ? 5 : 10;
  return step * mag;
}

/** The summary's time classes, in stacking order (DESIGN.md "Summary time breakdown"): busy wall time. */
export const TIME_CLASSES = [
  {key: "tc", field: "tc_time", term: "busy_tc"},
  {key: "non_tc", field: "non_tc_time", term: "busy_non_tc"},
  {key: "memory", field: "memory_time", term: "busy_memory"},
  {key: "dataloader", field: "dataloader_time", term: "busy_dataloader"},
  {key: "io", field: "io_time", term: "busy_io"},
  {key: "cpu", field: "cpu_time", term: "busy_cpu"},
  {key: "other", field: "other_time", term: "busy_other"},
];

/** Whether an iteration has no time at all (the tail after the last key node when the profile ends there):
 * charts draw it as absent, not as a bar of 0. */
export function isEmptyIteration(it) {
  return !(Number(it.duration) > 0);
}

/** Split an iteration into stacked bar segments: its seven time classes (they partition the iteration);
 * iterations outside the aggregation are one grey segment. */
export function iterationSegments(it) {
  const duration = Math.max(0, Number(it.duration) || 0);
  if (!it.aggregated) return [{key: "outside", value: duration}];
  return TIME_CLASSES.map((c) => ({key: c.key, value: Math.max(0, Number(it[c.field]) || 0)}));
}

/** Legend entries of the iteration charts: the classes present in these iterations, then the grey. */
export function iterationLegend(iterations) {
  const present = new Set();
  for (const it of iterations) for (const seg of iterationSegments(it)) if (seg.value > 0) present.add(seg.key);
  const items = TIME_CLASSES.filter((c) => present.has(c.key) || c.key === "tc" || c.key === "non_tc" || c.key === "other")
    .map((c) => ({key: c.key, term: c.term}));
  items.push({key: "outside", term: "outside"});
  return items;
}

/**
 * Per-iteration stacked bars (the seven time classes; iterations outside the aggregation in grey).
 * opts: {range: [a, b] aggregated range to shade, markers: {start, stop} selected boundaries,
 *        onHover(it|null, event), onClick(it), onDblClick(it), height}
 */
export function iterationBars(all, opts = {}) {
  // an iteration without any time (the tail after the profile's last key node) is absent, not a bar of 0
  const iterations = all.filter((it) => !isEmptyIteration(it));
  const W = 900;
  const H = opts.height || 240;
  const m = {left: 68, right: 12, top: 22, bottom: 34};
  const pw = W - m.left - m.right;
  const ph = H - m.top - m.bottom;
  const n = iterations.length;
  const svg = s("svg", {viewBox: `0 0 ${W} ${H}`, class: "bars", role: "img", "aria-label": opts.ariaLabel || "Iterations chart", preserveAspectRatio: "xMidYMid meet"});
  if (!n) return svg;
  const maxDur = Math.max(1, ...iterations.map((it) => Number(it.duration) || 0));
  const step = niceStep(maxDur, 4);
  const yMax = Math.ceil(maxDur / step) * step;
  const y = (v) => m.top + ph - (v / yMax) * ph;
  const band = pw / n;
  const barW = Math.max(1, Math.min(60, band * 0.72));
  const indexOf = new Map(iterations.map((it, i) => [Number(it.iteration), i]));
  const xOf = (i) => m.left + i * band;

  // the first and last drawn bar of an iteration range (an absent iteration at its ends is left out)
  const span = (a, b) => {
    const inside = iterations.map((it, i) => [Number(it.iteration), i]).filter(([k]) => k >= Number(a) && k <= Number(b));
    return inside.length ? [inside[0][1], inside[inside.length - 1][1]] : null;
  };
  // Shaded aggregated range, drawn first (behind the bars).
  const shaded = opts.range ? span(opts.range[0], opts.range[1]) : null;
  if (shaded) {
    const [i0, i1] = shaded;
    svg.appendChild(s("rect", {x: xOf(i0), y: m.top, width: (i1 - i0 + 1) * band, height: ph, class: "range-shade"}));
    svg.appendChild(s("text", {x: xOf(i0) + 4, y: m.top - 7, class: "range-label"},
      `Aggregated: iteration${i1 > i0 ? "s" : ""} ${opts.range[0]}${i1 > i0 ? `–${opts.range[1]}` : ""}`));
  }
  // Grid and y axis.
  for (let v = 0; v <= yMax + 1e-9; v += step) {
    svg.appendChild(s("line", {x1: m.left, x2: W - m.right, y1: y(v), y2: y(v), class: "grid"}));
    svg.appendChild(s("text", {x: m.left - 6, y: y(v) + 4, "text-anchor": "end", class: "axis"}, fmtNs(v)));
  }
  // Bars.
  const labelEvery = Math.max(1, Math.ceil(n / 30));
  iterations.forEach((it, i) => {
    const g = s("g", {class: ["bar", it.aggregated ? "" : "outside"], dataset: {iteration: it.iteration}, tabindex: opts.onClick ? 0 : null});
    const x = xOf(i) + (band - barW) / 2;
    let acc = 0;
    for (const seg of iterationSegments(it)) {
      if (seg.value <= 0) continue;
      g.appendChild(s("rect", {x, width: barW, y: y(acc + seg.value), height: Math.max(0.5, y(acc) - y(acc + seg.value)), fill: COLORS[seg.key], class: `seg seg-${seg.key}`}));
      acc += seg.value;
    }
    // Invisible hit area over the whole band so thin bars are easy to hover.
    g.appendChild(s("rect", {x: xOf(i), y: m.top, width: band, height: ph, class: "hit"}));
    if (opts.onHover) {
      g.addEventListener("mouseenter", (ev) => opts.onHover(it, ev));
      g.addEventListener("mousemove", (ev) => opts.onHover(it, ev));
      g.addEventListener("mouseleave", (ev) => opts.onHover(null, ev));
    } else {
      g.appendChild(s("title", {}, `Iteration ${it.iteration}: ${fmtNs(it.duration)}`));
    }
    if (opts.onClick) g.addEventListener("click", () => opts.onClick(it));
    if (opts.onDblClick) g.addEventListener("dblclick", () => opts.onDblClick(it));
    svg.appendChild(g);
    if (i % labelEvery === 0) {
      svg.appendChild(s("text", {x: xOf(i) + band / 2, y: H - m.bottom + 15, "text-anchor": "middle", class: "axis"}, String(it.iteration)));
    }
  });
  svg.appendChild(s("line", {x1: m.left, x2: W - m.right, y1: y(0), y2: y(0), class: "baseline"}));
  svg.appendChild(s("text", {x: m.left + pw / 2, y: H - 4, "text-anchor": "middle", class: "axis-title"}, "Iteration"));

  // Selected boundaries (Iterations view spinners).
  if (opts.markers) {
    const {start, stop} = opts.markers;
    const mark = (xPos, label, cls) => {
      svg.appendChild(s("line", {x1: xPos, x2: xPos, y1: m.top - 4, y2: m.top + ph, class: `marker ${cls}`}));
      svg.appendChild(s("text", {x: xPos + (cls === "marker-start" ? 3 : -3), y: m.top + 10, "text-anchor": cls === "marker-start" ? "start" : "end", class: "marker-label"}, label));
    };
    if (indexOf.has(Number(start))) mark(xOf(indexOf.get(Number(start))), "Start", "marker-start");
    const last = span(start, stop);
    if (last && (indexOf.has(Number(stop)) || all.some((it) => Number(it.iteration) === Number(stop)))) {
      mark(xOf(last[1]) + band, "Stop", "marker-stop");
    }
  }
  return svg;
}

/** Chart legend from [{key, term, color}] (labels and tooltips from the terms), or [{key, label, color,
 * title}] for labels that are values (a rank's number). */
export function legend(items) {
  return h("ul", {class: "legend inline"}, items.map((it) => h("li", it.term ? termAttrs(it.term, {dataset: {key: it.key}})
    : {title: it.title || "", dataset: {key: it.key, value: "1"}},
  h("span", {class: "swatch", dataset: {key: it.key}, style: {background: COLORS[it.key] || it.color}}),
  h("span", {class: "legend-label"}, it.term ? label(it.term) : it.label))));
}

/** Horizontal stacked bar (HTML) from [{key, term, pct}]. */
export function stackedBar(parts, {ariaLabel = ""} = {}) {
  const bar = h("div", {class: "hstack", role: "img", "aria-label": ariaLabel});
  for (const p of parts) {
    const pct = Math.max(0, Number(p.pct) || 0);
    if (pct <= 0) continue;
    bar.appendChild(h("div", {class: "hstack-seg", style: {width: `${Math.min(100, pct)}%`, background: COLORS[p.key] || p.color}, title: `${label(p.term)}: ${fmtPct(pct)}`, dataset: {key: p.key}}));
  }
  return bar;
}

/** A progress bar with a caption, e.g. a time and its percentage. */
export function progress(pct, caption, title = "") {
  const v = Math.max(0, Math.min(100, Number(pct) || 0));
  return h("div", {class: "progress", title},
    h("div", {class: "progress-track"}, h("div", {class: "progress-fill", style: {width: `${v}%`}})),
    h("span", {class: "progress-caption"}, caption));
}
