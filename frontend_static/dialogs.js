// Modal dialogs on the native <dialog> element.

import {h} from "./dom.js";

/** A modal dialog; returns {dialog, body, footer, open(), close()}. The element is removed when closed. */
export function modal(title, {id, wide = false} = {}) {
  const body = h("div", {class: "dialog-body"});
  const footer = h("div", {class: "dialog-footer"});
  const closeButton = h("button", {type: "button", class: "icon-button dialog-x", "aria-label": "Close"}, "×");
  const dialog = h("dialog", {class: ["dialog", wide ? "wide" : ""], id, "aria-label": title},
    h("div", {class: "dialog-head"}, h("h2", {}, title), closeButton), body, footer);
  const close = () => {
    if (dialog.open) dialog.close();
  };
  closeButton.addEventListener("click", close);
  dialog.addEventListener("close", () => dialog.remove());
  return {
    dialog, body, footer, close,
    open() {
      document.body.appendChild(dialog);
      dialog.showModal();
    },
  };
}

/** Ask for confirmation; resolves to true when the user confirms. */
export function confirmDialog(title, message, {okLabel = "OK", id = "confirm-dialog"} = {}) {
  return new Promise((resolve) => {
    const m = modal(title, {id});
    let answer = false;
    m.body.appendChild(typeof message === "string" ? h("p", {}, message) : message);
    const cancel = h("button", {type: "button", class: "secondary dialog-cancel", onClick: () => m.close()}, "Cancel");
    const ok = h("button", {type: "button", class: "primary dialog-ok", onClick: () => {
      answer = true;
      m.close();
    }}, okLabel);
    m.footer.append(cancel, ok);
    m.dialog.addEventListener("close", () => resolve(answer));
    m.open();
    ok.focus();
  });
}
