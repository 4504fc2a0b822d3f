// GPUs: per-GPU utilization bars and a properties table.

import {tryGet} from "./api.js";
import {TIME_CLASSES, legend, stackedBar} from "./charts.js";
import {card, h, loading, placeholder, replace} from "./dom.js";
import {fmtBytes, fmtInt, fmtPct} from "./format.js";
import {definition, term} from "./metrics.js";
import {scope} from "./state.js";

const PARTS = TIME_CLASSES.map((c) => ({key: c.key, term: c.term, field: `${c.key}_pct`}));

export function mount(el) {
  let alive = true;
  el.appendChild(loading("Loading GPUs…"));
  tryGet("gpus", scope()).then((data) => {
    if (!alive) return;
    const gpus = (data && data.gpus) || [];
    if (!gpus.length) {
      replace(el, placeholder(data ? "No GPUs in this profile." : "Could not load GPUs."));
      return;
    }
    const util = card("GPU Utilization", {wide: true, id: "gpu-utilization", tooltip: definition("gpu_utilization")});
    util.body.appendChild(h("div", {class: "gpu-bars"}, gpus.map((g) => h("div", {class: "gpu-row", dataset: {device: g.device_id}},
      h("div", {class: "gpu-label"}, h("strong", {}, `GPU ${g.device_id}`), h("span", {class: "muted"}, g.name || "")),
      stackedBar(PARTS.map((p) => ({key: p.key, term: p.term, pct: g[p.field]})), {ariaLabel: `GPU ${g.device_id} time breakdown`}),
      h("div", {class: "gpu-util", title: definition("gpu_utilization")}, fmtPct(g.gpu_utilization))))));
    util.body.appendChild(legend(PARTS.map((p) => ({key: p.key, term: p.term}))));
    const props = card("GPU Properties", {wide: true, id: "gpu-properties"});
    const cols = [["device_id", (g) => fmtInt(g.device_id), "num"], ["gpu_name", (g) => g.name || "—", ""],
      ["compute_capability", (g) => g.compute_capability || "—", ""], ["sm_count", (g) => fmtInt(g.sm_count), "num"],
      ["total_memory", (g) => fmtBytes(g.total_memory), "num"], ["gpu_utilization", (g) => fmtPct(g.gpu_utilization), "num"],
      ...PARTS.map((p) => [p.term, (g) => fmtPct(g[p.field]), "num"])];
    props.body.appendChild(h("div", {class: "dt-scroll"}, h("table", {class: "dt gpu-props"},
      h("thead", {}, h("tr", {}, cols.map(([key, , cls]) => term("th", key, {class: cls})))),
      h("tbody", {}, gpus.map((g) => h("tr", {dataset: {device: g.device_id}}, cols.map(([, fn, cls]) => h("td", {class: cls}, fn(g)))))))));
    replace(el, util.card, props.card);
  });
  return () => {
    alive = false;
  };
}
