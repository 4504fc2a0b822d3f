// What an expert-system finding proposes, as one click: a re-aggregation (the bad iteration range
// detector's steady range), with its confirmation, and the equivalent command line.

import {confirmDialog} from "./dialogs.js";
import {h} from "./dom.js";
import {startReaggregation} from "./jobs.js";
import {state} from "./state.js";

function rangeText(action) {
  return `iterations ${action.iter_start ?? "first"}–${action.iter_stop ?? "last"}`;
}

/** Start the re-aggregation a finding proposes, after a confirmation. */
export async function applyAction(action) {
  const ok = await confirmDialog("Apply the proposal?",
    h("div", {}, h("p", {}, `Compute a new aggregation of run “${state.run}” over ${rangeText(action)}`,
      action.key_node ? [" with key node ", h("code", {}, action.key_node)] : null, "?"),
    h("p", {class: "muted"}, "It runs in the background and is added to the Aggregation selector; earlier aggregations are kept.")),
    {okLabel: "Reaggregate"});
  if (!ok) return false;
  await startReaggregation({keyNode: action.key_node || null, iterStart: action.iter_start ?? null,
    iterStop: action.iter_stop ?? null});
  return true;
}

/** A button and the command line for a finding's action, or null when it proposes nothing to run. */
export function actionControls(action, {id} = {}) {
  if (!action || action.type !== "reaggregate") return null;
  const running = state.job && state.job.status === "running" && state.job.run === state.run;
  const button = h("button", {type: "button", class: "primary small apply-action", id, disabled: running,
    title: "Re-aggregate as proposed (runs in the background)", onClick: () => applyAction(action)},
  `Apply: aggregate ${rangeText(action)}`);
  return h("div", {class: "finding-action"}, button,
    action.command ? h("code", {class: "finding-command", title: "The same from the command line"}, action.command) : null);
}
