// DLPROF tab entry point. TensorBoard imports this ES module inside the plugin iframe and calls render();
// dlprofviewer serves the same files. Everything is plain DOM + SVG; every fetch is relative.

import {getJSON, setErrorSink} from "./api.js";
import {clear, h, loading, placeholder} from "./dom.js";
import {clearDetails, initDetails, showOp} from "./details.js";
import {loadTerms} from "./metrics.js";
import {poll, setAggregationReloader} from "./jobs.js";
import {VIEWS, currentAggregation, currentRun, runLabel, state, subscribe, update} from "./state.js";
import {initTheme} from "./theme.js";
import {URL_KEYS, readUrlState, writeUrlState} from "./urlstate.js";
import * as dashboard from "./view_dashboard.js";
import * as opTypes from "./view_op_types.js";
import * as opsKernels from "./view_ops_kernels.js";
import * as kernelsByIteration from "./view_kernels_by_iteration.js";
import * as kernelsByOp from "./view_kernels_by_op.js";
import * as iterations from "./view_iterations.js";
import * as tensorCore from "./view_tensor_core.js";
import * as gpus from "./view_gpus.js";
import * as groupOps from "./view_group_ops.js";
import * as compare from "./view_compare.js";
import * as timeline from "./view_timeline.js";
import * as ranksView from "./view_ranks.js";
import * as memoryView from "./view_memory.js";

const VIEW_MODULES = {
  dashboard, op_types: opTypes, ops_kernels: opsKernels, kernels_by_iteration: kernelsByIteration,
  kernels_by_op: kernelsByOp, iterations, tensor_core: tensorCore, gpus, group_ops: groupOps, compare, timeline,
  ranks: ranksView, memory: memoryView,
};

const ui = {};
let unmountView = null;

function loadStylesheet() {
  if (document.getElementById("dlprof-style")) return;
  document.head.appendChild(h("link", {id: "dlprof-style", rel: "stylesheet", href: new URL("./style.css", import.meta.url).toString()}));
  if (!document.querySelector("link[rel~=icon]")) {
    document.head.appendChild(h("link", {rel: "icon", type: "image/svg+xml", href: new URL("./logo.svg", import.meta.url).toString()}));
  }
}

function logo() {
  const img = h("img", {src: new URL("./logo.svg", import.meta.url).toString(), alt: "", width: 28, height: 28, class: "logo"});
  return img;
}

// ---- error banner ----------------------------------------------------------------------------------------------
function showError(err) {
  const message = err && err.message ? err.message : String(err);
  const item = h("div", {class: "error-item", role: "alert"},
    h("span", {class: "error-icon", "aria-hidden": "true"}, "!"),
    h("span", {class: "error-text"}, message),
    h("button", {type: "button", class: "icon-button", "aria-label": "Dismiss", onClick: () => item.remove()}, "×"));
  ui.errors.appendChild(item);
  while (ui.errors.children.length > 3) ui.errors.firstChild.remove();
}

// ---- navigation pane -------------------------------------------------------------------------------------------
function select(id, label, tooltip, onChange) {
  const el = h("select", {id, onChange: () => onChange(el.value)});
  const wrap = h("div", {class: "field"}, h("label", {for: id, title: tooltip}, label), el);
  return {el, wrap};
}

function buildNav() {
  ui.run = select("run-select", "Run", "The profile (TensorBoard run) to show", (v) => selectRun(v));
  ui.rank = select("rank-select", "Rank", "The rank (one profile of a multi-rank run) every view shows", (v) => selectRank(v));
  ui.domain = select("domain-select", "Domain", "NVTX domain whose ranges define the ops", (v) => update({domain: v}));
  ui.aggr = select("aggr-select", "Aggregation", "Key node and iteration range the statistics cover; re-aggregate from the Iterations view", (v) => update({aggr: v}));
  ui.viewButtons = VIEWS.map((v) => h("button", {type: "button", class: "nav-item", dataset: {view: v.id}, onClick: () => {
    setNavOpen(false);
    update({view: v.id});
  }}, v.label));
  ui.runInfo = h("div", {class: "run-info"});
  ui.jobBadge = h("div", {class: "job-badge", hidden: true, role: "status"});
  return h("aside", {class: "nav-pane", id: "nav-pane", "aria-label": "Navigation"},
    h("div", {class: "brand"}, logo(), h("div", {}, h("div", {class: "brand-name"}, "DLProf"), h("div", {class: "brand-sub"}, "Deep Learning Profiler"))),
    ui.run.wrap,
    ui.rank.wrap,
    h("nav", {class: "views", "aria-label": "Views"}, h("div", {class: "field-label"}, "View"), ui.viewButtons),
    ui.domain.wrap,
    ui.aggr.wrap,
    ui.jobBadge,
    ui.runInfo);
}

