// Tensor Cores: every Tensor-Core-eligible op, with its TC and non-TC kernel time and names.

import {showOp} from "./details.js";
import {card} from "./dom.js";
import {definition} from "./metrics.js";
import {scope} from "./state.js";
import {DataTable} from "./table.js";

export function mount(el) {
  const {card: c, body} = card("Tensor Core Eligible Ops", {wide: true, id: "tensor-core", tooltip: definition("tc_utilization")});
  const table = new DataTable({route: "table/tensor_core", scope, exportName: "tensor_core", pageSize: 25, selectable: true,
    rowKey: "op_index", onSelect: (row) => row.op_index !== undefined && showOp(row.op_index)});
  body.appendChild(table.el);
  el.appendChild(c);
}
