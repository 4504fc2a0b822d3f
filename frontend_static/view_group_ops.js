// Group Ops: the module hierarchy (group nodes of the op-name tree), expandable, plus the flat table.

import {getJSON, reportError} from "./api.js";
import {card, clear, h, loading, placeholder} from "./dom.js";
import {formatCell, isNumericType} from "./format.js";
import {scope} from "./state.js";
import {DataTable, columnLabelAttrs, displayLabel} from "./table.js";

const TREE_KEYS = ["name", "num_calls", "num_ops", "num_tc_eligible", "num_using_tc", "cpu_total", "gpu_total", "gpu_avg", "overhead_total", "idle_total"];

function shortName(name, parent) {
  if (parent && name.startsWith(parent)) return name.slice(parent.length) || name;
  return name;
}

export function mount(el) {
  const tree = card("Module Hierarchy", {wide: true, id: "group-tree", tooltip: "Group nodes of the op-name tree (modules and scopes); expand a node for its children. Times are statistics over the iterations (per iteration, flattened)."});
  const flat = card("All Group Nodes", {wide: true, id: "group-table"});
  el.append(tree.card, flat.card);
  const table = new DataTable({route: "table/group_ops", scope, exportName: "group_ops", pageSize: 10});
  flat.body.appendChild(table.el);

  let columns = null;
  const tbody = h("tbody");
  const thead = h("thead");
  tree.body.appendChild(loading());

  async function children(parent) {
    const data = await getJSON("table/group_ops", {...scope(), parent, offset: 0, limit: 1000});
    if (!columns) {
      const all = data.columns || [];
      columns = all.filter((c) => TREE_KEYS.includes(c.key) && !c.hidden);
      if (!columns.length) columns = all.filter((c) => !c.hidden);
      clear(thead).appendChild(h("tr", {}, columns.map((c) => h("th", {class: isNumericType(c.type) ? "num" : "", ...columnLabelAttrs(c)}, displayLabel(c)))));
    }
    const idx = new Map((data.columns || []).map((c, i) => [c.key, i]));
    return (data.rows || []).map((r) => Object.fromEntries([...idx.entries()].map(([k, i]) => [k, r[i]])));
  }

  function setToggle(self) {
    self.toggle.setAttribute("aria-expanded", String(self.open));
    if (!self.toggle.classList.contains("leaf")) self.toggle.textContent = self.open ? "▾" : "▸";
  }

  function collapse(self) {
    for (const k of self.kids || []) {
      collapse(k);
      k.tr.remove();
    }
    self.open = false;
    setToggle(self);
  }

  async function expand(self) {
    if (self.kids === null) {
      self.toggle.disabled = true;
      try {
        const rows = await children(self.node.name);
        self.kids = rows.map((child) => rowFor(child, self.depth + 1, self.node.name));
      } catch (err) {
        reportError(err);
        self.kids = [];
      }
      self.toggle.disabled = false;
      if (!self.kids.length) {
        self.toggle.classList.add("leaf");
        self.toggle.textContent = "•";
        self.toggle.title = "No child groups";
      }
    }
    self.open = true;
    setToggle(self);
    let after = self.tr;
    for (const k of self.kids) {
      after.after(k.tr);
      after = k.tr;
    }
  }

  function rowFor(node, depth, parent) {
    const toggle = h("button", {type: "button", class: "tree-toggle", "aria-expanded": "false", "aria-label": `Expand or collapse ${node.name}`}, "▸");
    const tr = h("tr", {class: "tree-row", dataset: {name: node.name, depth}});
    const self = {node, depth, tr, toggle, kids: null, open: false};
    if (node.has_children === false) {
      self.kids = [];
      toggle.classList.add("leaf");
      toggle.textContent = "•";
      toggle.disabled = true;
      toggle.title = "No child groups";
    }
    toggle.addEventListener("click", () => (self.open ? collapse(self) : expand(self)));
    for (const c of columns) {
      if (c.key === "name") {
        tr.appendChild(h("td", {class: "tree-name", style: {paddingLeft: `${8 + depth * 18}px`}, title: node.name}, toggle, h("span", {class: "mono"}, shortName(String(node.name), parent))));
        continue;
      }
      const {text, title} = formatCell(c.type, node[c.key]);
      tr.appendChild(h("td", {class: isNumericType(c.type) ? "num" : "", title}, text));
    }
    return self;
  }

  children("").then((rows) => {
    clear(tree.body);
    if (!rows.length) {
      tree.body.appendChild(placeholder("No group nodes."));
      return;
    }
    for (const node of rows) tbody.appendChild(rowFor(node, 0, "").tr);
    tree.body.appendChild(h("div", {class: "dt-scroll"}, h("table", {class: "dt tree"}, thead, tbody)));
  }).catch((err) => {
    reportError(err);
    clear(tree.body).appendChild(placeholder(`Could not load group nodes: ${err.message}`));
  });
}