/** Open or close the collapsed navigation (narrow windows; on wide ones it is always shown). */
function setNavOpen(open) {
  ui.app.classList.toggle("nav-open", open);
  ui.navToggle.setAttribute("aria-expanded", String(open));
}

function fillSelect(sel, options, value) {
  clear(sel);
  for (const o of options) sel.appendChild(h("option", {value: o.value, selected: String(o.value) === String(value), title: o.title || ""}, o.label));
  sel.disabled = options.length === 0;
}

function aggrLabel(a, newest) {
  const range = a.iter_start === a.iter_stop ? `iteration ${a.iter_start}` : `iterations ${a.iter_start}–${a.iter_stop}`;
  return `#${a.aggr_id} · ${range}${a.key_node ? ` · ${a.key_node}` : ""}${String(a.aggr_id) === String(newest) ? " (newest)" : ""}`;
}

function renderNav() {
  fillSelect(ui.run.el, state.runs.map((r) => ({value: r.run, label: runLabel(r), title: r.database})), state.run);
  fillSelect(ui.rank.el, state.ranks.map((r) => ({value: r.rank, label: `Rank ${r.rank}`, title: r.source_file || ""})), state.rank);
  ui.rank.wrap.hidden = state.ranks.length <= 1;
  fillSelect(ui.domain.el, state.domains.map((d) => ({value: d.name, label: `${d.name}${d.is_primary ? " (primary)" : ""}`})), state.domain);
  fillSelect(ui.aggr.el, state.aggregations.map((a) => ({value: a.aggr_id, label: aggrLabel(a, state.newest), title: `Created ${a.created_utc || ""}`})), state.aggr);
  for (const b of ui.viewButtons) {
    const active = b.dataset.view === state.view;
    b.classList.toggle("active", active);
    if (active) b.setAttribute("aria-current", "page");
    else b.removeAttribute("aria-current");
  }
  const run = currentRun();
  clear(ui.runInfo);
  if (run) {
    const row = (k, v) => (v ? h("div", {class: "info-row"}, h("span", {class: "k"}, k), h("span", {class: "v", title: String(v)}, String(v))) : null);
    ui.runInfo.append(row("Profile", run.profile_name), row("Mode", run.mode), row("Nsight Systems", run.nsys_version),
      row("DLProf", run.dlprof_version), row("Created", run.created_utc));
  }
}

function renderJobBadge() {
  const job = state.job;
  const running = job && job.status === "running";
  ui.jobBadge.hidden = !running;
  if (running) ui.jobBadge.replaceChildren(h("span", {class: "spinner", "aria-hidden": "true"}), "Re-aggregation underway…");
}

// ---- data loading ----------------------------------------------------------------------------------------------
async function loadAggregations(selectId) {
  const data = await getJSON("aggregations", {run: state.run});
  const aggregations = (data.aggregations || []).slice().sort((a, b) => Number(a.aggr_id) - Number(b.aggr_id));
  const ids = aggregations.map((a) => String(a.aggr_id));
  let aggr = selectId !== undefined && selectId !== null && ids.includes(String(selectId)) ? String(selectId) : null;
  if (aggr === null) aggr = data.newest !== undefined && data.newest !== null ? String(data.newest) : ids[ids.length - 1] || null;
  state.newest = data.newest;
  update({aggregations, aggr});
  return data;
}

