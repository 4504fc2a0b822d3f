// A device's memory over a time window as an SVG step chart: allocated memory filled, reserved memory dashed
// (where the profile records it), iterations marked. The points are the levels the engine stored after each
// event (the `memory` route); each holds until the next. Used by the Memory view and the Timeline's memory track.

import {h, s} from "./dom.js";
import {fmtBytes, fmtInt, fmtOffsetNs} from "./format.js";

const PAD_TOP = 8;
const PAD_BOTTOM = 16;

/** Step path "M x0 y0 H x1 V y1 ..." of levels holding from each time to the next (to t1); null levels break
 * it. */
function stepPath(times, levels, x, y, xEnd) {
  let d = "";
  let open = false;
  for (let i = 0; i < times.length; i++) {
    const v = levels[i];
    if (v === null || v === undefined) {
      open = false;
      continue;
    }
    const x0 = x(times[i]);
    d += open ? `V${y(v).toFixed(1)}` : `M${x0.toFixed(1)},${y(v).toFixed(1)}`;
    d += `H${(i + 1 < times.length ? x(times[i + 1]) : xEnd).toFixed(1)}`;
    open = true;
  }
  return d;
}

/** The index of the step holding at time t (the last point at or before it), -1 before the first. */
function stepAt(times, t) {
  let lo = 0;
  let hi = times.length - 1;
  let found = -1;
  while (lo <= hi) {
    const mid = (lo + hi) >> 1;
    if (times[mid] <= t) {
      found = mid;
      lo = mid + 1;
    } else hi = mid - 1;
  }
  return found;
}

/**
 * series: {device, t: [...], allocated: [...], reserved: [...]} (the `memory` route's); t0, t1: the window.
 * labelWidth: a left column for the device's name (the timeline aligns it with its own); iterations: [{iteration,
 * start, end, aggregated}] to mark; origin: where time offsets count from; onBrush(ta, tb): a dragged range.
 * Returns {el, svg}.
 */
