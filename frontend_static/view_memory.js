// Memory: per device its allocated and reserved memory over the profile (iterations marked, the aggregated ones
// shaded; drag over a chart to zoom), the memory report's Devices figures and its Ops table (the allocations and
// frees during each op's calls, and the device's peak while they ran). Every figure is the engine's (the `memory`
// route and table/memory_ops read what the analysis stored).

import {getJSON, reportError} from "./api.js";
import {showOp} from "./details.js";
import {card, h, loading, replace} from "./dom.js";
import {fmtBytes, fmtInt, fmtNs} from "./format.js";
import {memoryChart} from "./memory_chart.js";
import {scope} from "./state.js";
import {DataTable} from "./table.js";

const HOW_TO_RECORD = [
  ["dlprof --detailed_mode python train.py", "profiles with Nsight Systems' --cuda-memory-usage=true (or, with --backend=torch, torch.profiler's profile_memory=True)"],
  ["nsys profile --cuda-memory-usage=true ...", "then dlprof --database=report.nsys-rep"],
  ["torch.profiler.profile(profile_memory=True, ...)", "then dlprof --database=trace.pt.trace.json.gz"],
];

function bytesCell(v) {
  return h("td", {class: "num", title: v === null || v === undefined ? "" : `${fmtInt(v)} bytes`}, fmtBytes(v));
}

function deviceTable(devices) {
  const head = ["Device", "Peak Allocated", "Peak Reserved", "Allocated at End", "Allocations", "Frees"];
  return h("div", {class: "dt-scroll"}, h("table", {class: "dt memory-devices-table"},
    h("thead", {}, h("tr", {}, head.map((label, i) => h("th", {class: i ? "num" : ""}, label)))),
    h("tbody", {}, devices.map((d) => h("tr", {dataset: {device: d.device}},
      h("td", {}, d.device), bytesCell(d.peak_allocated),
      d.peak_reserved === null ? h("td", {class: "num muted", title: "The profile records no reserved memory for it"}, "not recorded") : bytesCell(d.peak_reserved),
      bytesCell(d.allocated_at_end), h("td", {class: "num"}, fmtInt(d.allocations)), h("td", {class: "num"}, fmtInt(d.frees)))))));
}

export function mount(el) {
  let alive = true;
  let controller = null;
  let extent = null;
  const devices = card("Memory by Device", {wide: true, id: "memory-devices",
    tooltip: "Over the aggregated iterations: the highest allocated and reserved memory of each device, what is allocated at the end, and the allocations and frees (the memory report's Devices section)."});
  const over = card("Memory over Time", {wide: true, id: "memory-time",
    tooltip: "Allocated memory (filled) and reserved memory (dashed, where the profile records it) after every allocation and free; iterations are marked, the aggregated ones shaded. Drag over a chart to zoom in."});
  const ops = card("Ops", {wide: true, id: "memory-ops",
    tooltip: "Per op and device: the allocations and frees during its calls in the aggregated iterations, and the device's highest allocated memory while one of its calls ran. Select an op for its details."});
  const reset = h("button", {type: "button", class: "secondary", id: "memory-reset", disabled: true}, "Whole profile");
  const info = h("div", {class: "muted", id: "memory-window", "aria-live": "polite"});
  const charts = h("div", {class: "memory-charts", id: "memory-charts"});
  const legend = h("ul", {class: "legend inline"},
    [["Allocated", "memory-allocated"], ["Reserved", "memory-reserved"], ["Aggregated iterations", "memory-aggregated"]]
      .map(([label, cls]) => h("li", {}, h("span", {class: `swatch ${cls}`}), h("span", {class: "legend-label"}, label))));
  over.body.append(h("div", {class: "chart-toolbar"}, reset, info), charts, legend);
  const table = new DataTable({route: "table/memory_ops", scope, exportName: "memory_ops", pageSize: 25, selectable: true,
    rowKey: "op_index", onSelect: (row) => row.op_index !== undefined && showOp(row.op_index)});
  ops.body.appendChild(table.el);
  devices.body.appendChild(loading("Loading memory…"));
  el.append(devices.card, over.card, ops.card);

  function showNotRecorded(message) {
    over.card.hidden = true;
    ops.card.hidden = true;
    replace(devices.body, h("div", {class: "empty-state", id: "memory-none"},
      h("p", {}, message),
      h("p", {}, "Memory events are recorded with:"),
      h("ul", {class: "memory-how"}, HOW_TO_RECORD.map(([command, note]) => h("li", {}, h("code", {}, command), ` — ${note}`)))));
  }

  async function load(t0, t1) {
    if (controller) controller.abort();
    controller = new AbortController();
    const width = Math.max(300, Math.round(charts.clientWidth || over.body.clientWidth || 900));
    const params = {...scope(), width};
    if (t0 !== undefined) Object.assign(params, {t0, t1});
    el.dataset.ready = "";
    let doc;
    try {
      doc = await getJSON("memory", params, {signal: controller.signal});
    } catch (err) {
      if (err.name === "AbortError" || !alive) return;
      replace(devices.body, h("div", {class: "placeholder"}, `Could not load the memory: ${err.message}`));
      reportError(err);
      return;
    }
    if (!alive) return;
    el.dataset.recorded = doc.recorded ? "1" : "0";
    if (!doc.recorded) {
      showNotRecorded(doc.message);
      el.dataset.ready = "1";
      return;
    }
    extent = extent || doc.extent;
    replace(devices.body, deviceTable(doc.devices));
    const [w0, w1] = doc.window;
    reset.disabled = w0 === extent[0] && w1 === extent[1];
    info.textContent = `${fmtNs(w1 - w0)} in view · ${fmtInt(doc.series.reduce((n, x) => n + x.events, 0))} allocations and frees`;
    replace(charts, doc.series.map((series) => h("div", {class: "memory-device", dataset: {device: series.device}},
      h("div", {class: "memory-device-name"}, series.device, h("span", {class: "muted"}, ` · ${fmtInt(series.events)} ${series.events === 1 ? "event" : "events"} in view`)),
      memoryChart(series, {t0: w0, t1: w1, width, height: 150, iterations: doc.iterations, origin: extent[0],
        onBrush: (a, b) => load(a, b)}).el)));
    el.dataset.window = `${w0},${w1}`;
    el.dataset.ready = "1";
  }
  reset.addEventListener("click", () => extent && load(extent[0], extent[1]));
  load();
  return () => {
    alive = false;
    if (controller) controller.abort();
  };
}
