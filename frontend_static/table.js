// The reusable data table. Paging, sorting and filtering happen on the server (`table/<name>` routes):
// the browser only ever holds one page, so tables of 10^5 rows stay responsive.

import {getJSON, reportError, routeUrl} from "./api.js";
import {clear, debounce, h} from "./dom.js";
import {fmtInt, formatCell, isNumericType, plainCell, unitOf} from "./format.js";

const PAGE_SIZES = [10, 25, 50, 100];
const COLLAPSE_AT = 80;        // characters before a cell is collapsed behind "See More"
const PRINT_LIMIT = 5000;      // rows in a print view

let tableCounter = 0;

/** A `json_all` answer (the table answer with every filtered row) as {columns, rows}. */
function exportRows(data, fallbackColumns) {
  return {columns: (data && data.columns) || fallbackColumns || [], rows: (data && data.rows) || []};
}

/** Column label for display: the column's term (dlprof_plugin/terms.py); exports keep DLProf's header. */
export function displayLabel(col) {
  return col.display || col.label || col.key;
}

/** Attributes of a column's label: its term and definition. */
export function columnLabelAttrs(col, extraTitle = "") {
  return {title: [col.tooltip || "", extraTitle].filter(Boolean).join("\n"), dataset: {term: col.term || col.key}};
}

