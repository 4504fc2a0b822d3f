// Plain SVG / HTML charts: donut pie, per-iteration stacked bars, horizontal stacked bar, progress bar.

import {h, s} from "./dom.js";
import {fmtNs, fmtPct} from "./format.js";

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
 * Donut chart. slices: [{key, label, value (percent or any weight), color, title}].
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
      const title = s("title", {}, sl.title || `${sl.label}: ${fmtPct((100 * v) / total)}`);
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
    wrap.appendChild(h("ul", {class: "legend"}, slices.map((sl) => h("li", {title: sl.title || "", dataset: {key: sl.key}},
      h("span", {class: "swatch", style: {background: sl.color}}),
      h("span", {class: "legend-label"}, sl.label),
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

/** The summary's time classes, in stacking order (DESIGN.md "Summary time breakdown"). */
export const TIME_CLASSES = [
  {key: "tc", field: "tc_time", label: "Tensor Core kernels"},
  {key: "non_tc", field: "non_tc_time", label: "Non-Tensor Core kernels"},
  {key: "memory", field: "memory_time", label: "Memory"},
  {key: "dataloader", field: "dataloader_time", label: "Dataloader"},
  {key: "io", field: "io_time", label: "I/O"},
  {key: "cpu", field: "cpu_time", label: "CPU", def: "cpu_time_class"},
  {key: "other", field: "other_time", label: "Other"},
];

/** Split an iteration into stacked bar segments: its seven time classes (they partition the iteration);
 * iterations outside the aggregation are one grey segment. */
export function iterationSegments(it) {
  const duration = Math.max(0, Number(it.duration) || 0);
  if (!it.aggregated) return [{key: "outside", value: duration}];
  return TIME_CLASSES.map((c) => ({key: c.key, value: Math.max(0, Number(it[c.field]) || 0)}));
}

/** Legend entries of the iteration charts: the classes present in these iterations, then the grey. */
export function iterationLegend(iterations, definition) {
  const present = new Set();
  for (const it of iterations) for (const seg of iterationSegments(it)) if (seg.value > 0) present.add(seg.key);
  const items = TIME_CLASSES.filter((c) => present.has(c.key) || c.key === "tc" || c.key === "non_tc" || c.key === "other")
    .map((c) => ({key: c.key, label: c.label, title: definition(c.def || c.field)}));
  items.push({key: "outside", label: "Outside the aggregation", title: definition("outside")});
  return items;
}

/**
 * Per-iteration stacked bars (the seven time classes; iterations outside the aggregation in grey).
 * opts: {range: [a, b] aggregated range to shade, markers: {start, stop} selected boundaries,
 *        onHover(it|null, event), onClick(it), onDblClick(it), height}
 */
export function iterationBars(iterations, opts = {}) {
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

  // Shaded aggregated range, drawn first (behind the bars).
  if (opts.range && indexOf.has(Number(opts.range[0])) && indexOf.has(Number(opts.range[1]))) {
    const i0 = indexOf.get(Number(opts.range[0]));
    const i1 = indexOf.get(Number(opts.range[1]));
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
    if (indexOf.has(Number(stop))) mark(xOf(indexOf.get(Number(stop))) + band, "Stop", "marker-stop");
  }
  return svg;
}

/** Chart legend from [{key, label, title}]. */
export function legend(items) {
  return h("ul", {class: "legend inline"}, items.map((it) => h("li", {title: it.title || "", dataset: {key: it.key}},
    h("span", {class: "swatch", dataset: {key: it.key}, style: {background: COLORS[it.key] || it.color}}),
    h("span", {class: "legend-label"}, it.label))));
}

/** Horizontal stacked bar (HTML) from [{key, label, pct}]. */
export function stackedBar(parts, {ariaLabel = ""} = {}) {
  const bar = h("div", {class: "hstack", role: "img", "aria-label": ariaLabel});
  for (const p of parts) {
    const pct = Math.max(0, Number(p.pct) || 0);
    if (pct <= 0) continue;
    bar.appendChild(h("div", {class: "hstack-seg", style: {width: `${Math.min(100, pct)}%`, background: COLORS[p.key] || p.color}, title: `${p.label}: ${fmtPct(pct)}`, dataset: {key: p.key}}));
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