function asIndex(value) {
  const n = Number(value);
  return value !== null && value !== undefined && value !== "" && Number.isInteger(n) && n >= 0 ? n : null;
}

/** Load a run; `wanted` (from the URL) picks its aggregation, domain, view and selection when they exist. */
async function selectRun(run, wanted = {}) {
  clearDetails();
  // While a run loads, state changes only re-render the navigation; the view is mounted once at the end.
  ui.switchingRun = true;
  try {
    update({run, aggregations: [], domains: [], aggr: null, domain: null, job: null, ranks: [], rank: null});
    showViewLoading();
    const [aggrData, rankData] = await Promise.all([getJSON("aggregations", {run}), getJSON("ranks", {run})]);
    const ranks = rankData.ranks || [];
    const rank = String((ranks.find((r) => String(r.rank) === String(wanted.rank)) || {rank: rankData.default}).rank);
    const domainData = await getJSON("domains", {run, rank});
    if (state.run !== run) return;   // another run was selected meanwhile
    const domains = domainData.domains || [];
    const primary = domains.find((d) => d.is_primary) || domains[0];
    const domain = domains.find((d) => d.name === wanted.domain) || primary;
    const aggregations = (aggrData.aggregations || []).slice().sort((a, b) => Number(a.aggr_id) - Number(b.aggr_id));
    state.newest = aggrData.newest;
    let aggr = aggrData.newest ?? (aggregations.length ? aggregations[aggregations.length - 1].aggr_id : null);
    if (aggregations.some((a) => String(a.aggr_id) === String(wanted.aggr))) aggr = wanted.aggr;
    const view = VIEWS.some((v) => v.id === wanted.view) ? wanted.view : state.view;
    update({ranks, rank, domains, domain: domain ? domain.name : null, aggregations,
      aggr: aggr === null ? null : String(aggr), view, op: asIndex(wanted.op), iteration: asIndex(wanted.iteration),
      ...baselineFrom(wanted)});
    if (aggrData.job && aggrData.job.status === "running") {
      update({job: {...aggrData.job, run}});
      poll(run);
    }
  } catch (err) {
    if (state.run !== run) return;
    showError(err);
    clear(ui.view).appendChild(placeholder(`Could not load run “${run}”: ${err.message}`));
    return;
  } finally {
    if (state.run === run) ui.switchingRun = false;
  }
  renderNav();
  mountView();
  ui.ready = true;
  saveUrl();
}

/** The Compare view's baseline from the URL (none: the run's own, see view_compare.js). */
function baselineFrom(wanted) {
  return {base_run: wanted.base_run || null, base_aggr: wanted.base_run ? wanted.base_aggr || null : null};
}

/** Show another rank: its NVTX domains (the same names, other ids), the current domain kept when it has it. */
async function selectRank(rank) {
  try {
    const data = await getJSON("domains", {run: state.run, rank});
    const domains = data.domains || [];
    const domain = domains.find((d) => d.name === state.domain) || domains.find((d) => d.is_primary) || domains[0];
    update({rank: String(rank), domains, domain: domain ? domain.name : null});
  } catch (err) {
    showError(err);
  }
}

function saveUrl() {
  // the rank only where there is a choice: single-profile runs keep their URLs
  if (ui.ready) writeUrlState(Object.fromEntries(URL_KEYS.map((k) => [k, k === "rank" && state.ranks.length <= 1 ? null : state[k]])));
}

// ---- views -------------------------------------------------------------------------------------------------------
function showViewLoading() {
  if (unmountView) unmountView();
  unmountView = null;
  clear(ui.view).appendChild(loading());
}

