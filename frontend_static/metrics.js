// Every label the UI shows and its one definition: dlprof_plugin/terms.py, served by the `terms` route and loaded
// once before the first view. Labels are built with `term` / `termAttrs`, so each carries its definition as a
// tooltip and `data-term` naming its entry (the browser tests check every label of every view against it).

import {getJSON} from "./api.js";
import {h} from "./dom.js";

let TERMS = {};

/** Load the terms (before anything is drawn). */
export async function loadTerms() {
  TERMS = (await getJSON("terms")).terms || {};
}

/** The label of a term ("" for an unknown one, which the tests catch). */
export function label(key) {
  return (TERMS[key] || {}).label || "";
}

/** The definition of a term: the tooltip of its label. */
export function definition(key) {
  return (TERMS[key] || {}).definition || "";
}

/** Attributes of an element showing the label of `key` (merged with `attrs`; `title` adds to the definition). */
export function termAttrs(key, attrs = {}) {
  const title = [definition(key), attrs.title].filter(Boolean).join("\n");
  return {...attrs, title, dataset: {...(attrs.dataset || {}), term: key}};
}

/** An element whose text is the label of `key`, its definition as tooltip. */
export function term(tag, key, attrs = {}) {
  return h(tag, termAttrs(key, attrs), label(key));
}