// A number of a column filter and its unit, as typed (`500us`, `1.5 s`, `20%`, `3`).
const FILTER_NUMBER = /([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?)(\s*(?:ns|us|µs|μs|ms|s|%)(?![A-Za-z]))?/gi;
const UNIT_TEXT = {"µs": "us"};   // what the server's filter grammar spells (http_api.md)

/** The unit a duration column is read in: that of its largest value on the first page the table showed (the
 * cells give each value its own unit; a number typed without one is read in this one, as the hint says). */
export function durationUnit(values) {
  const largest = Math.max(0, ...values.filter((v) => v !== null && v !== undefined).map((v) => Math.abs(Number(v)) || 0));
  return unitOf(largest);
}

/** A column filter as the server reads it: plain numbers of a duration column get the column's unit. */
export function serverFilter(col, value, unit) {
  if (col.type !== "ns" || !unit) return value;
  // each bound of a range on its own (the dots of `..` are no decimal point)
  return value.split("..").map((part) => part.replace(FILTER_NUMBER, (all, number, given) =>
    (given ? all : `${number}${UNIT_TEXT[unit] || unit}`))).join("..");
}

/** What a column's filter accepts, said in its tooltip and under it when the server refuses one. */
export function filterHint(col, unit) {
  const grammar = "N, >N, <N, >=N, <=N or N..M";
  if (col.type === "ns") {
    return `Use ${grammar}: durations with their unit (ns, µs or us, ms, s), e.g. >1ms, 500us..2ms, <1.5 s; ` +
      `a number alone is in ${unit}, this column's unit.`;
  }
  if (col.type === "pct") return `Use ${grammar}: percentages, e.g. >20% or 10..30 (a number alone is in %).`;
  if (col.type === "bool") return "Use yes or no (1 or 0).";
  if (isNumericType(col.type)) return `Use ${grammar}, e.g. >10 or 2..5.`;
  return "";
}

function filterPlaceholder(col, unit) {
  if (col.type === "bool") return "yes/no";
  if (col.type === "ns") return `>1${unit}, 2..5`;
  if (col.type === "pct") return ">20%, 10..30";
  if (isNumericType(col.type)) return ">N, N..M";
  return "Search";
}

export class DataTable {
  /**
   * opts: {route: "table/ops", scope: () => ({run, aggr, domain}), extra: {op_index: 3} | null,
   *        title, pageSize, selectable, onSelect(rowObject), renderers: {key: (value, row, col) => Node|string},
   *        hidden: [keys], labels: {key: "display label"}, order: [keys shown first, in this order],
   *        exportName, emptyText, rowKey, caption}
   */
  constructor(opts) {
    this.opts = {pageSize: 10, selectable: false, renderers: {}, hidden: [], emptyText: "No data.", ...opts};
    this.name = opts.route.replace(/^table\//, "");
    this.extra = opts.extra === undefined ? {} : opts.extra;
    this.q = "";
    this.cols = {};
    this.applied = {};   // the column filters of the rows shown
    this.units = {};   // column key -> the unit its plain filter numbers are read in
    this.offset = 0;
    this.limit = this.opts.pageSize;
    this.sort = null;
    this.order = null;
    this.columns = null;
    this.answer = null;
    this.seq = 0;
    this.selectedKey = null;
    this.id = `dt${++tableCounter}`;
    this.build();
    if (this.extra === null) this.showEmpty(this.opts.emptyText);
    else this.reload();
  }

  // ---- DOM ---------------------------------------------------------------------------------------------
  build() {
    const o = this.opts;
    this.pageSizeSelect = h("select", {class: "dt-pagesize", id: `${this.id}-len`, onChange: () => {
      this.limit = Number(this.pageSizeSelect.value);
      this.offset = 0;
      this.reload();
    }}, PAGE_SIZES.map((n) => h("option", {value: n, selected: n === this.limit}, String(n))));
    this.searchInput = h("input", {type: "search", class: "dt-search", id: `${this.id}-q`, placeholder: "Search…", title: "Search the text columns (case-insensitive)",
      onInput: debounce(() => {
        this.q = this.searchInput.value.trim();
        this.offset = 0;
        this.reload();
      }, 250)});
    const exportButton = (label, title, action, cls) =>
      h("button", {type: "button", class: `dt-export ${cls}`, title, onClick: action}, label);
    this.actions = h("div", {class: "dt-actions", role: "group", "aria-label": "Export"},
      exportButton("Copy", "Copy all filtered rows to the clipboard (tab-separated)", () => this.copy(), "dt-copy"),
      exportButton("CSV", "Download all filtered rows as CSV", () => this.download("csv"), "dt-csv"),
      exportButton("Excel", "Download all filtered rows as an Excel workbook (.xlsx)", () => this.download("xlsx"), "dt-xlsx"),
      exportButton("JSON", "Download all filtered rows as JSON", () => this.download("json_all"), "dt-json"),
      exportButton("PDF", "Print all filtered rows (choose “Save as PDF” in the print dialog)", () => this.print(), "dt-pdf"));
    this.head = h("thead");
    this.body = h("tbody");
    this.table = h("table", {class: ["dt", o.selectable ? "selectable" : ""]},
      o.caption ? h("caption", {class: "sr-only"}, o.caption) : null, this.head, this.body);
    this.info = h("div", {class: "dt-info", "aria-live": "polite"});
    this.pager = h("nav", {class: "dt-pager", "aria-label": "Pages"});
    this.status = h("div", {class: "dt-status", role: "status", "aria-live": "polite"});
    this.note = h("div", {class: "dt-note", role: "note", hidden: true});
    this.el = h("div", {class: "datatable", dataset: {table: this.name, state: "idle", renders: "0"}},
      h("div", {class: "dt-toolbar"},
        o.title ? h("h3", {class: "dt-title", title: o.tooltip || ""}, o.title) : null,
        h("label", {class: "dt-len", for: `${this.id}-len`}, "Show ", this.pageSizeSelect, " rows"),
        h("div", {class: "dt-spacer"}),
        this.actions,
        h("label", {class: "dt-q", for: `${this.id}-q`}, h("span", {class: "sr-only"}, "Search"), this.searchInput)),
      this.note,
      h("div", {class: "dt-scroll"}, this.table),
      h("div", {class: "dt-footer"}, this.info, this.pager),
      this.status);
  }

  /** Show a message instead of rows (e.g. "Select an op to list its kernels"). */
  showEmpty(message) {
    this.seq += 1;
    this.answer = null;
    clear(this.body).appendChild(h("tr", {class: "dt-empty"}, h("td", {colspan: Math.max(1, this.visibleColumns().length)}, message)));
    this.info.textContent = "";
    clear(this.pager);
    this.el.classList.add("dt-disabled");
    this.el.dataset.state = "empty";
  }

  /** Change the table's extra parameters (null: nothing selected) and reload from the first page. */
  setExtra(extra, emptyText) {
    this.extra = extra;
    this.offset = 0;
    this.selectedKey = null;
    if (extra === null) this.showEmpty(emptyText || this.opts.emptyText);
    else this.reload();
  }

  visibleColumns() {
    const cols = (this.columns || []).filter((c) => !c.hidden && !this.opts.hidden.includes(c.key));
    const order = this.opts.order || [];
    if (!order.length) return cols;
    const rank = (c, i) => (order.includes(c.key) ? order.indexOf(c.key) : order.length + i);
    return cols.map((c, i) => [rank(c, i), c]).sort((a, b) => a[0] - b[0]).map(([, c]) => c);
  }

  // ---- data ---------------------------------------------------------------------------------------------
  filterParams() {
    const p = {...(this.opts.scope ? this.opts.scope() : {}), ...(this.extra || {})};
    if (this.sort) {
      p.sort = this.sort;
      p.order = this.order;
    }
    if (this.q) p.q = this.q;
    for (const [key, value] of Object.entries(this.cols)) {
      const col = (this.columns || []).find((c) => c.key === key);
      if (value) p[`col.${key}`] = col ? serverFilter(col, value, this.units[key]) : value;
    }
    return p;
  }

  async reload() {
    if (this.extra === null) return;
    const seq = ++this.seq;
    this.el.dataset.state = "loading";
    this.el.classList.add("dt-busy");
    this.el.classList.remove("dt-disabled");
    if (!this.answer) clear(this.body).appendChild(h("tr", {class: "dt-empty"}, h("td", {colspan: Math.max(1, this.visibleColumns().length)}, "Loading…")));
    let answer;
    try {
      answer = await getJSON(this.opts.route, {...this.filterParams(), offset: this.offset, limit: this.limit});
    } catch (err) {
      if (seq !== this.seq) return;
      this.el.classList.remove("dt-busy");
      const column = err.status === 400 ? this.filterColumnOf(err.message) : null;
      if (column !== null) {
        // a search the server refused: said at its filter; the last rows stay
        const col = this.columns.find((c) => c.key === column);
        this.showFilterError(column, filterHint(col, this.units[column]) || err.message);
        this.cols = {...this.applied};   // the filters the rows shown were found with
        this.el.dataset.state = this.answer ? "ready" : "error";
        if (this.answer) return;
      }
      this.el.dataset.state = "error";
      clear(this.body).appendChild(h("tr", {class: "dt-empty dt-error"}, h("td", {colspan: Math.max(1, this.visibleColumns().length)}, `Could not load: ${err.message}`)));
      this.info.textContent = "";
      clear(this.pager);
      if (err.status !== 400) reportError(err);   // a malformed search is explained in the table itself
      return;
    }
    if (seq !== this.seq) return;   // a newer request superseded this one
    this.answer = answer;
    this.applied = {...this.cols};
    this.sort = answer.sort || this.sort;
    this.order = answer.order || this.order;
    const signature = (answer.columns || []).map((c) => c.key).join("|");
    if (signature !== this.signature) {
      this.columns = answer.columns || [];
      this.signature = signature;
      this.units = {};
      (this.columns).forEach((c, i) => {
        if (c.type === "ns") this.units[c.key] = durationUnit((answer.rows || []).map((r) => r[i]));
      });
      this.renderHead();
    } else {
      this.updateSortIndicators();
    }
    this.renderBody();
    this.renderFooter();
    this.renderNote();
    this.el.classList.remove("dt-busy");
    this.el.dataset.state = "ready";
    this.el.dataset.renders = String(Number(this.el.dataset.renders) + 1);
    if (this.opts.onLoad) this.opts.onLoad(this);
  }

  // ---- rendering ------------------------------------------------------------------------------------------
  renderHead() {
    clear(this.head);
    const cols = this.visibleColumns();
    const titles = h("tr", {class: "dt-head"});
    const filters = h("tr", {class: "dt-filters"});
    for (const col of cols) {
      const label = displayLabel(col);
      const extra = col.type === "ns" ? "Exact value in ns on hover; exports keep ns." : "";
      const head = col.sortable === false
        ? h("span", {class: "dt-label"}, label)
        : h("button", {type: "button", class: "dt-sort", "aria-label": `${label}: sort`, onClick: () => this.toggleSort(col)},
          h("span", {class: "dt-label"}, label), h("span", {class: "dt-arrow", "aria-hidden": "true"}));
      titles.appendChild(h("th", {scope: "col", ...columnLabelAttrs(col, [extra, col.sortable === false ? "" : "(click to sort)"].filter(Boolean).join("\n")),
        dataset: {key: col.key, type: col.type, term: col.term || col.key}, class: isNumericType(col.type) ? "num" : ""}, head));
      if (col.filterable === false) {
        filters.appendChild(h("th", {}));
        continue;
      }
      const errorId = `${this.id}-f-${col.key}`;
      const unit = this.units[col.key];
      const input = h("input", {type: "search", class: "dt-col-search", placeholder: filterPlaceholder(col, unit), "aria-label": `Search ${label}`,
        title: filterHint(col, unit), value: this.cols[col.key] || "", dataset: {key: col.key, unit: unit || ""}});
      input.addEventListener("input", debounce(() => {
        const value = input.value.trim();
        this.showFilterError(col.key, "");
        if ((this.cols[col.key] || "") === value) return;
        this.cols[col.key] = value;   // the server checks it (a refusal is said here, the rows stay)
        this.offset = 0;
        this.reload();
      }, 250));
      filters.appendChild(h("th", {dataset: {key: col.key}}, input,
        h("div", {class: "dt-filter-error", id: errorId, role: "alert", hidden: true})));
    }
    this.head.append(titles, filters);
    this.updateSortIndicators();
  }

  /** Show (or clear, with "") the reason a column's search is not applied, under its input. */
  showFilterError(key, message) {
    const th = this.head.querySelector(`tr.dt-filters th[data-key="${CSS.escape(key)}"]`);
    if (!th) return;
    const input = th.querySelector("input");
    const box = th.querySelector(".dt-filter-error");
    box.textContent = message;
    box.hidden = !message;
    if (message) {
      input.setAttribute("aria-invalid", "true");
      input.setAttribute("aria-describedby", box.id);
    } else {
      input.removeAttribute("aria-invalid");
      input.removeAttribute("aria-describedby");
    }
    const invalid = [...this.head.querySelectorAll(".dt-col-search[aria-invalid=true]")].map((el) => el.dataset.key);
    if (invalid.length) this.el.dataset.invalid = invalid.join(" ");
    else delete this.el.dataset.invalid;
  }

  /** The column a server message about a per-column search names ("filter on 'gpu_total' ..."), or null. */
  filterColumnOf(message) {
    const m = /filter on '([^']+)'/.exec(String(message || ""));
    return m && this.columns && this.columns.some((c) => c.key === m[1]) ? m[1] : null;
  }

  updateSortIndicators() {
    for (const th of this.head.querySelectorAll("th[data-key]")) {
      const active = th.dataset.key === this.sort;
      const arrow = th.querySelector(".dt-arrow");
      if (!arrow) continue;
      th.setAttribute("aria-sort", active ? (this.order === "desc" ? "descending" : "ascending") : "none");
      arrow.textContent = active ? (this.order === "desc" ? "▼" : "▲") : "↕";
      th.classList.toggle("sorted", active);
    }
  }

  toggleSort(col) {
    if (this.sort === col.key) this.order = this.order === "desc" ? "asc" : "desc";
    else {
      this.sort = col.key;
      this.order = isNumericType(col.type) ? "desc" : "asc";   // numbers: largest first
    }
    this.offset = 0;
    this.updateSortIndicators();
    this.reload();
  }

  rowObject(row) {
    const obj = {};
    (this.columns || []).forEach((c, i) => {
      obj[c.key] = row[i];
    });
    return obj;
  }

  rowKey(obj) {
    const key = this.opts.rowKey || (this.columns && this.columns[0] && this.columns[0].key);
    return obj[key];
  }

  renderCell(col, value, obj) {
    const custom = this.opts.renderers[col.key];
    if (custom) {
      const out = custom(value, obj, col);
      if (out !== undefined) return out;
    }
    const {text, title} = formatCell(col.type, value);
    const long = col.type === "multiline" || (col.type === "text" && text.length > COLLAPSE_AT);
    if (!long || (col.type === "multiline" && !text.includes("\n") && text.length <= COLLAPSE_AT)) {
      // rows stay one line tall: a long text is cut at the cell's width, whole in its tooltip
      if (text.length > 24) return h("span", {class: "clip-cell", title: title || text}, text);
      return title ? h("span", {title}, text) : text;
    }
    return collapsible(text);
  }

  renderBody() {
    clear(this.body);
    const cols = this.visibleColumns();
    const rows = this.answer.rows || [];
    if (!rows.length) {
      this.body.appendChild(h("tr", {class: "dt-empty"}, h("td", {colspan: Math.max(1, cols.length)}, this.q || Object.values(this.cols).some(Boolean) ? "No matching rows." : this.opts.emptyText)));
      return;
    }
    const index = new Map((this.columns || []).map((c, i) => [c.key, i]));
    for (const row of rows) {
      const obj = this.rowObject(row);
      const tr = h("tr", {dataset: {key: this.rowKey(obj)}});
      for (const col of cols) {
        tr.appendChild(h("td", {class: [isNumericType(col.type) ? "num" : "", `c-${col.type}`], dataset: {key: col.key}}, this.renderCell(col, row[index.get(col.key)], obj)));
      }
      if (this.opts.selectable) {
        tr.tabIndex = 0;
        // a click focuses the row without scrolling the table sideways to it (its start would leave the view)
        tr.addEventListener("mousedown", (ev) => {
          if (ev.button !== 0 || ev.target.closest("button, a, input")) return;
          ev.preventDefault();
          tr.focus({preventScroll: true});
        });
        const select = () => this.select(tr, obj);
        tr.addEventListener("click", (ev) => {
          if (ev.target.closest("button")) return;
          select();
        });
        tr.addEventListener("keydown", (ev) => {
          if (ev.key === "Enter" || ev.key === " ") {
            ev.preventDefault();
            select();
          }
        });
        if (this.selectedKey !== null && String(this.rowKey(obj)) === String(this.selectedKey)) {
          tr.classList.add("selected");
          tr.setAttribute("aria-selected", "true");
        }
      }
      this.body.appendChild(tr);
    }
  }

  select(tr, obj) {
    for (const other of this.body.querySelectorAll("tr.selected")) {
      other.classList.remove("selected");
      other.removeAttribute("aria-selected");
    }
    tr.classList.add("selected");
    tr.setAttribute("aria-selected", "true");
    this.selectedKey = this.rowKey(obj);
    if (this.opts.onSelect) this.opts.onSelect(obj, this);
  }

  renderFooter() {
    const a = this.answer;
    const filtered = Number(a.filtered ?? a.total ?? 0);
    const total = Number(a.total ?? filtered);
    const shown = (a.rows || []).length;
    const from = shown ? this.offset + 1 : 0;
    const to = this.offset + shown;
    this.info.textContent = `Showing ${fmtInt(from)} to ${fmtInt(to)} of ${fmtInt(filtered)} entries` +
      (filtered !== total ? ` (filtered from ${fmtInt(total)} total entries)` : "");
    clear(this.pager);
    const pages = Math.max(1, Math.ceil(filtered / this.limit));
    const current = Math.floor(this.offset / this.limit);
    const go = (p) => {
      this.offset = Math.max(0, Math.min(pages - 1, p)) * this.limit;
      this.reload();
    };
    const btn = (label, page, {disabled = false, aria, current: isCurrent = false, cls = ""} = {}) =>
      h("button", {type: "button", class: ["page", cls, isCurrent ? "current" : ""], disabled, "aria-label": aria || `Page ${page + 1}`,
        "aria-current": isCurrent ? "page" : null, onClick: () => go(page)}, label);
    this.pager.appendChild(btn("«", 0, {disabled: current === 0, aria: "First page", cls: "first"}));
    this.pager.appendChild(btn("‹ Previous", current - 1, {disabled: current === 0, aria: "Previous page", cls: "prev"}));
    const windowPages = new Set([0, pages - 1]);
    for (let p = current - 2; p <= current + 2; p++) if (p >= 0 && p < pages) windowPages.add(p);
    let last = -1;
    for (const p of [...windowPages].sort((x, y) => x - y)) {
      if (p - last > 1) this.pager.appendChild(h("span", {class: "ellipsis"}, "…"));
      this.pager.appendChild(btn(fmtInt(p + 1), p, {current: p === current}));
      last = p;
    }
    this.pager.appendChild(btn("Next ›", current + 1, {disabled: current >= pages - 1, aria: "Next page", cls: "next"}));
    this.pager.appendChild(btn("»", pages - 1, {disabled: current >= pages - 1, aria: "Last page", cls: "last"}));
  }

  /** A server note (e.g. a partial answer still being computed): shown, and the table retried shortly. */
  renderNote() {
    const a = this.answer;
    this.note.textContent = a.partial ? (a.message || "Partial results; retrying…") : "";
    this.note.hidden = !a.partial;
    clearTimeout(this.retryTimer);
    if (a.partial) this.retryTimer = setTimeout(() => {
      if (this.el.isConnected) this.reload();
    }, 2000);
  }

  flash(message, isError = false) {
    this.status.textContent = message;
    this.status.classList.toggle("error", isError);
    this.status.classList.add("visible");
    clearTimeout(this.flashTimer);
    this.flashTimer = setTimeout(() => this.status.classList.remove("visible"), 4000);
  }

  // ---- exports --------------------------------------------------------------------------------------------
  /** csv / xlsx / json_all: the server writes every filtered row; the browser downloads it. */
  download(format) {
    if (this.extra === null) return;
    const ext = {csv: "csv", xlsx: "xlsx", json_all: "json"}[format];
    const url = routeUrl(this.opts.route, {...this.filterParams(), offset: 0, limit: -1, format});
    // The server names the file (Content-Disposition); `download` keeps the page where it is.
    const a = h("a", {href: url, download: "", style: {display: "none"}});
    document.body.appendChild(a);
    a.click();
    a.remove();
    this.flash(`Downloading ${ext.toUpperCase()}…`);
  }

  async allRows() {
    const data = await getJSON(this.opts.route, {...this.filterParams(), offset: 0, limit: -1, format: "json_all"});
    return exportRows(data, this.columns);
  }

  async copy() {
    if (this.extra === null) return;
    let data;
    try {
      data = await this.allRows();
    } catch (err) {
      this.flash(`Copy failed: ${err.message}`, true);
      return;
    }
    const cols = data.columns.filter((c) => !c.hidden && !this.opts.hidden.includes(c.key));
    const idx = cols.map((c) => data.columns.indexOf(c));
    const clean = (v) => String(v).replace(/[\t\r\n]+/g, " ");
    const lines = [cols.map((c) => clean(c.label || c.key)).join("\t")];   // raw ns values: keep DLProf's labels
    for (const row of data.rows) lines.push(idx.map((i, j) => clean(plainCell(cols[j].type, row[i]))).join("\t"));
    const text = lines.join("\n");
    const ok = await copyText(text);
    this.el.dataset.copied = String(data.rows.length);
    this.flash(ok ? `Copied ${fmtInt(data.rows.length)} rows to the clipboard.` : "Could not copy to the clipboard.", !ok);
  }

  async print() {
    if (this.extra === null) return;
    let data;
    try {
      data = await this.allRows();
    } catch (err) {
      this.flash(`Print view failed: ${err.message}`, true);
      return;
    }
    const cols = data.columns.filter((c) => !c.hidden && !this.opts.hidden.includes(c.key));
    const idx = cols.map((c) => data.columns.indexOf(c));
    const rows = data.rows.slice(0, PRINT_LIMIT);
    const filters = [this.q ? `search “${this.q}”` : "", ...Object.entries(this.cols).filter(([, v]) => v).map(([k, v]) => `${k}: ${v}`)].filter(Boolean);
    const scope = this.opts.scope ? this.opts.scope() : {};
    const subtitle = [scope.run ? `Run ${scope.run}` : "", scope.aggr ? `aggregation ${scope.aggr}` : "",
      filters.length ? `filtered by ${filters.join(", ")}` : "", `${fmtInt(data.rows.length)} rows`,
      data.rows.length > PRINT_LIMIT ? `first ${fmtInt(PRINT_LIMIT)} shown` : ""].filter(Boolean).join(" · ");
    const labelled = cols.map((c) => ({...c, displayLabel: displayLabel(c)}));
    openPrintView(this.opts.title || this.opts.exportName || this.name, subtitle, labelled, rows.map((row) => idx.map((i, j) => formatCell(cols[j].type, row[i]).text)));
  }
}

