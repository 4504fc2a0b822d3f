// Re-aggregation requests from the Iterations form and from the expert systems' proposals (the bad iteration
// range detector's steady range), as one click: an existing aggregation with the same key node and range is
// offered instead of computing it again; otherwise a confirmation, then the job (jobs.js).

import {confirmDialog} from "./dialogs.js";
import {h} from "./dom.js";
import {startReaggregation} from "./jobs.js";
import {state, update} from "./state.js";

function rangeText(iterStart, iterStop) {
  if ((iterStart === null || iterStart === undefined) && (iterStop === null || iterStop === undefined)) return "all iterations";
  return `iterations ${iterStart ?? "first"}–${iterStop ?? "last"}`;
}

/** The aggregation of this run that a request would compute again, or null. A request without a key node
 * means the framework default: the key node of the run's default-sourced aggregations. */
export function findAggregation({keyNode, iterStart, iterStop}) {
  const aggregations = state.aggregations || [];
  const fallback = aggregations.find((a) => a.key_source !== "user" && a.key_found);
  const key = keyNode || (fallback ? fallback.key_node : null);
  const sameKey = (a) => (key ? !!a.key_found && a.key_node === key : !a.key_found);
  return aggregations.find((a) => sameKey(a)
    && Number(a.iter_start) === Number(iterStart ?? 0)
    && Number(a.iter_stop) === Number(iterStop ?? Number(a.total_iterations) - 1)) || null;
}

/** Offer to show an existing aggregation instead of computing it again. */
async function offerExisting(a) {
  const show = await confirmDialog("Already computed",
    h("div", {}, h("p", {}, `Aggregation #${a.aggr_id} already covers ${rangeText(a.iter_start, a.iter_stop)} with key node `,
      h("code", {}, a.key_node || "(none)"), "."),
    h("p", {class: "muted"}, "Show it instead of computing the same aggregation again?")),
    {okLabel: `Show aggregation #${a.aggr_id}`, id: "existing-aggregation-dialog"});
  if (show) update({aggr: String(a.aggr_id)});
  return show;
}

/** Re-aggregate this run over a key node and range: the existing aggregation if there is one, else after a
 * confirmation a background job. Resolves to "existing", "started" or "cancelled". */
export async function requestReaggregation({keyNode = null, iterStart = null, iterStop = null}) {
  const existing = findAggregation({keyNode, iterStart, iterStop});
  if (existing) {
    await offerExisting(existing);
    return "existing";
  }
  const ok = await confirmDialog("Reaggregate?",
    h("div", {}, h("p", {}, `Compute a new aggregation of run “${state.run}” over ${rangeText(iterStart, iterStop)} with key node `,
      h("code", {}, keyNode || "(default)"), "?"),
    h("p", {class: "muted"}, "It runs in the background and is added to the Aggregation selector; earlier aggregations are kept.")),
    {okLabel: "Reaggregate"});
  if (!ok) return "cancelled";
  await startReaggregation({keyNode, iterStart, iterStop});
  return "started";
}

/** A finding's proposal: its range over the key node of the aggregation it was found in. */
export function applyAction(action) {
  const current = state.aggregations.find((a) => String(a.aggr_id) === String(state.aggr));
  const keyNode = action.key_node || (current && current.key_found ? current.key_node : null);
  return requestReaggregation({keyNode, iterStart: action.iter_start ?? null, iterStop: action.iter_stop ?? null});
}

/** A button and the command line for a finding's action, or null when it proposes nothing to run. */
export function actionControls(action, {id} = {}) {
  if (!action || action.type !== "reaggregate") return null;
  const running = state.job && state.job.status === "running" && state.job.run === state.run;
  const button = h("button", {type: "button", class: "primary small apply-action", id, disabled: running,
    title: "Re-aggregate as proposed (runs in the background)", onClick: () => applyAction(action)},
  `Apply: aggregate ${rangeText(action.iter_start, action.iter_stop)}`);
  return h("div", {class: "finding-action"}, button,
    action.command ? h("code", {class: "finding-command", title: "The same from the command line"}, action.command) : null);
}
