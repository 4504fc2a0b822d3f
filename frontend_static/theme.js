// Light or dark, as the host says. Inside TensorBoard the plugin's iframe has the same origin as the page, whose
// <body> carries the class `dark-mode` whenever TensorBoard is dark (its own toggle, ?darkMode=true, or the
// browser's preference when the toggle says "Browser default"); TensorBoard sends plugins no message about it,
// so the class is watched. Standalone (dlprofviewer), the browser's prefers-color-scheme decides.

const DARK_CLASS = "dark-mode";

/** TensorBoard's top-level <body>, when this page is its plugin iframe (same origin); else null. */
export function tensorBoardBody() {
  try {
    if (window.parent === window) return null;
    const doc = window.parent.document;
    return window.parent.tensorboard && doc && doc.body ? doc.body : null;
  } catch (_) {
    return null;   // another origin: not TensorBoard's page
  }
}

function apply(dark) {
  const root = document.documentElement;
  root.classList.toggle("dark", dark);
  root.dataset.theme = dark ? "dark" : "light";
  root.style.colorScheme = dark ? "dark" : "light";
}

/** Follow the host's theme from now on. */
export function initTheme() {
  const body = tensorBoardBody();
  if (body) {
    const sync = () => apply(body.classList.contains(DARK_CLASS));
    sync();
    new MutationObserver(sync).observe(body, {attributes: true, attributeFilter: ["class"]});
    return;
  }
  const query = window.matchMedia ? window.matchMedia("(prefers-color-scheme: dark)") : null;
  const sync = () => apply(!!(query && query.matches));
  sync();
  if (query && query.addEventListener) query.addEventListener("change", sync);
}