/** "See More / See Less" collapsed text. */
export function collapsible(text, limit = COLLAPSE_AT) {
  const firstLine = text.split("\n")[0];
  const short = firstLine.length > limit ? `${firstLine.slice(0, limit)}…` : (text.includes("\n") ? `${firstLine} …` : firstLine);
  const span = h("span", {class: "cell-text"}, short);
  const button = h("button", {type: "button", class: "see-more", "aria-expanded": "false"}, "See More");
  const wrap = h("span", {class: "cell-long"}, span, " ", button);
  button.addEventListener("click", (ev) => {
    ev.stopPropagation();
    const open = button.getAttribute("aria-expanded") !== "true";
    button.setAttribute("aria-expanded", String(open));
    button.textContent = open ? "See Less" : "See More";
    span.textContent = open ? text : short;
    wrap.classList.toggle("open", open);
  });
  return wrap;
}

/** navigator.clipboard with a textarea + execCommand fallback (iframes may lack clipboard-write). */
export async function copyText(text) {
  try {
    if (navigator.clipboard && window.isSecureContext) {
      await navigator.clipboard.writeText(text);
      return true;
    }
  } catch (_) {
    // fall through to the legacy path
  }
  const area = h("textarea", {style: {position: "fixed", top: "-1000px", opacity: "0"}, readonly: true});
  area.value = text;
  document.body.appendChild(area);
  area.select();
  let ok = false;
  try {
    ok = document.execCommand("copy");
  } catch (_) {
    ok = false;
  }
  area.remove();
  return ok;
}

