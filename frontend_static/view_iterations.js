// Iterations: bars per iteration, all vs profiled, hover details, Start / Stop spinners with boundary
// markers, a key node picker, and Reaggregate (runs in the background; see jobs.js). Start and Stop are checked
// against the iterations of the key node's split before anything is sent; a new key node clears them (all
// iterations of its split); an aggregation that exists already is offered instead of a duplicate (actions.js).

import {tryGet} from "./api.js";
import {COLORS, TIME_CLASSES, isEmptyIteration, iterationBars, iterationLegend, iterationSegments, legend} from "./charts.js";
import {modal} from "./dialogs.js";
import {card, clear, h, loading, placeholder, replace} from "./dom.js";
import {fmtInt, fmtNs, fmtPct} from "./format.js";
import {applyAction, requestReaggregation} from "./actions.js";
import {term} from "./metrics.js";
import {currentAggregation, scope, state, subscribe} from "./state.js";
import {DataTable} from "./table.js";
import {openIteration} from "./view_timeline.js";

const KEY_COLUMNS = ["name", "key_node", "text", "op_name", "label"];

function tooltipContent(it) {
  const seg = Object.fromEntries(iterationSegments(it).map((s) => [s.key, s.value]));
  const row = (key, v, color) => h("div", {class: "tip-row"}, color ? h("span", {class: "swatch", style: {background: color}}) : null,
    term("span", key, {class: "k"}), h("span", {class: "v"}, v));
  return [
    h("div", {class: "tip-title"}, `Iteration ${it.iteration}`, it.aggregated ? null : h("span", {class: "badge muted"}, "outside the aggregation")),
    row("iteration_start", fmtNs(it.start)),
    row("duration", fmtNs(it.duration)),
    it.aggregated ? TIME_CLASSES.filter((c) => seg[c.key] > 0 || c.key === "tc" || c.key === "non_tc")
      .map((c) => row(c.term, fmtNs(seg[c.key]), COLORS[c.key])) : null,
    row("kernels", fmtInt(it.kernels)),
    row("tc_kernels", fmtInt(it.tc_kernels)),
    row("tc_kernel_time_per_gpu", fmtNs(it.tc_kernel_time_per_gpu)),
    it.gpu_utilization !== undefined ? row("gpu_utilization", fmtPct(it.gpu_utilization)) : null,
    // the GPU time breakdowns per iteration, averaged over the GPUs used (null in databases written before them)
    // (none for a database written before them, nor without GPU work: all zero then)
    it.aggregated && [it.computation_busy, it.communication_busy, it.memory_busy, it.gpu_idle].some((v) => Number(v) > 0) ? [
      ["bd_computation", it.computation_busy], ["bd_communication", it.communication_busy], ["bd_memory", it.memory_busy],
      ["bd_overlapped", it.overlapped_communication], ["bd_idle", it.gpu_idle],
    ].map(([k, v]) => row(k, fmtNs(v))) : null,
    h("div", {class: "muted"}, "Double-click: its timeline"),
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
    const table = new DataTable({route: "table/key_nodes", scope: () => ({run: state.run, aggr: state.aggr, domain: state.domain, rank: state.rank}),
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
    tooltip: "Per iteration: the time breakdown's classes (Tensor Core kernels, other kernels, memory, data loading, I/O, CPU, other); iterations outside the aggregation in grey. Hover a bar for details; click to set Start, shift-click to set Stop; double-click to open its timeline."});
  const chartBox = h("div", {class: "chart-box"});
  const tip = h("div", {class: "chart-tip", role: "tooltip", hidden: true});
  const allBtn = h("button", {type: "button", class: "seg-btn", id: "iters-all", "aria-pressed": "true"}, "All iterations");
  const profBtn = h("button", {type: "button", class: "seg-btn", id: "iters-profiled", "aria-pressed": "false"}, "Profiled only");
  const chartInfo = h("div", {class: "muted chart-info"});
  const timelineBtn = h("button", {type: "button", class: "secondary small", id: "open-timeline",
    title: "The timeline of the iteration selected as Start (or double-click a bar)",
    onClick: () => openIteration(num(startInput) ?? data.iter_start)}, "Open in Timeline");
  const legendBox = h("div", {class: "chart-legend"});
  chartCard.body.append(
    h("div", {class: "chart-toolbar"}, h("div", {class: "segmented", role: "group", "aria-label": "Iterations shown"}, allBtn, profBtn), chartInfo, timelineBtn),
    h("div", {class: "chart-wrap"}, chartBox, tip),
    legendBox);

  // ---- re-aggregation form ----
  const startInput = h("input", {type: "number", id: "iter-start", min: 0, step: 1, inputmode: "numeric", placeholder: "first"});
  const stopInput = h("input", {type: "number", id: "iter-stop", min: 0, step: 1, inputmode: "numeric", placeholder: "last"});
  const keyInput = h("input", {type: "text", id: "key-node", class: "mono", placeholder: "default key node", autocomplete: "off"});
  const pickBtn = h("button", {type: "button", class: "secondary", id: "pick-key-node", title: "Choose the key node from every op and NVTX range"}, "Choose…");
  const goBtn = h("button", {type: "button", class: "primary", id: "reaggregate"}, "Reaggregate");
  const validation = h("div", {class: "validation", "aria-live": "polite"});
  const hint = h("div", {class: "muted range-hint", "aria-live": "polite"});
  const status = h("div", {id: "reaggregate-status", class: "job-status", role: "status", "aria-live": "polite", dataset: {status: "idle"}});
  const proposal = h("div", {id: "range-proposal", class: "proposal", hidden: true});
  const formCard = card("Re-aggregate", {wide: true, id: "reaggregate-form",
    tooltip: "Compute a new aggregation over another iteration range or key node. It runs in the background; earlier aggregations stay available in the Aggregation selector."});
  formCard.body.append(
    h("div", {class: "form-row"},
      h("div", {class: "field"}, term("label", "select_iter_start", {for: "iter-start"}), startInput),
      h("div", {class: "field"}, term("label", "select_iter_stop", {for: "iter-stop"}), stopInput),
      h("div", {class: "field grow"}, term("label", "key_node", {for: "key-node"}), h("div", {class: "input-group"}, keyInput, pickBtn)),
      h("div", {class: "field"}, h("span", {class: "field-label", "aria-hidden": "true"}, " "), goBtn)),
    proposal, validation, hint, status);

  el.append(chartCard.card, formCard.card);
  chartBox.appendChild(loading("Loading iterations…"));

  const num = (input) => (input.value.trim() === "" ? null : Number(input.value));
  let rangeKey = null;   // the key node whose split Start / Stop refer to (the chart's)

  /** Iterations in the split of the key node typed in the form: known for the chart's key node only. */
  function iterationCount() {
    if (!data || keyInput.value.trim() !== (rangeKey || "")) return null;
    return (data.iterations || []).length;
  }

  function validate() {
    const a = num(startInput);
    const b = num(stopInput);
    const count = iterationCount();
    let msg = "";
    if ((a !== null && (!Number.isInteger(a) || a < 0)) || (b !== null && (!Number.isInteger(b) || b < 0))) msg = "Iterations are whole numbers from 0.";
    else if (count !== null && ((a !== null && a > count - 1) || (b !== null && b > count - 1))) {
      msg = `This split has ${fmtInt(count)} iteration${count === 1 ? "" : "s"}: Start and Stop must be within 0–${fmtInt(count - 1)}.`;
    } else if (a !== null && b !== null && a > b) msg = "Start must not be after Stop.";
    validation.textContent = msg;
    hint.textContent = count === null && keyInput.value.trim() !== (rangeKey || "")
      ? "New key node: its iterations are known once it is aggregated; empty Start / Stop take all of them." : "";
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
    const empty = its.filter(isEmptyIteration).map((it) => it.iteration);
    chartInfo.textContent = `${fmtInt(its.length - empty.length)} of ${fmtInt(all.length)} iterations shown · aggregated ${data.iter_start}–${data.iter_stop}` +
      (empty.length ? ` · iteration ${empty.join(", ")} has no time (the profile ends with the key node): not drawn` : "");
    replace(legendBox, legend([...iterationLegend(all), {key: "marker", term: "selected_range"}]));
    if (!its.length) {
      replace(chartBox, placeholder("No iterations to show."));
      return;
    }
    const sameSplit = keyInput.value.trim() === (rangeKey || "");
    const svg = iterationBars(its, {
      range: [data.iter_start, data.iter_stop],
      markers: sameSplit ? {start: num(startInput) ?? 0, stop: num(stopInput) ?? all.length - 1} : {},
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
      onDblClick: (it) => openIteration(it.iteration),
      onClick: (it) => {
        keyInput.value = rangeKey || "";   // the bars are the chart's split
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
  let keyBefore = "";
  /** A key node other than the one Start / Stop were chosen for: they no longer apply; empty = all. */
  function keyChanged() {
    const key = keyInput.value.trim();
    if (key === keyBefore) return;
    keyBefore = key;
    if (key !== (rangeKey || "")) {
      startInput.value = "";
      stopInput.value = "";
    }
    validate();
    drawChart();
  }
  keyInput.addEventListener("focus", () => {
    keyBefore = keyInput.value.trim();
  });
  keyInput.addEventListener("change", keyChanged);
  keyInput.addEventListener("input", () => validate());
  pickBtn.addEventListener("click", async () => {
    keyBefore = keyInput.value.trim();
    const name = await pickKeyNode();
    if (name !== null && name !== undefined) {
      keyInput.value = String(name);
      keyChanged();
    }
  });
  goBtn.addEventListener("click", async () => {
    if (!validate()) return;
    const iterStart = num(startInput);
    const iterStop = num(stopInput);
    const keyNode = keyInput.value.trim() || null;
    if (!alive) return;
    await requestReaggregation({keyNode, iterStart, iterStop});
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
    rangeKey = data.key_node ?? aggregation.key_node ?? "";
    keyInput.value = rangeKey;
    keyBefore = rangeKey;
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
        keyInput.value = a.key_node || rangeKey || "";
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
