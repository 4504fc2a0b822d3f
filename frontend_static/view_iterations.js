// Iterations: bars per iteration, all vs profiled, hover details, Start / Stop spinners with boundary
// markers, a key node picker, and Reaggregate (runs in the background; see jobs.js).

import {tryGet} from "./api.js";
import {COLORS, iterationBars, iterationSegments, legend} from "./charts.js";
import {confirmDialog, modal} from "./dialogs.js";
import {card, clear, h, loading, placeholder, replace} from "./dom.js";
import {fmtInt, fmtNs, fmtPct} from "./format.js";
import {applyAction} from "./actions.js";
import {startReaggregation} from "./jobs.js";
import {definition} from "./metrics.js";
import {currentAggregation, scope, state, subscribe} from "./state.js";
import {DataTable} from "./table.js";

const KEY_COLUMNS = ["name", "key_node", "text", "op_name", "label"];

function tooltipContent(it) {
  const seg = Object.fromEntries(iterationSegments(it).map((s) => [s.key, s.value]));
  const row = (k, v, color) => h("div", {class: "tip-row"}, color ? h("span", {class: "swatch", style: {background: color}}) : null, h("span", {class: "k"}, k), h("span", {class: "v"}, v));
  return [
    h("div", {class: "tip-title"}, `Iteration ${it.iteration}`, it.aggregated ? null : h("span", {class: "badge muted"}, "outside the aggregation")),
    row("Start", fmtNs(it.start)),
    row("Duration", fmtNs(it.duration)),
    it.aggregated ? [
      row("Tensor Core kernels", fmtNs(seg.tc), COLORS.tc),
      row("Non-TC kernels", fmtNs(seg.non_tc), COLORS.non_tc),
      row("Other", fmtNs(seg.other), COLORS.other),
    ] : null,
    row("Kernels", `${fmtInt(it.kernels)} (${fmtInt(it.tc_kernels)} TC)`),
    it.gpu_utilization !== undefined ? row("GPU utilization", fmtPct(it.gpu_utilization)) : null,
  ];
}

function keyColumn(columns) {
  for (const k of KEY_COLUMNS) if (columns.some((c) => c.key === k)) return k;
  const text = columns.find((c) => c.type === "text" && !c.hidden);
  return text ? text.key : columns[0] && columns[0].key;
}

/** The key node picker: the full searchable key_nodes table in a dialog. Resolves to a name or null. */
function pickKeyNode() {
  return new Promise((resolve) => {
    const m = modal("Choose a key node", {id: "key-node-dialog", wide: true});
    let chosen = null;
    let result = null;
    const use = h("button", {type: "button", class: "primary", id: "use-key-node", disabled: true, onClick: () => {
      result = chosen;
      m.close();
    }}, "Use key node");
    const table = new DataTable({route: "table/key_nodes", scope: () => ({run: state.run, aggr: state.aggr, domain: state.domain}),
      exportName: "key_nodes", selectable: true, pageSize: 10,
      onSelect: (row, t) => {
        chosen = row[keyColumn(t.columns)];
        use.disabled = chosen === null || chosen === undefined || chosen === "";
        use.textContent = use.disabled ? "Use key node" : `Use “${String(chosen).length > 40 ? `${String(chosen).slice(0, 40)}…` : chosen}”`;
      }});
    table.el.addEventListener("dblclick", (ev) => {
      if (ev.target.closest("tbody tr") && chosen) {
        result = chosen;
        m.close();
      }
    });
    m.body.append(h("p", {class: "muted"}, "Iterations end at each instance of the key node: pick an op or an NVTX range that runs once per training step (the optimizer step, say)."), table.el);
    m.footer.append(h("button", {type: "button", class: "secondary", onClick: () => m.close()}, "Cancel"), use);
    m.dialog.addEventListener("close", () => resolve(result));
    m.open();
  });
}

