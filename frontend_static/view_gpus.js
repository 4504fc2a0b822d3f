// GPUs: per-GPU utilization bars and a properties table.

import {tryGet} from "./api.js";
import {legend, stackedBar} from "./charts.js";
import {card, h, loading, placeholder, replace} from "./dom.js";
import {fmtBytes, fmtInt, fmtPct} from "./format.js";
import {definition} from "./metrics.js";
import {scope} from "./state.js";

const PARTS = [
  ["tc", "tc_pct", "Tensor Core kernels", "tc_duration_pct"],
  ["non_tc", "non_tc_pct", "Non-Tensor Core kernels", "non_tc_duration_pct"],
  ["memory", "memory_pct", "Memory", "memory_duration_pct"],
  ["dataloader", "dataloader_pct", "Dataloader", "dataloader_duration_pct"],
  ["io", "io_pct", "I/O", "io_duration_pct"],
  ["cpu", "cpu_pct", "CPU", "cpu_duration_pct"],
  ["other", "other_pct", "Other", "other_duration_pct"],
];

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
      stackedBar(PARTS.map(([key, field, label]) => ({key, label, pct: g[field]})), {ariaLabel: `GPU ${g.device_id} time breakdown`}),
      h("div", {class: "gpu-util", title: definition("gpu_utilization")}, fmtPct(g.gpu_utilization))))));
    util.body.appendChild(legend(PARTS.map(([key, , label, def]) => ({key, label, title: definition(def)}))));
    const props = card("GPU Properties", {wide: true, id: "gpu-properties"});
    const cols = [["Device", (g) => fmtInt(g.device_id), "num"], ["Name", (g) => g.name || "—", ""],
      ["Compute Capability", (g) => g.compute_capability || "—", ""], ["SM Count", (g) => fmtInt(g.sm_count), "num"],
      ["Memory", (g) => fmtBytes(g.total_memory), "num"], ["GPU Utilization", (g) => fmtPct(g.gpu_utilization), "num"],
      ...PARTS.map(([, field, label]) => [label, (g) => fmtPct(g[field]), "num"])];
    props.body.appendChild(h("div", {class: "dt-scroll"}, h("table", {class: "dt gpu-props"},
      h("thead", {}, h("tr", {}, cols.map(([label, , cls]) => h("th", {class: cls}, label)))),
      h("tbody", {}, gpus.map((g) => h("tr", {dataset: {device: g.device_id}}, cols.map(([, fn, cls]) => h("td", {class: cls}, fn(g)))))))));
    replace(el, util.card, props.card);
  });
  return () => {
    alive = false;
  };
}