const PAGE_WIDTH_PX = 1040;   // an A4 or Letter page in landscape, within its margins (style.css @page)

/** The print table's font, small enough for its narrowest layout (every word of every header whole, style.css)
 * to fit the page's width. */
function fitToPage(table) {
  table.style.width = "min-content";
  let size = 10.5;
  table.style.fontSize = `${size}px`;
  // (the cells' padding does not scale with the font: a few steps down after the first estimate)
  size = Math.floor(Math.min(10.5, (10.5 * PAGE_WIDTH_PX) / Math.max(1, table.scrollWidth)) * 2) / 2;
  while (size > 6) {
    table.style.fontSize = `${size}px`;
    if (table.scrollWidth <= PAGE_WIDTH_PX) break;
    size -= 0.5;
  }
  table.style.width = "";
}

/** A print-styled table over the page, then the browser's print dialog (Save as PDF). */
export function openPrintView(title, subtitle, columns, rows) {
  const old = document.getElementById("print-view");
  if (old) old.remove();
  const close = () => {
    view.remove();
    document.body.classList.remove("printing");
  };
  const view = h("div", {id: "print-view", class: "print-view"},
    h("div", {class: "print-toolbar no-print"},
      h("button", {type: "button", class: "primary", onClick: () => window.print()}, "Print / Save as PDF"),
      h("button", {type: "button", class: "print-close", onClick: close}, "Close print view")),
    h("h1", {}, `DLProf — ${title}`),
    h("p", {class: "print-sub"}, subtitle),
    h("table", {class: "print-table"},
      h("thead", {}, h("tr", {}, columns.map((c) => h("th", {}, c.displayLabel || displayLabel(c))))),
      h("tbody", {}, rows.map((r) => h("tr", {}, r.map((v) => h("td", {}, v)))))));
  document.body.appendChild(view);
  document.body.classList.add("printing");
  fitToPage(view.querySelector(".print-table"));
  window.addEventListener("afterprint", close, {once: true});
  setTimeout(() => window.print(), 50);
  return view;
}
