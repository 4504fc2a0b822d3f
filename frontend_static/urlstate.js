// What the user looks at, kept in the address bar so a reload (or a shared link) shows it again: run, view,
// aggregation, domain and the selection (the op in the details pane, the iteration of the kernel views and the
// timeline, the Compare view's baseline).
// In TensorBoard the plugin's iframe is recreated on reload, so the keys live in TensorBoard's own URL hash as
// `p.dlprof.<key>` (the prefix TensorBoard's plugin API reserves for a plugin's URL data), written through its
// tf_storage; standalone (dlprofviewer) they are the page's own hash: `#view=ops_kernels&op=3`.

export const URL_KEYS = ["run", "view", "aggr", "domain", "op", "iteration", "rank", "base_run", "base_aggr"];
const PREFIX = "p.dlprof.";

function tensorBoardStorage() {
  try {
    if (window.parent === window) return null;
    const storage = window.parent.tensorboard && window.parent.tensorboard.tf_storage;
    return storage && typeof storage.getString === "function" && typeof storage.setString === "function" ? storage : null;
  } catch (_) {
    return null;
  }
}

function ownHash() {
  return new URLSearchParams(window.location.hash.replace(/^#/, ""));
}

/** {run, view, aggr, domain, op, iteration, base_run, base_aggr} from the URL (missing keys are null). */
export function readUrlState() {
  const storage = tensorBoardStorage();
  const out = {};
  if (storage) {
    for (const k of URL_KEYS) {
      let v = null;
      try {
        v = storage.getString(PREFIX + k);
      } catch (_) {
        v = null;
      }
      out[k] = v === undefined || v === null || v === "" ? null : String(v);
    }
    return out;
  }
  const params = ownHash();
  for (const k of URL_KEYS) out[k] = params.get(k) || null;
  return out;
}

let last = null;

/** Write the state (values null/undefined are removed); no-op when nothing changed. */
export function writeUrlState(values) {
  const clean = {};
  for (const k of URL_KEYS) {
    const v = values[k];
    clean[k] = v === null || v === undefined || v === "" ? "" : String(v);
  }
  const signature = JSON.stringify(clean);
  if (signature === last) return;
  last = signature;
  const storage = tensorBoardStorage();
  if (storage) {
    for (const k of URL_KEYS) {
      try {
        // the default "" removes the key; replacing the entry keeps the Back button for TensorBoard's tabs
        if ((storage.getString(PREFIX + k) || "") !== clean[k]) {
          storage.setString(PREFIX + k, clean[k], {defaultValue: "", useLocationReplace: true});
        }
      } catch (_) {
        // TensorBoard's storage refused: the state is only lost on reload
      }
    }
    return;
  }
  const params = ownHash();
  for (const k of URL_KEYS) {
    if (clean[k]) params.set(k, clean[k]);
    else params.delete(k);
  }
  const hash = params.toString();
  const url = `${window.location.pathname}${window.location.search}${hash ? `#${hash}` : ""}`;
  window.history.replaceState(window.history.state, "", url);
}