function mountView() {
  if (unmountView) unmountView();
  unmountView = null;
  const info = VIEWS.find((v) => v.id === state.view) || VIEWS[0];
  ui.title.textContent = info.label;
  const a = currentAggregation();
  const rankPart = state.ranks.length > 1 && info.id !== "ranks" ? ` · rank ${state.rank}` : "";
  ui.subtitle.textContent = a ? `${currentRun() ? `${runLabel(currentRun())} · ` : ""}aggregation ${aggrLabel(a, state.newest)}${state.domain ? ` · domain ${state.domain}` : ""}${rankPart}` : "";
  clear(ui.view);
  ui.view.dataset.view = info.id;
  if (!state.run) {
    ui.view.appendChild(placeholder("No run selected."));
    return;
  }
  const container = h("div", {class: `view view-${info.id}`});
  ui.view.appendChild(container);
  const module = VIEW_MODULES[info.id];
  const op = state.op;
  const cleanup = module.mount(container);
  unmountView = typeof cleanup === "function" ? cleanup : null;
  // a selection from the URL: views that list ops restore it themselves, the others show it in the details pane
  if (op !== null && !module.restoresSelection) showOp(op);
}

function onStateChange(changed) {
  if (changed.has("job")) renderJobBadge();
  if (URL_KEYS.some((k) => changed.has(k)) && !ui.switchingRun) saveUrl();
  if (ui.switchingRun) {
    renderNav();
  } else if (["view", "aggr", "domain", "rank"].some((k) => changed.has(k)) && state.run && state.aggregations.length) {
    clearDetails();
    update({iteration: null});
    renderNav();
    mountView();
  } else if (["runs", "run", "aggregations", "domains"].some((k) => changed.has(k))) {
    renderNav();
  }
}

// ---- entry point -----------------------------------------------------------------------------------------------
export async function render() {
  initTheme();
  loadStylesheet();
  document.title = "DLProf";
  document.documentElement.lang = "en";
  document.body.classList.add("dlprof");
  ui.errors = h("div", {class: "errors", "aria-live": "assertive"});
  ui.title = h("h1", {class: "view-title"}, "DLProf");
  ui.subtitle = h("div", {class: "view-subtitle"});
  ui.view = h("div", {id: "view", class: "view-host"});
  ui.details = h("section", {id: "details-pane", class: "details-pane", "aria-label": "Details", hidden: true});
  const main = h("main", {class: "main"}, ui.errors, h("header", {class: "view-header"}, ui.title, ui.subtitle), ui.view, ui.details);
  // narrow windows: the navigation collapses into a rail whose button opens it over the page
  const toggle = h("button", {type: "button", class: "nav-toggle icon-button", id: "nav-toggle", "aria-label": "Navigation",
    "aria-expanded": "false", "aria-controls": "nav-pane", title: "Run, views, domain and aggregation",
    onClick: () => setNavOpen(!ui.app.classList.contains("nav-open"))}, "☰");
  const rail = h("div", {class: "nav-rail"}, toggle);
  const backdrop = h("div", {class: "nav-backdrop", onClick: () => setNavOpen(false)});
  ui.app = h("div", {id: "dlprof-app", class: "app"}, rail, buildNav(), backdrop, main);
  ui.navToggle = toggle;
  clear(document.body).appendChild(ui.app);
  setErrorSink(showError);
  initDetails(ui.details);
  setAggregationReloader(async (selectId) => {
    try {
      await loadAggregations(selectId);
    } catch (err) {
      showError(err);
    }
  });
  subscribe(onStateChange);
  ui.view.appendChild(loading("Loading runs…"));
  let runs;
  try {
    [runs] = await Promise.all([getJSON("runs").then((d) => d.runs || []), loadTerms()]);
  } catch (err) {
    showError(err);
    clear(ui.view).appendChild(placeholder(`Could not list runs: ${err.message}`));
    return;
  }
  const wanted = readUrlState();
  update({runs});
  if (!runs.length) {
    clear(ui.view).appendChild(h("div", {class: "empty-state"},
      h("h2", {}, "No DLProf runs found"),
      h("p", {}, "Profile a training script with dlprof and point TensorBoard at its output directory:"),
      h("pre", {}, "dlprof --output_path=./logs python train.py\ntensorboard --logdir ./logs")));
    renderNav();
    return;
  }
  await selectRun(runs.some((r) => r.run === wanted.run) ? wanted.run : runs[0].run, wanted);
}


