"""Table downloads: CSV, XLSX (minimal SpreadsheetML written with zipfile, no dependency) and JSON."""

from __future__ import annotations

import csv
import io
import json
import re
import zipfile
from xml.sax.saxutils import escape

XLSX_TYPE = "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet"
XLSX_MAX_ROWS = 1_048_575  # plus the header row
XLSX_MAX_CELL = 32767
_ILLEGAL_XML = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")


def _visible(columns: list[dict]) -> list[int]:
    return [i for i, c in enumerate(columns) if not c.get("hidden")]


def _cell_text(value, ctype: str):
    if value is None:
        return ""
    if ctype == "bool":
        return "yes" if value else "no"
    return value


def to_csv(columns: list[dict], rows: list[list]) -> bytes:
    """Header = column labels; hidden columns left out; yes/no flags; empty for missing values."""
    keep = _visible(columns)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([columns[i]["label"] for i in keep])
    types = [columns[i]["type"] for i in keep]
    for r in rows:
        writer.writerow([_cell_text(r[i], t) for i, t in zip(keep, types)])
    return out.getvalue().encode("utf-8")


def to_json(document: dict) -> bytes:
    return json.dumps(document, separators=(",", ":")).encode("utf-8")


def _col_letter(n: int) -> str:
    s = ""
    n += 1
    while n:
        n, rem = divmod(n - 1, 26)
        s = chr(65 + rem) + s
    return s


def _sheet_name(name: str) -> str:
    name = re.sub(r"[\[\]:*?/\\]", "_", name or "Sheet1")[:31]
    return name or "Sheet1"


_CONTENT_TYPES = """<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types">
<Default Extension="rels" ContentType="application/vnd.openxmlformats-package.relationships+xml"/>
<Default Extension="xml" ContentType="application/xml"/>
<Override PartName="/xl/workbook.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.sheet.main+xml"/>
<Override PartName="/xl/worksheets/sheet1.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.worksheet+xml"/>
<Override PartName="/xl/styles.xml" ContentType="application/vnd.openxmlformats-officedocument.spreadsheetml.styles+xml"/>
</Types>"""
_RELS = """<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">
<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/officeDocument" Target="xl/workbook.xml"/>
</Relationships>"""
_WORKBOOK = """<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<workbook xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main" xmlns:r="http://schemas.openxmlformats.org/officeDocument/2006/relationships">
<sheets><sheet name="{name}" sheetId="1" r:id="rId1"/></sheets>
</workbook>"""
_WORKBOOK_RELS = """<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<Relationships xmlns="http://schemas.openxmlformats.org/package/2006/relationships">
<Relationship Id="rId1" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/worksheet" Target="worksheets/sheet1.xml"/>
<Relationship Id="rId2" Type="http://schemas.openxmlformats.org/officeDocument/2006/relationships/styles" Target="styles.xml"/>
</Relationships>"""
_STYLES = """<?xml version="1.0" encoding="UTF-8" standalone="yes"?>
<styleSheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">
<fonts count="2"><font><sz val="11"/><name val="Calibri"/></font><font><b/><sz val="11"/><name val="Calibri"/></font></fonts>
<fills count="2"><fill><patternFill patternType="none"/></fill><fill><patternFill patternType="gray125"/></fill></fills>
<borders count="1"><border><left/><right/><top/><bottom/><diagonal/></border></borders>
<cellStyleXfs count="1"><xf numFmtId="0" fontId="0" fillId="0" borderId="0"/></cellStyleXfs>
<cellXfs count="2"><xf numFmtId="0" fontId="0" fillId="0" borderId="0" xfId="0"/><xf numFmtId="0" fontId="1" fillId="0" borderId="0" xfId="0" applyFont="1"/></cellXfs>
<cellStyles count="1"><cellStyle name="Normal" xfId="0" builtinId="0"/></cellStyles>
</styleSheet>"""


def _xml_text(text) -> str:
    text = str(text)
    if not text.isprintable():
        text = _ILLEGAL_XML.sub("", text)
    if len(text) > XLSX_MAX_CELL:
        text = text[:XLSX_MAX_CELL]
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _text_cell(ref: str, text, style: str = "") -> str:
    return f'<c r="{ref}" t="inlineStr"{style}><is><t xml:space="preserve">{_xml_text(text)}</t></is></c>'


def _cell_writer(letter: str, ctype: str):
    """A function (value, row number) -> cell XML for one column."""
    if ctype == "bool":

        def cell(v, n):
            return f'<c r="{letter}{n}" t="inlineStr"><is><t>{"yes" if v else "no"}</t></is></c>'
    elif ctype in ("int", "ns", "float", "pct"):

        def cell(v, n):
            if isinstance(v, (int, float)) and not isinstance(v, bool):
                return f'<c r="{letter}{n}"><v>{v!r}</v></c>'
            return _text_cell(f"{letter}{n}", v)
    else:

        def cell(v, n):
            return f'<c r="{letter}{n}" t="inlineStr"><is><t xml:space="preserve">{_xml_text(v)}</t></is></c>'

    return cell


def to_xlsx(columns: list[dict], rows: list[list], sheet: str = "Sheet1") -> bytes:
    """One worksheet: bold header of labels, numbers as numbers, text as inline strings (never formulas)."""
    keep = _visible(columns)
    letters = [_col_letter(j) for j in range(len(keep))]
    writers = [(i, _cell_writer(letters[j], columns[i]["type"])) for j, i in enumerate(keep)]
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED, compresslevel=1) as zf:
        zf.writestr("[Content_Types].xml", _CONTENT_TYPES)
        zf.writestr("_rels/.rels", _RELS)
        zf.writestr("xl/workbook.xml", _WORKBOOK.format(name=escape(_sheet_name(sheet), {'"': "&quot;"})))
        zf.writestr("xl/_rels/workbook.xml.rels", _WORKBOOK_RELS)
        zf.writestr("xl/styles.xml", _STYLES)
        parts = [
            '<?xml version="1.0" encoding="UTF-8" standalone="yes"?>\n'
            '<worksheet xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main">'
            '<sheetViews><sheetView workbookViewId="0"><pane ySplit="1" topLeftCell="A2" state="frozen"/>'
            "</sheetView></sheetViews><sheetData>",
            '<row r="1">'
            + "".join(_text_cell(f"{letters[j]}1", columns[i]["label"], ' s="1"') for j, i in enumerate(keep))
            + "</row>",
        ]
        with zf.open("xl/worksheets/sheet1.xml", "w") as fh:
            for n, r in enumerate(rows, start=2):
                parts.append(
                    f'<row r="{n}">' + "".join([w(r[i], n) for i, w in writers if r[i] is not None]) + "</row>"
                )
                if len(parts) >= 2000:
                    fh.write("".join(parts).encode("utf-8"))
                    parts.clear()
            parts.append("</sheetData></worksheet>")
            fh.write("".join(parts).encode("utf-8"))
    return buf.getvalue()
