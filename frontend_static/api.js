// Fetch wrapper for the plugin's JSON routes (see dlprof_plugin/http_api.md).
// URLs are resolved relative to this module, which is served next to the routes
// (/data/plugin/dlprof/ under TensorBoard, whatever prefix dlprofviewer uses), so --path_prefix works.

export class ApiError extends Error {
  constructor(message, status, route) {
    super(message);
    this.status = status;
    this.route = route;
  }
}

let errorSink = (err) => console.error(err);

/** Where unexpected errors are shown (the banner installed by index.js). */
export function setErrorSink(fn) {
  errorSink = fn;
}

export function reportError(err) {
  errorSink(err);
}

/** Absolute URL of a route with its query parameters (null/undefined parameters are left out). */
export function routeUrl(route, params = {}) {
  const url = new URL(route, import.meta.url);
  for (const [name, value] of Object.entries(params)) {
    if (value === null || value === undefined) continue;
    url.searchParams.set(name, String(value));
  }
  return url.toString();
}

async function readError(resp, route) {
  let message = `${resp.status} ${resp.statusText}`;
  try {
    const body = await resp.json();
    if (body && body.error) message = body.error;
  } catch (_) {
    // not JSON: keep the status line
  }
  return new ApiError(message, resp.status, route);
}

const BUSY_RETRIES = 3;   // 503 + Retry-After: the database is locked while a re-aggregation commits

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** GET a JSON route; throws ApiError (with the server's one-line message) on failure. */
export async function getJSON(route, params = {}, {signal} = {}) {
  for (let attempt = 0; ; attempt++) {
    let resp;
    try {
      resp = await fetch(routeUrl(route, params), {headers: {Accept: "application/json"}, signal});
    } catch (err) {
      if (err.name === "AbortError") throw err;
      throw new ApiError(`Cannot reach the server (${err.message})`, 0, route);
    }
    if (resp.status === 503 && attempt < BUSY_RETRIES) {
      await sleep(1000 * (Number(resp.headers.get("Retry-After")) || 1));
      continue;
    }
    if (!resp.ok) throw await readError(resp, route);
    return resp.json();
  }
}

// Sent with every request that changes state: the server refuses those without it (403), and a web page of
// another site can neither set it in a form nor, without a CORS preflight the server never grants, in a fetch.
export const REQUEST_HEADER = "X-DLProf-Request";

/** POST a JSON body; returns {status, body}. Throws ApiError for 4xx/5xx. */
export async function postJSON(route, body) {
  let resp;
  try {
    resp = await fetch(routeUrl(route), {
      method: "POST",
      headers: {"Content-Type": "application/json", Accept: "application/json", [REQUEST_HEADER]: "1"},
      body: JSON.stringify(body),
    });
  } catch (err) {
    throw new ApiError(`Cannot reach the server (${err.message})`, 0, route);
  }
  if (!resp.ok) throw await readError(resp, route);
  return {status: resp.status, body: await resp.json()};
}

/** GET with errors shown in the banner; resolves to null on failure. */
export async function tryGet(route, params = {}) {
  try {
    return await getJSON(route, params);
  } catch (err) {
    if (err.name !== "AbortError") reportError(err);
    return null;
  }
}