export function memoryChart(series, {t0, t1, width, height = 140, labelWidth = 0, iterations = [], origin = t0, onBrush = null, compact = false}) {
  const plotW = Math.max(10, width - labelWidth);
  const x = (t) => labelWidth + ((t - t0) / Math.max(1, t1 - t0)) * plotW;
  const known = (list) => list.filter((v) => v !== null && v !== undefined);
  const highest = Math.max(0, ...known(series.allocated), ...known(series.reserved));
  const top = Math.max(1, highest);
  const y = (v) => PAD_TOP + (1 - v / top) * (height - PAD_TOP - PAD_BOTTOM);
  const svg = s("svg", {class: "memory-chart", width, height, viewBox: `0 0 ${width} ${height}`, role: "img",
    "aria-label": `${series.device} memory over time`, dataset: {device: series.device, points: series.t.length}});
  const bottom = height - PAD_BOTTOM;
  for (const it of iterations) {
    if (it.end <= t0 || it.start >= t1) continue;
    const a = Math.max(x(it.start), labelWidth);
    const b = Math.min(x(it.end), labelWidth + plotW);
    if (it.aggregated) svg.appendChild(s("rect", {class: "iteration-band", x: a, y: PAD_TOP, width: Math.max(0, b - a), height: bottom - PAD_TOP}));
    if (it.start >= t0) {
      svg.appendChild(s("line", {class: "iteration-mark", x1: a, x2: a, y1: PAD_TOP, y2: bottom, dataset: {iteration: it.iteration}}));
      if (!compact && b - a > 24) svg.appendChild(s("text", {class: "iteration-label", x: a + 3, y: height - 4}, `iteration ${it.iteration}`));
    }
  }
  const xEnd = labelWidth + plotW;
  const area = stepPath(series.t, series.allocated, x, y, xEnd);
  if (area) {
    svg.appendChild(s("path", {class: "allocated-area", d: `${area}V${bottom}H${x(series.t[0]).toFixed(1)}Z`}));
    svg.appendChild(s("path", {class: "allocated-line", d: area}));
  }
  const reserved = stepPath(series.t, series.reserved, x, y, xEnd);
  if (reserved) svg.appendChild(s("path", {class: "reserved-line", d: reserved}));
  svg.appendChild(s("line", {class: "axis", x1: labelWidth, x2: xEnd, y1: bottom, y2: bottom}));
  for (const v of compact || !highest ? [highest] : [highest, highest / 2]) {
    svg.appendChild(s("text", {class: "level-label", x: xEnd - 4, y: y(v) + 10, "text-anchor": "end"}, fmtBytes(v)));
  }
  if (labelWidth) svg.appendChild(s("text", {class: "device-label", x: 6, y: height / 2 + 4}, `${series.device} memory`));
  const hoverLine = s("line", {class: "hover-line", y1: PAD_TOP, y2: bottom, visibility: "hidden"});
  const brush = s("rect", {class: "brush", y: PAD_TOP, height: bottom - PAD_TOP, visibility: "hidden"});
  svg.append(hoverLine, brush);
  const tip = h("div", {class: "chart-tip memory-tip", role: "tooltip", hidden: true});
  const el = h("div", {class: "memory-chart-wrap chart-wrap", dataset: {device: series.device}}, svg, tip);
  const timeAt = (px) => t0 + ((px - labelWidth) / plotW) * (t1 - t0);
  const local = (ev) => {   // in the chart's own units (the SVG may be drawn wider or narrower than `width`)
    const box = svg.getBoundingClientRect();
    return ((ev.clientX - box.left) * width) / Math.max(1, box.width);
  };
  let drag = null;
  svg.addEventListener("mousemove", (ev) => {
    const px = local(ev);
    if (px < labelWidth) {
      tip.hidden = true;
      return;
    }
    if (drag) {
      brush.setAttribute("x", Math.min(drag, px));
      brush.setAttribute("width", Math.abs(px - drag));
      brush.setAttribute("visibility", "visible");
    }
    const t = timeAt(px);
    const i = stepAt(series.t, t);
    hoverLine.setAttribute("x1", px);
    hoverLine.setAttribute("x2", px);
    hoverLine.setAttribute("visibility", "visible");
    if (i < 0) {
      tip.hidden = true;
      return;
    }
    const row = (k, v, title = "") => h("div", {class: "tip-row"}, h("span", {class: "k"}, k), h("span", {class: "v", title}, v));
    const r = series.reserved[i];
    tip.replaceChildren(h("div", {class: "tip-title"}, series.device),
      row("Time", fmtOffsetNs(Math.round(t) - origin)),
      row("Allocated", fmtBytes(series.allocated[i]), `${fmtInt(series.allocated[i])} bytes`),
      row("Reserved", r === null || r === undefined ? "not recorded" : fmtBytes(r), r === null || r === undefined ? "" : `${fmtInt(r)} bytes`));
    tip.hidden = false;
    const shown = (px * svg.getBoundingClientRect().width) / width;   // back in page pixels
    tip.style.left = `${shown + 14 + tip.offsetWidth > el.clientWidth ? shown - tip.offsetWidth - 10 : shown + 14}px`;
    tip.style.top = `${PAD_TOP}px`;
    tip.dataset.allocated = String(series.allocated[i]);
  });
  svg.addEventListener("mouseleave", () => {
    tip.hidden = true;
    hoverLine.setAttribute("visibility", "hidden");
  });
  if (onBrush) {
    svg.addEventListener("mousedown", (ev) => {
      if (ev.button === 0 && local(ev) >= labelWidth) drag = local(ev);
    });
    svg.addEventListener("mouseup", (ev) => {
      if (drag === null) return;
      const a = drag;
      const b = local(ev);
      drag = null;
      brush.setAttribute("visibility", "hidden");
      if (Math.abs(b - a) > 3) onBrush(Math.round(timeAt(Math.min(a, b))), Math.round(timeAt(Math.max(a, b))));
    });
  }
  return {el, svg};
}
