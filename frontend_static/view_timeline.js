// Timeline: one iteration drawn on a <canvas>. Per CPU thread its op instances (one sub-row per nesting depth)
// and its CUDA API calls; per GPU a row of idle gaps (no kernel running) and a row per stream with its kernels,
// memcpys and memsets. Wheel zooms at the cursor, dragging pans, shift-drag zooms into a range, double-click
// zooms in; +/-/arrows/0 on the keyboard. The server sends only the window in view, merging events shorter than
// a pixel into boxes (http_api.md, `timeline`), so a view of 10^5 events stays light. Hovering a kernel draws
// the arrow from its launching API call (an API call: to its kernels in view); hovering a GPU gap tells what the
// CPU threads were doing meanwhile; clicking an op opens its details.

import {getJSON, reportError} from "./api.js";
import {showOp} from "./details.js";
import {card, h, placeholder, replace} from "./dom.js";
import {fmtInt, fmtNs, fmtNsExact, fmtOffsetNs} from "./format.js";
import {label, term, termAttrs} from "./metrics.js";
import {scope, state, update} from "./state.js";
import {memoryTrack} from "./timeline_memory.js";

const ROW_H = 24;          // readable rows: at least this tall; taller when the view has room (up to MAX_ROW_H)
const GAP_ROW_H = 20;
const MAX_ROW_H = 40;
const MIN_CANVAS_H = 240;
const AXIS_H = 26;
const LABEL_W = 240;
const KERNEL = 0;
const MEMCPY = 1;
const MEMSET = 2;
const OP = 10;
const API = 11;
const KIND_LABEL = {[KERNEL]: "Kernel", [MEMCPY]: "Memcpy", [MEMSET]: "Memset", [OP]: "Op", [API]: "CUDA API call"};
const FETCH_DELAY_MS = 90;
const GAP_COLOR = "rgba(201, 42, 42, 0.55)";
const MIN_SPAN_NS = 50;

let pendingIteration = null;

/** Open the timeline of an iteration (from another view). */
export function openIteration(iteration) {
  pendingIteration = Number(iteration);
  update({view: "timeline"});
}

function hashHue(text) {
  let x = 2166136261;
  for (let i = 0; i < text.length; i++) x = Math.imul(x ^ text.charCodeAt(i), 16777619);
  return ((x >>> 0) % 360);
}

/** The colour a box is drawn in (the legend's swatches come from here too). */
export function colorOf(kind, name, dark) {
  if (kind === MEMCPY) return "#f0a02c";
  if (kind === MEMSET) return "#9b6ad0";
  if (kind === API) return dark ? "#5d7088" : "#9fb2c6";
  const hue = hashHue(String(name || "").replace(/\[\d+\]$/, ""));   // the n-th call of an op: its colour
  return kind === OP ? `hsl(${hue}, 45%, ${dark ? 42 : 70}%)` : `hsl(${hue}, 65%, ${dark ? 45 : 52}%)`;
}

/** Rows in display order: per thread (pid, tid) its op depths then its API calls; per GPU its gap row, then
 * its streams. */
function rowOrder(r) {
  if (r.kind === "gap") return [1, r.device_id, -1, 0, 0, 0];
  if (r.kind === "gpu") return [1, r.device_id, r.stream_id, 0, 0, 0];
  return [0, r.pid ?? -1, r.tid ?? -1, r.thread_id, r.kind === "api" ? 1 : 0, r.depth || 0];
}

function compareRows(a, b) {
  const x = rowOrder(a);
  const y = rowOrder(b);
  for (let i = 0; i < x.length; i++) if (x[i] !== y[i]) return x[i] < y[i] ? -1 : 1;
  return 0;
}

