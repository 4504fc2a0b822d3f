// Background re-aggregation: start it, poll its status, then load the new aggregation.
// Lives outside the views so switching views does not lose a running job.

import {getJSON, postJSON} from "./api.js";
import {state, update} from "./state.js";

const POLL_MS = 500;
let timer = null;
let reloadAggregations = async () => {};

/** index.js gives the function that reloads the aggregation list and selects an aggregation id. */
export function setAggregationReloader(fn) {
  reloadAggregations = fn;
}

function stopPolling() {
  clearTimeout(timer);
  timer = null;
}

/** POST reaggregate. Resolves when the job is accepted; its progress arrives in state.job. */
export async function startReaggregation({keyNode, iterStart, iterStop}) {
  const run = state.run;
  update({job: {status: "running", message: "Starting…", run, request: {keyNode, iterStart, iterStop}}});
  try {
    const {body} = await postJSON("reaggregate", {
      run,
      key_node: keyNode || null,
      iter_start: iterStart ?? null,
      iter_stop: iterStop ?? null,
    });
    update({job: {...(body.job || {}), status: (body.job && body.job.status) || "running", run, request: {keyNode, iterStart, iterStop}}});
    poll(run);
  } catch (err) {
    const busy = err.status === 409;
    update({job: {status: busy ? "running" : "failed", message: busy ? `Another re-aggregation is already running for this database (${err.message}).` : err.message, run}});
    if (busy) poll(run);
  }
}

/** Poll reaggregate_status for run until the job ends. */
export function poll(run) {
  stopPolling();
  const tick = async () => {
    if (state.run !== run) return stopPolling();
    let job;
    try {
      job = (await getJSON("reaggregate_status", {run})).job || {};
    } catch (err) {
      update({job: {status: "failed", message: `Lost track of the re-aggregation: ${err.message}`, run}});
      return stopPolling();
    }
    const request = state.job && state.job.request;
    if (job.status === "running") {
      update({job: {...job, run, request}});
      timer = setTimeout(tick, POLL_MS);
      return;
    }
    stopPolling();
    if (job.status === "succeeded") {
      await reloadAggregations(job.aggr_id ?? null);
    } else {
      await reloadAggregations(state.aggr);   // a failure leaves earlier aggregations intact
    }
    update({job: {...job, run, request, done: true}});
  };
  timer = setTimeout(tick, POLL_MS);
}
