// Tiny DOM helpers: build elements without a framework.

const SVG_NS = "http://www.w3.org/2000/svg";
const PROPS = new Set(["value", "checked", "disabled", "selected", "hidden", "indeterminate"]);

function apply(el, attrs, isSvg) {
  for (const [name, value] of Object.entries(attrs || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (name === "class") {
      el.setAttribute("class", Array.isArray(value) ? value.filter(Boolean).join(" ") : value);
    } else if (name === "text") {
      el.textContent = value;
    } else if (name === "style" && typeof value === "object") {
      Object.assign(el.style, value);
    } else if (name === "dataset") {
      Object.assign(el.dataset, value);
    } else if (name.startsWith("on") && typeof value === "function") {
      el.addEventListener(name.slice(2).toLowerCase(), value);
    } else if (!isSvg && PROPS.has(name)) {
      el[name] = value;
    } else {
      el.setAttribute(name, value === true ? "" : String(value));
    }
  }
}

function append(el, children) {
  for (const child of children) {
    if (child === null || child === undefined || child === false) continue;
    if (Array.isArray(child)) append(el, child);
    else if (child instanceof Node) el.appendChild(child);
    else el.appendChild(document.createTextNode(String(child)));
  }
}

/** h("div", {class: "x", onClick: fn}, "text", child...) -> HTMLElement */
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  apply(el, attrs, false);
  append(el, children);
  return el;
}

/** s("rect", {x: 0, ...}) -> SVGElement */
export function s(tag, attrs, ...children) {
  const el = document.createElementNS(SVG_NS, tag);
  apply(el, attrs, true);
  append(el, children);
  return el;
}

export function clear(el) {
  while (el.firstChild) el.removeChild(el.firstChild);
  return el;
}

export function replace(el, ...children) {
  clear(el);
  append(el, children);
  return el;
}

export function debounce(fn, ms) {
  let timer = null;
  return (...args) => {
    clearTimeout(timer);
    timer = setTimeout(() => fn(...args), ms);
  };
}

/** A small "Loading…" placeholder. */
export function loading(text = "Loading…") {
  return h("div", {class: "placeholder loading"}, h("span", {class: "spinner", "aria-hidden": "true"}), text);
}

export function placeholder(text) {
  return h("div", {class: "placeholder"}, text);
}

/** A titled card; returns {card, body}. */
export function card(title, {tooltip, id, wide, actions, cls} = {}) {
  const body = h("div", {class: "card-body"});
  const head = h("div", {class: "card-head"},
    h("h2", {class: "card-title", title: tooltip}, title, tooltip ? h("span", {class: "info", "aria-hidden": "true"}, "i") : null),
    actions || null);
  const el = h("section", {class: ["card", wide ? "wide" : "", cls || ""], id, "aria-label": title}, head, body);
  return {card: el, body};
}