export function mount(el) {
  let alive = true;
  let iterations = [];
  let iteration = null;          // {iteration, start, end}
  let view = null;               // {t0, t1}: the window in view (ns)
  let data = null;               // the last answer of the timeline route
  let byRow = new Map();         // row index of the answer -> indexes of its boxes (sorted by start)
  const rows = new Map();        // row id -> row (sticky: rows seen stay, so zooming does not move them)
  const hidden = new Set();      // groups (threads, streams) whose events are not asked for
  let layout = [];               // [{row, y, h}] in display order
  let hover = null;              // {type: "box", i} | {type: "gap", i}
  let controller = null;
  let fetchTimer = null;
  const gapCache = new Map();

  // ---- DOM ----
  const iterInput = h("input", {type: "number", id: "timeline-iteration", min: 0, step: 1, inputmode: "numeric"});
  const iterOf = h("span", {class: "muted"});
  const prevBtn = h("button", {type: "button", class: "secondary", id: "timeline-prev", title: "Previous iteration"}, "‹");
  const nextBtn = h("button", {type: "button", class: "secondary", id: "timeline-next", title: "Next iteration"}, "›");
  const zoomIn = h("button", {type: "button", class: "secondary", id: "timeline-zoom-in", title: "Zoom in (+)"}, "+");
  const zoomOut = h("button", {type: "button", class: "secondary", id: "timeline-zoom-out", title: "Zoom out (−)"}, "−");
  const reset = h("button", {type: "button", class: "secondary", id: "timeline-reset", title: "The whole iteration (0)"}, "Whole iteration");
  const windowInfo = h("div", {class: "muted timeline-info", id: "timeline-window", "aria-live": "polite"});
  const notice = h("div", {class: "validation timeline-notice", id: "timeline-notice", role: "status", hidden: true});
  const canvas = h("canvas", {id: "timeline-canvas", tabindex: 0, role: "img", "aria-label": "Timeline of the iteration"});
  const tip = h("div", {class: "chart-tip timeline-tip", role: "tooltip", hidden: true});
  const wrap = h("div", {class: "timeline-wrap"}, canvas, tip);
  const legend = h("ul", {class: "legend inline timeline-legend", id: "timeline-legend"});
  const main = card("Timeline", {wide: true, id: "timeline",
    tooltip: "One iteration: CPU threads with their op ranges (nesting as sub-rows) and CUDA API calls; GPUs with their idle gaps and, per stream, kernels and memory operations. Wheel: zoom at the cursor; drag: pan; shift-drag: zoom into a range; double-click: zoom in; keys + − ← → 0. Hover a kernel for its launch arrow, a GPU gap for what the CPU did meanwhile; click an op for its details."});
  main.body.append(
    h("div", {class: "chart-toolbar timeline-toolbar"},
      h("div", {class: "field inline"}, h("label", {for: "timeline-iteration"}, "Iteration"), prevBtn, iterInput, nextBtn, iterOf),
      h("div", {class: "segmented", role: "group", "aria-label": "Zoom"}, zoomOut, zoomIn, reset),
      windowInfo),
    legend, notice, wrap);   // the legend above the canvas: in sight whatever the window's height
  // each GPU's allocated memory, under the GPU rows; the rows take what the track leaves of the window
  const memory = memoryTrack({labelWidth: LABEL_W, onHeight: () => { relayout(); draw(); }});
  main.body.append(memory.el);
  el.append(main.card);

  // ---- geometry ----
  const plotWidth = () => Math.max(100, wrap.clientWidth - LABEL_W);
  const xOf = (t) => LABEL_W + ((t - view.t0) / (view.t1 - view.t0)) * plotWidth();
  const tOf = (x) => view.t0 + ((x - LABEL_W) / plotWidth()) * (view.t1 - view.t0);
  const dark = () => document.documentElement.classList.contains("dark");

  /** The height the canvas may take: the rest of the window below it, the legend kept in sight. */
  function availableHeight() {
    const top = wrap.getBoundingClientRect().top + window.scrollY;
    const below = memory.el.offsetHeight + 56;   // the memory track, the card's and the page's bottom padding
    return Math.max(MIN_CANVAS_H, window.innerHeight - top - below);
  }

  function relayout() {
    const list = [...rows.values()].sort(compareRows);
    const avail = availableHeight();
    const inner = avail - 2;   // inside the wrap's border
    const gaps = list.filter((r) => r.kind === "gap").length;
    const others = list.length - gaps;
    // rows share the available height (each at least ROW_H, at most MAX_ROW_H tall); more rows scroll
    const fit = others ? Math.floor((inner - AXIS_H - 2 - gaps * GAP_ROW_H) / others) : ROW_H;
    const rowH = Math.max(ROW_H, Math.min(MAX_ROW_H, fit));
    layout = [];
    let y = AXIS_H;
    for (const row of list) {
      const height = row.kind === "gap" ? GAP_ROW_H : rowH;
      layout.push({row, y, h: height});
      y += height;
    }
    const cssHeight = Math.max(y + 2, inner);
    const ratio = window.devicePixelRatio || 1;
    wrap.style.height = `${avail}px`;
    canvas.style.height = `${cssHeight}px`;
    canvas.style.width = "100%";
    canvas.width = Math.round(wrap.clientWidth * ratio);
    canvas.height = Math.round(cssHeight * ratio);
    el.dataset.rowHeight = String(rowH);
  }

  /** The legend of what this answer draws: each kind present (op and kernel colours follow their names). */
  function renderLegend() {
    if (!data) return;
    const isDark = dark();
    const kinds = new Set(data.events.kind);
    const spectrum = (kind) => `linear-gradient(90deg, ${["a", "e", "k", "q", "w"].map((n) => colorOf(kind, `legend-${n}`, isDark)).join(", ")})`;
    const items = [
      kinds.has(OP) ? ["tl_op", spectrum(OP), "op"] : null,
      kinds.has(API) ? ["tl_api", colorOf(API, "", isDark), "api"] : null,
      kinds.has(KERNEL) ? ["tl_kernel", spectrum(KERNEL), "kernel"] : null,
      kinds.has(MEMCPY) ? ["tl_memcpy", colorOf(MEMCPY, "", isDark), "memcpy"] : null,
      kinds.has(MEMSET) ? ["tl_memset", colorOf(MEMSET, "", isDark), "memset"] : null,
      data.gaps.start.length ? ["tl_gap", GAP_COLOR, "gap"] : null,
      data.events.n.some((n) => n > 1) ? ["tl_merged", "repeating-linear-gradient(45deg, #888 0 2px, transparent 2px 4px)", "merged"] : null,
    ].filter(Boolean);
    replace(legend, ...items.map(([key, background, kind]) => h("li", termAttrs(key, {dataset: {kind}}),
      h("span", {class: "swatch", style: {background}, dataset: {kind}}), h("span", {class: "legend-label"}, label(key)))));
  }

  // ---- data ----
  function ingest(answer) {
    data = answer;
    // the answer's rows plus a gap row per GPU in it
    for (const r of answer.rows) rows.set(r.id, r);
    for (const r of answer.rows) {
      if (r.kind === "gpu" && !rows.has(`gap${r.device_id}`)) {
        rows.set(`gap${r.device_id}`, {id: `gap${r.device_id}`, group: `gap${r.device_id}`, kind: "gap", device_id: r.device_id, label: `GPU ${r.device_id} idle`});
      }
    }
    byRow = new Map();
    const ev = answer.events;
    for (let i = 0; i < ev.row.length; i++) {
      const id = answer.rows[ev.row[i]].id;
      if (!byRow.has(id)) byRow.set(id, []);
      byRow.get(id).push(i);
    }
    data.launchOf = new Map(answer.launches.key.map((k, i) => [k, i]));
    data.kernelsOfApi = new Map();
    answer.launches.api_key.forEach((a, i) => {
      if (a === null) return;
      if (!data.kernelsOfApi.has(a)) data.kernelsOfApi.set(a, []);
      data.kernelsOfApi.get(a).push(answer.launches.key[i]);
    });
    data.colors = {};   // per theme: a colour per box, computed once per answer
    data.boxOfKey = new Map();
    ev.key.forEach((k, i) => {
      if (k !== null) data.boxOfKey.set(`${ev.kind[i] === OP ? "o" : ev.kind[i] === API ? "a" : "g"}${k}`, i);
    });
    renderLegend();
    relayout();
    draw();
    el.dataset.events = String(answer.counts.events);
    el.dataset.boxes = String(answer.counts.sent);
    el.dataset.window = `${answer.window[0]},${answer.window[1]}`;
    el.dataset.ready = "1";
  }

  async function fetchWindow() {
    if (!alive || !view) return;
    if (controller) controller.abort();
    controller = new AbortController();
    const t0 = Math.floor(view.t0);
    const t1 = Math.max(Math.ceil(view.t1), t0 + 1);
    const params = {...scope(), t0, t1, width: Math.round(plotWidth())};
    // the hidden groups (few: the user hid them one by one), not the shown ones (a profile may have 10^4 rows)
    if (hidden.size) params.hide = [...hidden].join(",");
    el.dataset.loading = "1";
    const started = performance.now();
    try {
      const answer = await getJSON("timeline", params, {signal: controller.signal});
      if (!alive) return;
      el.dataset.fetchMs = String(Math.round(performance.now() - started));
      notice.hidden = true;
      ingest(answer);
    } catch (err) {
      if (err.name === "AbortError" || !alive) return;
      if (err.status === 413) {   // more events than a window may hold: say so; opening, show its start
        notice.textContent = `${err.message}. The view shows what it had; zoom in for more.`;
        notice.hidden = false;
        if (!data) setView(view.t0, view.t0 + (view.t1 - view.t0) / 4);
        return;
      }
      notice.textContent = `Could not load the timeline: ${err.message}`;
      notice.hidden = false;
      reportError(err);
    } finally {
      if (alive) el.dataset.loading = "";
    }
  }

  function scheduleFetch() {
    clearTimeout(fetchTimer);
    fetchTimer = setTimeout(fetchWindow, FETCH_DELAY_MS);
  }

  function setView(t0, t1) {
    const span = Math.max(MIN_SPAN_NS, t1 - t0);
    view = {t0, t1: t0 + span};
    windowInfo.textContent = iteration
      ? `${fmtOffsetNs(view.t0 - iteration.start)} to ${fmtOffsetNs(view.t1 - iteration.start)} from the iteration's start · ${fmtNs(span)} in view`
      : `${fmtNs(span)} in view`;
    draw();
    scheduleFetch();
    memory.show(view.t0, view.t1, plotWidth());
  }

  function zoomAt(x, factor) {
    const t = tOf(Math.min(Math.max(x, LABEL_W), LABEL_W + plotWidth()));
    setView(t - (t - view.t0) * factor, t + (view.t1 - t) * factor);
  }

  // ---- drawing ----
  function draw() {
    if (!view) return;
    const started = performance.now();
    const ctx = canvas.getContext("2d");
    const ratio = canvas.width / Math.max(1, wrap.clientWidth);
    ctx.setTransform(ratio, 0, 0, ratio, 0, 0);
    const W = wrap.clientWidth;
    const isDark = dark();
    const styles = getComputedStyle(document.documentElement);
    const ink = styles.getPropertyValue("--ink").trim() || "#1d2329";
    const muted = styles.getPropertyValue("--muted").trim() || "#6f7b87";
    const line = styles.getPropertyValue("--line-soft").trim() || "#edf0f3";
    const panel = styles.getPropertyValue("--panel").trim() || "#fff";
    ctx.clearRect(0, 0, W, canvas.height / ratio);
    ctx.fillStyle = panel;
    ctx.fillRect(0, 0, W, canvas.height / ratio);
    ctx.font = "11px system-ui, sans-serif";
    ctx.textBaseline = "middle";
    drawAxis(ctx, W, ink, muted, line);
    let lastGroup = null;
    for (const {row, y, h: rh} of layout) {
      ctx.strokeStyle = line;
      ctx.beginPath();
      ctx.moveTo(0, y + rh - 0.5);
      ctx.lineTo(W, y + rh - 0.5);
      ctx.stroke();
      // label column
      ctx.fillStyle = hidden.has(row.group) ? muted : ink;
      let label = "";
      if (row.kind === "ops") label = row.depth === 0 || lastGroup !== row.group ? row.label : `  depth ${row.depth}`;
      else if (row.kind === "api") label = lastGroup === row.group ? "  CUDA API" : `${row.label} · CUDA API`;
      else if (row.kind === "gap" && data && data.idle[String(row.device_id)] !== undefined) {
        label = `${row.label} · ${((100 * data.idle[String(row.device_id)]) / (data.window[1] - data.window[0])).toFixed(1)} %`;
      } else label = row.label;
      if (hidden.has(row.group)) label += " (hidden)";
      lastGroup = row.group;
      ctx.save();
      ctx.beginPath();
      ctx.rect(0, y, LABEL_W - 6, rh);
      ctx.clip();
      ctx.fillText(label, 6, y + rh / 2);
      ctx.restore();
    }
    ctx.save();
    ctx.beginPath();
    ctx.rect(LABEL_W, AXIS_H, W - LABEL_W, canvas.height / ratio - AXIS_H);
    ctx.clip();
    if (data) {
      drawGaps(ctx);
      drawBoxes(ctx, isDark);
      drawArrows(ctx, ink);
    }
    drawSelection(ctx);
    ctx.restore();
    el.dataset.drawMs = String(Math.round((performance.now() - started) * 10) / 10);
  }

  function drawAxis(ctx, W, ink, muted, line) {
    const span = view.t1 - view.t0;
    const raw = span / 8;
    const mag = 10 ** Math.floor(Math.log10(raw));
    const step = [1, 2, 5, 10].map((m) => m * mag).find((s) => s >= raw) || 10 * mag;
    const origin = iteration ? iteration.start : view.t0;
    const first = Math.ceil((view.t0 - origin) / step) * step + origin;
    ctx.fillStyle = muted;
    for (let t = first; t <= view.t1; t += step) {
      const x = xOf(t);
      ctx.strokeStyle = line;
      ctx.beginPath();
      ctx.moveTo(x, AXIS_H - 6);
      ctx.lineTo(x, canvas.height);
      ctx.stroke();
      const offset = Math.round(t - origin);
      ctx.fillText(offset === 0 ? "0" : `${offset > 0 ? "+" : "−"}${fmtNs(Math.abs(offset))}`, x + 3, AXIS_H / 2);
    }
    ctx.fillStyle = ink;
  }

  function rowY(id) {
    const entry = layout.find((l) => l.row.id === id);
    return entry || null;
  }

  function drawGaps(ctx) {
    const g = data.gaps;
    for (let i = 0; i < g.start.length; i++) {
      const gapRow = rowY(`gap${g.device_id[i]}`);
      const x0 = xOf(g.start[i]);
      const x1 = xOf(g.end[i]);
      const hovered = hover && hover.type === "gap" && hover.i === i;
      // the gap row, and a light shade over the GPU's streams
      ctx.fillStyle = hovered ? "rgba(201, 42, 42, 0.9)" : GAP_COLOR;
      if (gapRow) ctx.fillRect(x0, gapRow.y + 2, Math.max(1, x1 - x0), gapRow.h - 4);
      ctx.fillStyle = "rgba(201, 42, 42, 0.07)";
      for (const l of layout) if (l.row.kind === "gpu" && l.row.device_id === g.device_id[i]) ctx.fillRect(x0, l.y, x1 - x0, l.h);
    }
  }

  function colorsFor(isDark) {
    const key = isDark ? "dark" : "light";
    if (!data.colors[key]) {
      const ev = data.events;
      const byName = new Map();
      data.colors[key] = ev.kind.map((kind, i) => {
        const k = `${kind}:${ev.name[i]}`;
        if (!byName.has(k)) byName.set(k, colorOf(kind, data.names[ev.name[i]], isDark));
        return byName.get(k);
      });
    }
    return data.colors[key];
  }

  function drawBoxes(ctx, isDark) {
    const ev = data.events;
    const W = plotWidth();
    const colors = colorsFor(isDark);
    const outlines = new Path2D();   // merged boxes' dashed outlines, stroked once (a dash per box is slow)
    for (const l of layout) {
      const list = byRow.get(l.row.id);
      if (!list) continue;
      for (const i of list) {
        let x0 = xOf(ev.start[i]);
        let x1 = xOf(ev.end[i]);
        if (x1 < LABEL_W || x0 > LABEL_W + W) continue;
        x0 = Math.max(x0, LABEL_W - 2);
        x1 = Math.min(x1, LABEL_W + W + 2);
        const w = Math.max(1, x1 - x0);
        ctx.fillStyle = colors[i];
        // a merged box: shaded by the share of its span its events keep busy
        ctx.globalAlpha = ev.n[i] > 1 ? Math.min(1, Math.max(0.25, ev.busy[i] / Math.max(1, ev.end[i] - ev.start[i]))) : 1;
        ctx.fillRect(x0, l.y + 2, w, l.h - 4);
        ctx.globalAlpha = 1;
        if (ev.n[i] > 1 && w > 3) outlines.rect(x0 + 0.5, l.y + 2.5, w - 1, l.h - 5);
        if (hover && hover.type === "box" && hover.i === i) {
          ctx.strokeStyle = isDark ? "#fff" : "#000";
          ctx.lineWidth = 1.5;
          ctx.strokeRect(x0 + 0.5, l.y + 1.5, Math.max(1, w - 1), l.h - 3);
          ctx.lineWidth = 1;
        }
        if (w > 36) {
          const name = data.names[ev.name[i]];
          ctx.fillStyle = isDark ? "#fff" : "#111";
          ctx.save();
          ctx.beginPath();
          ctx.rect(x0 + 2, l.y, w - 4, l.h);
          ctx.clip();
          ctx.fillText(ev.n[i] > 1 ? `${ev.n[i]}× ${name}` : name, x0 + 3, l.y + l.h / 2);
          ctx.restore();
        }
      }
    }
    ctx.strokeStyle = isDark ? "rgba(255,255,255,0.35)" : "rgba(0,0,0,0.35)";
    ctx.setLineDash([2, 2]);
    ctx.stroke(outlines);
    ctx.setLineDash([]);
  }

  /** Launch arrows of the hovered box: a kernel from its API call, an API call to its kernels in view. */
  function arrows() {
    if (!data || !hover || hover.type !== "box") return [];
    const ev = data.events;
    const i = hover.i;
    const out = [];
    const apiRowId = (k) => {
      const r = data.launches.api_row[k];
      return r >= 0 ? data.rows[r].id : null;
    };
    if (ev.kind[i] < OP && ev.key[i] !== null && data.launchOf.has(ev.key[i]) && data.launches.api_key[data.launchOf.get(ev.key[i])] !== null) {
      const k = data.launchOf.get(ev.key[i]);
      out.push({from: [apiRowId(k), data.launches.api_start[k]], to: [data.rows[ev.row[i]].id, ev.start[i]]});
    } else if (ev.kind[i] === API && ev.key[i] !== null && data.kernelsOfApi.has(ev.key[i])) {
      for (const key of data.kernelsOfApi.get(ev.key[i])) {
        const box = data.boxOfKey.get(`g${key}`);
        if (box !== undefined) out.push({from: [data.rows[ev.row[i]].id, ev.start[i]], to: [data.rows[ev.row[box]].id, ev.start[box]]});
      }
    }
    return out.filter((a) => a.from[0] && a.to[0]);
  }

  function drawArrows(ctx, ink) {
    const list = arrows();
    el.dataset.arrows = String(list.length);
    for (const a of list) {
      const r0 = rowY(a.from[0]);
      const r1 = rowY(a.to[0]);
      if (!r0 || !r1) continue;
      const x0 = xOf(a.from[1]);
      const y0 = r0.y + r0.h / 2;
      const x1 = xOf(a.to[1]);
      const y1 = r1.y + r1.h / 2;
      ctx.strokeStyle = ink;
      ctx.fillStyle = ink;
      ctx.lineWidth = 1.5;
      ctx.beginPath();
      ctx.moveTo(x0, y0);
      ctx.bezierCurveTo(x0, (y0 + y1) / 2, x1, (y0 + y1) / 2, x1, y1);
      ctx.stroke();
      const dir = y1 >= y0 ? -1 : 1;
      ctx.beginPath();
      ctx.moveTo(x1, y1);
      ctx.lineTo(x1 - 4, y1 + dir * 7);
      ctx.lineTo(x1 + 4, y1 + dir * 7);
      ctx.closePath();
      ctx.fill();
      ctx.lineWidth = 1;
    }
  }

  let selection = null;   // shift-drag: [x0, x1]
  function drawSelection(ctx) {
    if (!selection) return;
    ctx.fillStyle = "rgba(118, 185, 0, 0.18)";
    ctx.fillRect(Math.min(...selection), AXIS_H, Math.abs(selection[1] - selection[0]), canvas.height);
  }

  // ---- hit testing and the tooltip ----
  function layoutAt(y) {
    return layout.find((l) => y >= l.y && y < l.y + l.h) || null;
  }

  function hit(x, y) {
    if (!data || x < LABEL_W) return null;
    const l = layoutAt(y);
    if (!l) return null;
    const t = tOf(x);
    const slack = (view.t1 - view.t0) / plotWidth() * 2;   // two pixels
    if (l.row.kind === "gap") {
      const g = data.gaps;
      for (let i = 0; i < g.start.length; i++) {
        if (g.device_id[i] === l.row.device_id && t >= g.start[i] - slack && t <= g.end[i] + slack) return {type: "gap", i};
      }
      return null;
    }
    const list = byRow.get(l.row.id) || [];
    const ev = data.events;
    let best = null;
    for (const i of list) {
      if (ev.start[i] - slack <= t && t <= ev.end[i] + slack) {
        if (best === null || ev.end[i] - ev.start[i] < ev.end[best] - ev.start[best]) best = i;
      }
    }
    return best === null ? null : {type: "box", i: best};
  }

  const rel = (t) => (iteration ? fmtOffsetNs(t - iteration.start) : fmtNsExact(t));
  const tipRow = (key, v) => h("div", {class: "tip-row"}, term("span", key, {class: "k"}), h("span", {class: "v"}, v));

  /** The iteration a time falls in (of the aggregation's list). */
  function iterationAt(t) {
    let lo = 0;
    let hi = iterations.length - 1;
    while (lo <= hi) {
      const mid = (lo + hi) >> 1;
      const it = iterations[mid];
      if (t < Number(it.start)) hi = mid - 1;
      else if (t >= Number(it.end)) lo = mid + 1;
      else return it.iteration;
    }
    return null;
  }
  const iterationText = (t) => {
    const k = iterationAt(t);
    return k === null ? "—" : String(k);
  };

  function boxTip(i) {
    const ev = data.events;
    const row = data.rows[ev.row[i]];
    const name = data.names[ev.name[i]];
    if (ev.n[i] > 1) {
      return [h("div", {class: "tip-title"}, `${fmtInt(ev.n[i])} events merged`),
        h("div", {class: "muted"}, "each shorter than a pixel at this zoom, starting in this pixel; zoom in to see them"),
        tipRow("tl_row", row.label), tipRow("start_offset", rel(ev.start[i])), tipRow("span", fmtNs(ev.end[i] - ev.start[i])),
        tipRow("busy", fmtNs(ev.busy[i])), tipRow("longest", name)];
    }
    const out = [h("div", {class: "tip-title"}, name), tipRow("kind", KIND_LABEL[ev.kind[i]] || "Event"), tipRow("tl_row", row.label),
      tipRow("start_offset", rel(ev.start[i])), tipRow("duration", fmtNsExact(ev.end[i] - ev.start[i]))];
    let launchTime = ev.start[i];
    if (ev.kind[i] < OP && data.launchOf.has(ev.key[i])) {
      const k = data.launchOf.get(ev.key[i]);
      if (data.launches.api_key[k] !== null) {
        launchTime = data.launches.api_start[k];
        out.push(tipRow("launch_call", `${rel(launchTime)} (${fmtNs(ev.start[i] - launchTime)} before its start)`));
      }
      const opName = data.launches.op_name[k];
      if (opName !== null && opName !== undefined) out.push(tipRow("launching_op", data.names[opName]));
    }
    out.push(tipRow("event_iteration", iterationText(launchTime)));
    if (ev.kind[i] === OP) out.push(h("div", {class: "muted"}, "Click for the op's details"));
    return out;
  }

  async function gapTip(i) {
    const g = data.gaps;
    const t0 = g.start[i];
    const t1 = g.end[i];
    const head = [h("div", {class: "tip-title"}, `GPU ${g.device_id[i]} idle ${fmtNs(t1 - t0)}`),
      tipRow("start_offset", rel(t0)), tipRow("end_offset", rel(t1))];
    const key = `${t0}-${t1}`;
    if (!gapCache.has(key)) {
      replace(tip, ...head, h("div", {class: "muted"}, "What the CPU did…"));
      placeTip();
      try {
        gapCache.set(key, await getJSON("timeline_gap", {...scope(), t0, t1}));
      } catch (err) {
        reportError(err);
        return;
      }
    }
    if (!hover || hover.type !== "gap" || hover.i !== i || !alive) return;
    const doc = gapCache.get(key);
    const body = doc.threads.length ? doc.threads.map((t) => h("div", {class: "gap-thread"},
      h("div", {class: "gap-thread-name"}, t.label),
      tipRow("gap_ops", `${fmtNs(t.ops_time)} of ${fmtNs(t1 - t0)}`),
      t.ops.slice(0, 4).map((o) => h("div", {class: "gap-item"}, `${o.name} · ${fmtNs(o.overlap)}${o.calls > 1 ? ` (${o.calls} calls)` : ""}`)),
      tipRow("gap_api", fmtNs(t.api_calls_time)),
      t.api_calls.slice(0, 3).map((o) => h("div", {class: "gap-item"}, `${o.name} · ${fmtNs(o.overlap)}${o.calls > 1 ? ` (${o.calls} calls)` : ""}`))))
      : [h("div", {class: "muted"}, "No op or CUDA API call on any CPU thread: the host ran something unannotated (or nothing).")];
    replace(tip, ...head, h("div", {class: "tip-sub"}, "Meanwhile on the CPU:"), ...body);
    tip.dataset.gap = key;
    placeTip();
  }

  let pointer = {x: 0, y: 0};   // the last mouse position in the window
  /** The tooltip beside the pointer, inside the window (flipped left / up near its edges). */
  function placeTip() {
    tip.hidden = false;
    const w = tip.offsetWidth;
    const ht = tip.offsetHeight;
    const W = document.documentElement.clientWidth;
    const H = document.documentElement.clientHeight;
    let left = pointer.x + 16;
    if (left + w > W - 4) left = pointer.x - w - 12;
    let top = pointer.y + 14;
    if (top + ht > H - 4) top = pointer.y - ht - 10;
    tip.style.left = `${Math.max(4, Math.min(left, W - w - 4))}px`;
    tip.style.top = `${Math.max(4, Math.min(top, H - ht - 4))}px`;
  }

  function onMove(ev) {
    if (drag) return;
    pointer = {x: ev.clientX, y: ev.clientY};
    const r = canvas.getBoundingClientRect();
    const x = ev.clientX - r.left;
    const y = ev.clientY - r.top;
    const found = hit(x, y);
    const same = found && hover && found.type === hover.type && found.i === hover.i;
    hover = found;
    if (!found) {
      tip.hidden = true;
      delete tip.dataset.gap;
      if (!same) draw();
      return;
    }
    if (!same) {
      if (found.type === "box") replace(tip, ...boxTip(found.i));
      else gapTip(found.i);
      draw();
    }
    placeTip();
    canvas.style.cursor = found.type === "box" && data.events.kind[found.i] === OP ? "pointer" : "default";
  }

  // ---- interaction ----
  let drag = null;
  canvas.addEventListener("wheel", (ev) => {
    if (!view) return;
    ev.preventDefault();
    const r = canvas.getBoundingClientRect();
    zoomAt(ev.clientX - r.left, Math.exp(ev.deltaY * 0.0015));
  }, {passive: false});
  canvas.addEventListener("mousedown", (ev) => {
    if (!view || ev.button !== 0) return;
    const r = canvas.getBoundingClientRect();
    const x = ev.clientX - r.left;
    const y = ev.clientY - r.top;
    if (x < LABEL_W) {
      const l = layoutAt(y);
      if (l && l.row.kind !== "gap") {   // a label: hide or show the thread's / stream's events
        if (hidden.has(l.row.group)) hidden.delete(l.row.group);
        else hidden.add(l.row.group);
        draw();
        scheduleFetch();
      }
      return;
    }
    drag = {x, t0: view.t0, t1: view.t1, select: ev.shiftKey, moved: false};
    tip.hidden = true;
  });
  window.addEventListener("mousemove", onWindowMove);
  window.addEventListener("mouseup", onWindowUp);
  function onWindowMove(ev) {
    if (!drag) return;
    const r = canvas.getBoundingClientRect();
    const x = ev.clientX - r.left;
    if (Math.abs(x - drag.x) > 2) drag.moved = true;
    if (drag.select) {
      selection = [drag.x, Math.min(Math.max(x, LABEL_W), LABEL_W + plotWidth())];
      draw();
      return;
    }
    const dt = ((x - drag.x) / plotWidth()) * (drag.t1 - drag.t0);
    setView(drag.t0 - dt, drag.t1 - dt);
  }
  function onWindowUp(ev) {
    if (!drag) return;
    const d = drag;
    drag = null;
    if (d.select && selection && Math.abs(selection[1] - selection[0]) > 3) {
      const [a, b] = [Math.min(...selection), Math.max(...selection)].map(tOf);
      selection = null;
      setView(a, b);
      return;
    }
    selection = null;
    if (!d.moved) {   // a click
      const r = canvas.getBoundingClientRect();
      const found = hit(ev.clientX - r.left, ev.clientY - r.top);
      if (found && found.type === "box" && data.events.kind[found.i] === OP && data.events.op[found.i] !== null && data.events.n[found.i] === 1) {
        showOp(data.events.op[found.i]);
      }
      draw();
    }
  }
  canvas.addEventListener("mousemove", onMove);
  canvas.addEventListener("mouseleave", () => {
    hover = null;
    tip.hidden = true;
    draw();
  });
  canvas.addEventListener("dblclick", (ev) => {
    const r = canvas.getBoundingClientRect();
    zoomAt(ev.clientX - r.left, 0.5);
  });
  canvas.addEventListener("keydown", (ev) => {
    if (!view) return;
    const span = view.t1 - view.t0;
    const center = LABEL_W + plotWidth() / 2;
    if (ev.key === "+" || ev.key === "=") zoomAt(center, 0.5);
    else if (ev.key === "-" || ev.key === "_") zoomAt(center, 2);
    else if (ev.key === "ArrowLeft") setView(view.t0 - span * 0.2, view.t1 - span * 0.2);
    else if (ev.key === "ArrowRight") setView(view.t0 + span * 0.2, view.t1 + span * 0.2);
    else if (ev.key === "0") showWhole();
    else return;
    ev.preventDefault();
  });
  zoomIn.addEventListener("click", () => zoomAt(LABEL_W + plotWidth() / 2, 0.5));
  zoomOut.addEventListener("click", () => zoomAt(LABEL_W + plotWidth() / 2, 2));
  reset.addEventListener("click", () => showWhole());
  const resize = new ResizeObserver(() => {
    if (!view) return;
    relayout();
    draw();
    scheduleFetch();
  });
  resize.observe(wrap);
  const onResize = () => {
    if (!view) return;
    relayout();
    draw();
  };
  window.addEventListener("resize", onResize);

  // where a time on a row is drawn, in page coordinates (the browser tests point at boxes with it)
  el.timelinePoint = (rowId, t) => {
    const r = rowY(rowId);
    const box = canvas.getBoundingClientRect();
    return r && view ? {x: box.left + xOf(t), y: box.top + r.y + r.h / 2} : null;
  };
  el.timelineState = () => ({view: view && {...view}, rows: layout.map((l) => l.row.id), hidden: [...hidden],
    heights: layout.map((l) => l.h)});
  el.timelineColor = (kind, name) => colorOf(kind, name, dark());

  function showWhole() {
    if (iteration) setView(iteration.start, Math.max(iteration.end, iteration.start + 1));
  }

  function chooseIteration(n) {
    const it = iterations.find((x) => Number(x.iteration) === Number(n));
    if (!it) return;
    iteration = {iteration: Number(it.iteration), start: Number(it.start), end: Number(it.end)};
    iterInput.value = String(iteration.iteration);
    prevBtn.disabled = iteration.iteration <= Number(iterations[0].iteration);
    nextBtn.disabled = iteration.iteration >= Number(iterations[iterations.length - 1].iteration);
    rows.clear();
    gapCache.clear();
    data = null;
    el.dataset.ready = "";
    el.dataset.window = "";
    if (state.iteration !== iteration.iteration) update({iteration: iteration.iteration});
    relayout();
    showWhole();
  }
  iterInput.addEventListener("change", () => chooseIteration(Number(iterInput.value)));
  prevBtn.addEventListener("click", () => chooseIteration(iteration.iteration - 1));
  nextBtn.addEventListener("click", () => chooseIteration(iteration.iteration + 1));

  getJSON("iterations", scope()).then((doc) => {
    if (!alive) return;
    iterations = doc.iterations || [];
    if (!iterations.length) {
      replace(wrap, placeholder("This aggregation has no iteration."));
      return;
    }
    iterOf.textContent = `of ${fmtInt(iterations.length)} (aggregated ${doc.iter_start}–${doc.iter_stop})`;
    iterInput.max = String(iterations[iterations.length - 1].iteration);
    const wanted = pendingIteration ?? state.iteration;
    pendingIteration = null;
    const known = iterations.some((x) => Number(x.iteration) === Number(wanted));
    chooseIteration(known && wanted !== null ? wanted : doc.iter_start);
  }).catch((err) => {
    if (!alive) return;
    replace(wrap, placeholder(`Could not load the iterations: ${err.message}`));
    reportError(err);
  });

  return () => {
    alive = false;
    memory.stop();
    clearTimeout(fetchTimer);
    if (controller) controller.abort();
    resize.disconnect();
    window.removeEventListener("resize", onResize);
    window.removeEventListener("mousemove", onWindowMove);
    window.removeEventListener("mouseup", onWindowUp);
  };
}
