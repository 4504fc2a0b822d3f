// The Timeline's memory track: under the GPU rows, each GPU's allocated memory over the window in view (the
// `memory` route, drawn by memory_chart.js with the timeline's label column, so times line up with its rows).

import {getJSON, reportError} from "./api.js";
import {h, replace} from "./dom.js";
import {memoryChart} from "./memory_chart.js";
import {scope} from "./state.js";

const DELAY_MS = 120;
const CPU = 0;   // contract.DEVICE_TYPE_CPU: host memory is not a GPU row

/** {el, show(t0, t1, plotWidth), stop()}: `show` redraws the track for a window (debounced); `onHeight()` is
 * called when the track's height changed, so the timeline can give its rows the rest of the window. */
export function memoryTrack({labelWidth, onHeight = () => {}}) {
  const el = h("div", {class: "timeline-memory", id: "timeline-memory"});
  let controller = null;
  let timer = null;
  let stopped = false;
  let shownHeight = 0;

  async function fetchWindow(t0, t1, plotWidth) {
    if (controller) controller.abort();
    controller = new AbortController();
    const width = Math.round(plotWidth);
    try {
      const doc = await getJSON("memory", {...scope(), t0: Math.floor(t0), t1: Math.max(Math.ceil(t1), Math.floor(t0) + 1), width}, {signal: controller.signal});
      if (stopped) return;
      const gpus = doc.series.filter((x) => x.device_type !== CPU);
      if (!doc.recorded || !gpus.length) {
        replace(el, h("div", {class: "muted timeline-memory-none"}, doc.recorded ? "No GPU memory events." : doc.message));
      } else {
        replace(el, gpus.map((series) => memoryChart(series, {t0: doc.window[0], t1: doc.window[1], width: labelWidth + width,
          height: 56, labelWidth, compact: true, origin: doc.window[0]}).el));
      }
      el.dataset.window = `${doc.window ? doc.window.join(",") : ""}`;
      if (el.offsetHeight !== shownHeight) {
        shownHeight = el.offsetHeight;
        onHeight();
      }
      el.dataset.ready = "1";
    } catch (err) {
      if (err.name !== "AbortError" && !stopped) reportError(err);
    }
  }

  return {
    el,
    show(t0, t1, plotWidth) {
      clearTimeout(timer);
      el.dataset.ready = "";
      timer = setTimeout(() => fetchWindow(t0, t1, plotWidth), DELAY_MS);
    },
    stop() {
      stopped = true;
      clearTimeout(timer);
      if (controller) controller.abort();
    },
  };
}
