// Navigation state shared by the navigation pane, the views and the details pane.

export const VIEWS = [
  {id: "dashboard", label: "Dashboard"},
  {id: "op_types", label: "Op Type Summary"},
  {id: "ops_kernels", label: "Ops and Kernels"},
  {id: "kernels_by_iteration", label: "Kernels by Iteration"},
  {id: "kernels_by_op", label: "Kernels by Op"},
  {id: "iterations", label: "Iterations"},
  {id: "timeline", label: "Timeline"},
  {id: "tensor_core", label: "Tensor Cores"},
  {id: "gpus", label: "GPUs"},
  {id: "memory", label: "Memory"},
  {id: "group_ops", label: "Group Ops"},
  {id: "compare", label: "Compare"},
  {id: "ranks", label: "Ranks"},
];

export const state = {
  runs: [],          // runs route
  run: null,         // selected run name
  view: "dashboard",
  domains: [],       // domains route
  domain: null,      // selected NVTX domain name (null: the primary one)
  aggregations: [],  // aggregations route
  aggr: null,        // selected aggregation id (null: newest)
  newest: null,      // newest aggregation id of the run
  job: null,         // re-aggregation job status (jobs.js)
  op: null,          // op_index shown in the details pane (a selection kept in the URL)
  iteration: null,   // iteration selected in the kernel views (kept in the URL)
  base_run: null,    // the Compare view's baseline run and aggregation (kept in the URL)
  base_aggr: null,
  ranks: [],         // ranks route: the profiles of a multi-rank run (one entry for a single profile)
  rank: null,        // selected rank (null: the run's default); every data route takes it
};

const listeners = new Set();

/** fn(changedKeys: Set, state) is called after every update. Returns an unsubscribe function. */
export function subscribe(fn) {
  listeners.add(fn);
  return () => listeners.delete(fn);
}

export function update(patch) {
  const changed = new Set();
  for (const [key, value] of Object.entries(patch)) {
    if (state[key] !== value) {
      state[key] = value;
      changed.add(key);
    }
  }
  if (changed.size) for (const fn of [...listeners]) fn(changed, state);
}

/** The run/aggregation/domain parameters every data route takes. */
export function scope() {
  return {run: state.run, aggr: state.aggr, domain: state.domain, rank: state.rank};
}

export function currentRun() {
  return state.runs.find((r) => r.run === state.run) || null;
}

/** A run as TensorBoard names it (its folder below the logdir); the logdir's own run by its profile's name. */
export function runLabel(r) {
  if (!r) return "";
  return r.run === "." ? r.profile_name || "(logdir)" : r.run;
}

/** The label of a run by its name. */
export function runLabelOf(name) {
  return runLabel(state.runs.find((r) => r.run === name) || {run: name});
}

export function currentAggregation() {
  return state.aggregations.find((a) => String(a.aggr_id) === String(state.aggr)) || null;
}

export function isPyTorch() {
  const run = currentRun();
  return !!run && String(run.mode || "").toLowerCase() === "pytorch";
}
