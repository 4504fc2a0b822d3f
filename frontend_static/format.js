// Number and unit formatting. Fixed en-US locale so the UI reads the same everywhere (and tests can predict it).

const LOCALE = "en-US";
const intFmt = new Intl.NumberFormat(LOCALE, {maximumFractionDigits: 0});
const fmt2 = new Intl.NumberFormat(LOCALE, {maximumFractionDigits: 2});
const fmt1 = new Intl.NumberFormat(LOCALE, {minimumFractionDigits: 1, maximumFractionDigits: 1});

export const DASH = "—";

function isMissing(v) {
  return v === null || v === undefined || v === "" || (typeof v === "number" && !Number.isFinite(v));
}

/** 1234567 -> "1,234,567" */
export function fmtInt(v) {
  if (isMissing(v)) return DASH;
  const n = Number(v);
  return Number.isFinite(n) ? intFmt.format(n) : String(v);
}

/** 1234.5678 -> "1,234.57" */
export function fmtNum(v) {
  if (isMissing(v)) return DASH;
  const n = Number(v);
  return Number.isFinite(n) ? fmt2.format(n) : String(v);
}

const UNITS = [[1e9, "s"], [1e6, "ms"], [1e3, "µs"]];

/** The unit fmtNs shows a duration in: "s", "ms", "µs" or "ns". */
export function unitOf(v) {
  const a = Math.abs(Number(v)) || 0;
  for (const [scale, unit] of UNITS) if (a >= scale) return unit;
  return "ns";
}

/** A duration in ns in the most readable unit: 950 -> "950 ns", 30000 -> "30 µs", 1290000 -> "1.29 ms". */
export function fmtNs(v) {
  if (isMissing(v)) return DASH;
  const n = Number(v);
  if (!Number.isFinite(n)) return String(v);
  const a = Math.abs(n);
  for (const [scale, unit] of UNITS) {
    if (a >= scale) return `${fmt2.format(n / scale)} ${unit}`;
  }
  return `${fmt2.format(n)} ns`;
}

/** The exact value, for tooltips: "1,290,000 ns". */
export function fmtNsExact(v) {
  if (isMissing(v)) return "";
  return `${fmtNum(v)} ns`;
}

/** 8.6046 -> "8.6 %" */
export function fmtPct(v) {
  if (isMissing(v)) return DASH;
  const n = Number(v);
  return Number.isFinite(n) ? `${fmt1.format(n)} %` : String(v);
}

export function fmtBytes(v) {
  if (isMissing(v)) return DASH;
  let n = Number(v);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${fmt2.format(n)} ${units[i]}`;
}

export function fmtBool(v) {
  if (isMissing(v)) return DASH;
  if (v === true || v === 1 || v === "1" || String(v).toLowerCase() === "yes" || String(v).toLowerCase() === "true") return "Yes";
  return "No";
}

export function truthy(v) {
  return fmtBool(v) === "Yes";
}

/** Format a cell by column type; returns {text, title}. */
export function formatCell(type, v) {
  switch (type) {
    case "ns":
      return {text: fmtNs(v), title: fmtNsExact(v)};
    case "int":
      return {text: fmtInt(v), title: ""};
    case "float":
      return {text: fmtNum(v), title: ""};
    case "pct":
      return {text: fmtPct(v), title: ""};
    case "bool":
      return {text: fmtBool(v), title: ""};
    default:
      return {text: isMissing(v) ? "" : String(v), title: ""};
  }
}

export function isNumericType(type) {
  return type === "ns" || type === "int" || type === "float" || type === "pct";
}

/** Plain value for exports (clipboard TSV, print view). */
export function plainCell(type, v) {
  if (v === null || v === undefined) return "";
  if (type === "bool") return fmtBool(v);
  return String(v);
}

const OFFSET_UNITS = [[1e9, "s", 9], [1e6, "ms", 6], [1e3, "µs", 3]];

/** A time offset in ns (a kernel's start from its iteration's start) with every nanosecond shown, so offsets
 * order as the numbers do: 950 -> "+950 ns", 12345 -> "+12.345 µs", 1234567 -> "+1.234567 ms". */
export function fmtOffsetNs(v) {
  if (isMissing(v)) return DASH;
  const n = Math.round(Number(v));
  if (!Number.isFinite(n)) return String(v);
  const sign = n < 0 ? "−" : "+";
  const a = Math.abs(n);
  for (const [scale, unit, digits] of OFFSET_UNITS) {
    if (a >= scale) {
      const whole = Math.floor(a / scale);
      const frac = String(a - whole * scale).padStart(digits, "0");
      return `${sign}${intFmt.format(whole)}.${frac} ${unit}`;
    }
  }
  return `${sign}${a} ns`;
}