export function mount(el) {
  let alive = true;
  let data = null;
  let showAll = true;
  const aggregation = currentAggregation() || {};

  const chartCard = card("Iterations", {wide: true, id: "iterations-chart",
    tooltip: "Per iteration: Tensor Core kernel time, other kernel time and the rest; iterations outside the aggregation in grey. Hover a bar for details; click to set Start, shift-click to set Stop."});
  const chartBox = h("div", {class: "chart-box"});
  const tip = h("div", {class: "chart-tip", role: "tooltip", hidden: true});
  const allBtn = h("button", {type: "button", class: "seg-btn", id: "iters-all", "aria-pressed": "true"}, "All iterations");
  const profBtn = h("button", {type: "button", class: "seg-btn", id: "iters-profiled", "aria-pressed": "false"}, "Profiled only");
  const chartInfo = h("div", {class: "muted chart-info"});
  chartCard.body.append(
    h("div", {class: "chart-toolbar"}, h("div", {class: "segmented", role: "group", "aria-label": "Iterations shown"}, allBtn, profBtn), chartInfo),
    h("div", {class: "chart-wrap"}, chartBox, tip),
    legend([
      {key: "tc", label: "Tensor Core kernels", title: definition("tc_time")},
      {key: "non_tc", label: "Non-Tensor Core kernels", title: definition("non_tc_time")},
      {key: "other", label: "Other", title: definition("other_time")},
      {key: "outside", label: "Outside the aggregation", title: definition("outside")},
      {key: "marker", label: "Selected Start / Stop", title: "Boundaries chosen with Select Iter Start / Stop"},
    ]));

  // ---- re-aggregation form ----
  const startInput = h("input", {type: "number", id: "iter-start", min: 0, step: 1, inputmode: "numeric"});
  const stopInput = h("input", {type: "number", id: "iter-stop", min: 0, step: 1, inputmode: "numeric"});
  const keyInput = h("input", {type: "text", id: "key-node", class: "mono", placeholder: "default key node", autocomplete: "off"});
  const pickBtn = h("button", {type: "button", class: "secondary", id: "pick-key-node", title: "Choose the key node from every op and NVTX range"}, "Choose…");
  const goBtn = h("button", {type: "button", class: "primary", id: "reaggregate"}, "Reaggregate");
  const validation = h("div", {class: "validation", "aria-live": "polite"});
  const status = h("div", {id: "reaggregate-status", class: "job-status", role: "status", "aria-live": "polite", dataset: {status: "idle"}});
  const proposal = h("div", {id: "range-proposal", class: "proposal", hidden: true});
  const formCard = card("Re-aggregate", {wide: true, id: "reaggregate-form",
    tooltip: "Compute a new aggregation over another iteration range or key node. It runs in the background; earlier aggregations stay available in the Aggregation selector."});
  formCard.body.append(
    h("div", {class: "form-row"},
      h("div", {class: "field"}, h("label", {for: "iter-start", title: definition("iter_start")}, "Select Iter Start"), startInput),
      h("div", {class: "field"}, h("label", {for: "iter-stop", title: definition("iter_stop")}, "Select Iter Stop"), stopInput),
      h("div", {class: "field grow"}, h("label", {for: "key-node", title: definition("key_node")}, "Key node"), h("div", {class: "input-group"}, keyInput, pickBtn)),
      h("div", {class: "field"}, h("span", {class: "field-label", "aria-hidden": "true"}, " "), goBtn)),
    proposal, validation, status);

  el.append(chartCard.card, formCard.card);
  chartBox.appendChild(loading("Loading iterations…"));

  const num = (input) => (input.value.trim() === "" ? null : Number(input.value));

  function validate() {
    const a = num(startInput);
    const b = num(stopInput);
    let msg = "";
    if ((a !== null && (!Number.isInteger(a) || a < 0)) || (b !== null && (!Number.isInteger(b) || b < 0))) msg = "Iterations are whole numbers from 0.";
    else if (a !== null && b !== null && a > b) msg = "Start must not be after Stop.";
    validation.textContent = msg;
    const running = state.job && state.job.status === "running" && state.job.run === state.run;
    goBtn.disabled = !!msg || running;
    return !msg;
  }

  function drawChart() {
    if (!data) return;
    const all = data.iterations || [];
    const its = showAll ? all : all.filter((it) => it.aggregated);
    allBtn.setAttribute("aria-pressed", String(showAll));
    profBtn.setAttribute("aria-pressed", String(!showAll));
    chartInfo.textContent = `${fmtInt(its.length)} of ${fmtInt(all.length)} iterations shown · aggregated ${data.iter_start}–${data.iter_stop}`;
    if (!its.length) {
      replace(chartBox, placeholder("No iterations to show."));
      return;
    }
    const svg = iterationBars(its, {
      range: [data.iter_start, data.iter_stop],
      markers: {start: num(startInput), stop: num(stopInput)},
      height: 280,
      ariaLabel: "Iterations",
      onHover: (it, ev) => {
        if (!it) {
          tip.hidden = true;
          return;
        }
        replace(tip, ...tooltipContent(it));
        tip.hidden = false;
        const box = chartBox.getBoundingClientRect();
        const x = ev.clientX - box.left;
        const y = ev.clientY - box.top;
        const left = x + 16 + tip.offsetWidth > box.width ? x - tip.offsetWidth - 12 : x + 16;
        tip.style.left = `${Math.max(0, left)}px`;
        tip.style.top = `${Math.max(0, y - 10)}px`;
        tip.dataset.iteration = it.iteration;
      },
      onClick: (it) => {
        (window.event && window.event.shiftKey ? stopInput : startInput).value = String(it.iteration);
        validate();
        drawChart();
      },
    });
    replace(chartBox, svg);
  }

  function renderStatus() {
    const job = state.job;
    status.className = "job-status";
    if (!job || job.run !== state.run || !job.status || job.status === "idle") {
      status.dataset.status = "idle";
      clear(status);
      validate();
      return;
    }
    status.dataset.status = job.status;
    status.classList.add(job.status);
    if (job.status === "running") {
      const r = job.request || {};
      const what = job.key_node !== undefined || job.iter_start !== undefined
        ? {keyNode: job.key_node, iterStart: job.iter_start, iterStop: job.iter_stop} : {keyNode: r.keyNode, iterStart: r.iterStart, iterStop: r.iterStop};
      const range = what.iterStart === null && what.iterStop === null ? "all iterations"
        : `iterations ${what.iterStart ?? "first"}–${what.iterStop ?? "last"}`;
      replace(status, h("span", {class: "spinner", "aria-hidden": "true"}), h("strong", {}, "Re-aggregation underway… "),
        h("span", {}, `${range}, key node ${what.keyNode || "(default)"}${Number(job.elapsed_seconds) >= 1 ? ` · ${Number(job.elapsed_seconds).toFixed(0)} s` : ""}. You can keep browsing; the new aggregation is selected when it is ready.`));
    } else if (job.status === "succeeded") {
      const a = state.aggregations.find((x) => String(x.aggr_id) === String(job.aggr_id));
      replace(status, h("span", {class: "status-icon", "aria-hidden": "true"}, "✓"), h("strong", {}, "Re-aggregation succeeded. "),
        h("span", {}, `Aggregation #${job.aggr_id}${a ? ` (iterations ${a.iter_start}–${a.iter_stop}, key node ${a.key_node || "default"})` : ""} is now selected; earlier aggregations remain in the Aggregation selector.`));
    } else {
      replace(status, h("span", {class: "status-icon", "aria-hidden": "true"}, "!"), h("strong", {}, "Re-aggregation failed: "),
        h("span", {class: "job-message"}, job.message || "unknown error"), h("span", {}, " Earlier aggregations are unchanged."));
    }
    validate();
  }

  allBtn.addEventListener("click", () => {
    showAll = true;
    drawChart();
  });
  profBtn.addEventListener("click", () => {
    showAll = false;
    drawChart();
  });
  for (const input of [startInput, stopInput]) input.addEventListener("input", () => {
    validate();
    drawChart();
  });
  pickBtn.addEventListener("click", async () => {
    const name = await pickKeyNode();
    if (name !== null && name !== undefined) keyInput.value = String(name);
  });
  goBtn.addEventListener("click", async () => {
    if (!validate()) return;
    const iterStart = num(startInput);
    const iterStop = num(stopInput);
    const keyNode = keyInput.value.trim() || null;
    const range = iterStart === null && iterStop === null ? "all iterations"
      : `iterations ${iterStart ?? "first"}–${iterStop ?? "last"}`;
    const ok = await confirmDialog("Reaggregate?",
      h("div", {}, h("p", {}, `Compute a new aggregation of run “${state.run}” over ${range} with key node `, h("code", {}, keyNode || "(default)"), "?"),
        h("p", {class: "muted"}, "It runs in the background and is added to the Aggregation selector; earlier aggregations are kept.")),
      {okLabel: "Reaggregate"});
    if (!ok || !alive) return;
    await startReaggregation({keyNode, iterStart, iterStop});
  });

  const unsubscribe = subscribe((changed) => {
    if (changed.has("job") || changed.has("aggregations")) renderStatus();
  });

  tryGet("iterations", scope()).then((d) => {
    if (!alive) return;
    data = d;
    if (!data) {
      replace(chartBox, placeholder("Could not load iterations."));
      return;
    }
    const all = data.iterations || [];
    const last = all.length ? Number(all[all.length - 1].iteration) : 0;
    for (const input of [startInput, stopInput]) input.max = String(last);
    startInput.value = String(data.iter_start ?? aggregation.iter_start ?? 0);
    stopInput.value = String(data.iter_stop ?? aggregation.iter_stop ?? last);
    keyInput.value = data.key_node ?? aggregation.key_node ?? "";
    validate();
    drawChart();
    el.dataset.ready = "1";
  });
  renderStatus();

  // the expert systems' steady-range proposal, applied with one click
  tryGet("expert_systems", scope()).then((d) => {
    if (!alive || !d) return;
    const f = (d.findings || []).find((x) => x.action && x.action.type === "reaggregate");
    if (!f) return;
    const a = f.action;
    proposal.hidden = false;
    replace(proposal,
      h("span", {class: "proposal-text"}, `Expert systems propose iterations ${a.iter_start}–${a.iter_stop}: `, h("span", {class: "muted"}, f.problem)),
      h("button", {type: "button", class: "primary small", id: "apply-proposal", onClick: async () => {
        startInput.value = String(a.iter_start);
        stopInput.value = String(a.iter_stop);
        if (a.key_node) keyInput.value = a.key_node;
        validate();
        drawChart();
        await applyAction(a);
      }}, `Apply proposal (iterations ${a.iter_start}–${a.iter_stop})`));
  });

  return () => {
    alive = false;
    unsubscribe();
  };
}
