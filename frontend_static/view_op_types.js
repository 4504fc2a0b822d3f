// Op Type Summary: every statistic per op type.

import {card} from "./dom.js";
import {scope} from "./state.js";
import {DataTable} from "./table.js";

export function mount(el) {
  const {card: c, body} = card("Op Type Summary", {wide: true, id: "op-types",
    tooltip: "One row per op type: number of ops and calls, and CPU time, GPU time, CPU overhead and GPU idle statistics over their calls."});
  const table = new DataTable({route: "table/op_types", scope, title: "", exportName: "op_type_summary", pageSize: 25});
  body.appendChild(table.el);
  el.appendChild(c);
}
