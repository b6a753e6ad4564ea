"""Small HTML builders for the report pages; every user string passes through :func:`esc`."""

from __future__ import annotations

import html
import json
import math
from typing import Any, Iterable, Sequence

from dmlkit import __version__

PAGE_STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0 auto;
max-width:1100px;padding:1rem 1.5rem 3rem;color:#1f2328;line-height:1.45}
h1{font-size:1.6rem;margin-bottom:.2rem}h2{font-size:1.25rem;border-bottom:1px solid #d0d7de;
padding-bottom:.25rem;margin-top:2rem}
.subtitle{color:#57606a;margin-top:0}
nav a{margin-right:.9rem}
table{border-collapse:collapse;margin:.5rem 0;font-size:.92rem;display:block;max-width:100%;overflow-x:auto}
th,td{border:1px solid #d0d7de;padding:.25rem .6rem;text-align:left;vertical-align:top}
th{background:#f6f8fa}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.best{font-weight:700}
tr.differs td,tr.differs th{background:#fff8c5}
.note{color:#57606a;font-style:italic}
.warning{color:#9a6700}
figure{margin:.75rem 0}figure.plot img{max-width:100%;height:auto;border:1px solid #eaeef2}
.answer{font-size:1.05rem;background:#f6f8fa;border-left:4px solid #0969da;padding:.5rem .8rem;margin:.5rem 0}
.answer p{margin:.2rem 0}
figcaption{color:#57606a;font-size:.88rem}
code,pre{font-family:ui-monospace,SFMono-Regular,Menlo,Consolas,monospace;font-size:.85rem}
pre{background:#f6f8fa;padding:.6rem;overflow-x:auto}
details summary{cursor:pointer;color:#0969da}
h3{font-size:1rem;margin:.5rem 0 .25rem}
.grids{display:flex;flex-wrap:wrap;gap:1.5rem;align-items:flex-start}
.grid{display:grid;gap:6px;margin:.25rem 0}
.grid figure{margin:0;width:88px}
.grid .tile{display:flex;align-items:center;justify-content:center;width:80px;height:80px;border:4px solid}
.grid img{display:block;max-width:80px;max-height:80px}
.grid figcaption{font-size:.75rem;line-height:1.25;width:88px;overflow:hidden;white-space:nowrap;text-overflow:ellipsis}
.grid .row-label{font-size:.75rem;align-self:center;color:#57606a}
.scroll{max-width:100%;overflow-x:auto}
.tables{display:flex;flex-wrap:wrap;gap:0 2rem;align-items:flex-start}.tables>div{max-width:100%}
.tables h3{margin-top:.5rem}
p,li,code,figcaption{overflow-wrap:anywhere}
td.num,th{white-space:nowrap}
""".strip()


def esc(value: Any) -> str:
    """HTML-escape ``str(value)`` (quotes included, so it is also safe inside attributes)."""
    return html.escape(str(value), quote=True)


def format_value(value: Any) -> str:
    """Display text for a config/metric value: floats to 4 decimals, containers as JSON."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return str(value)
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.4g}"
        return f"{value:.4f}"
    if isinstance(value, (list, tuple, dict)):
        return json.dumps(value, default=str)
    return str(value)


def note(text: str) -> str:
    """A short italic explanation, e.g. why a section is empty."""
    return f'<p class="note">{esc(text)}</p>'


def figure(png_base64: str, alt: str, caption: str | None = None, *, width: int | None = None,
           data: dict[str, Any] | None = None) -> str:
    """An ``<img>`` holding a base64 PNG data URI, with alt text and optional caption.

    ``width`` is the CSS width (a 2x PNG is shown at half its pixels, sharp on high-DPI screens);
    ``data`` become ``data-*`` attributes of the ``<figure>`` (axis labels, smallest font) for checks.
    """
    cap = f"<figcaption>{esc(caption)}</figcaption>" if caption else ""
    size = f' width="{int(width)}"' if width else ""
    attrs = "".join(f' data-{esc(k)}="{esc(v)}"' for k, v in (data or {}).items())
    return (
        f'<figure class="plot"{attrs}><img src="data:image/png;base64,{png_base64}" alt="{esc(alt)}"{size}>'
        f"{cap}</figure>"
    )


def table(
    header: Sequence[str],
    rows: Iterable[Sequence[Any]],
    *,
    numeric_columns: Iterable[int] = (),
    bold_cells: Iterable[tuple[int, int]] = (),
    row_classes: Sequence[str] | None = None,
    row_header: bool = True,
) -> str:
    """A table; the first cell of each row is a ``<th>`` when ``row_header``; values escaped."""
    numeric = set(numeric_columns)
    bold = set(bold_cells)
    parts = ["<table><thead><tr>", "".join(f"<th>{esc(h)}</th>" for h in header), "</tr></thead><tbody>"]
    for r, row in enumerate(rows):
        cls = row_classes[r] if row_classes and row_classes[r] else ""
        parts.append(f'<tr class="{esc(cls)}">' if cls else "<tr>")
        for c, cell in enumerate(row):
            text = esc(format_value(cell))
            if c == 0 and row_header:
                parts.append(f"<th>{text}</th>")
                continue
            classes = [name for name, on in (("num", c in numeric), ("best", (r, c) in bold)) if on]
            attr = f' class="{" ".join(classes)}"' if classes else ""
            parts.append(f"<td{attr}>{text}</td>")
        parts.append("</tr>")
    parts.append("</tbody></table>")
    return "".join(parts)


def section(section_id: str, title: str, body: str) -> str:
    """A ``<section id=...>`` with an ``<h2>`` heading."""
    return f'<section id="{esc(section_id)}"><h2>{esc(title)}</h2>{body}</section>'


def page(title: str, subtitle: str, sections: Sequence[tuple[str, str, str]], lead: str = "") -> str:
    """A complete self-contained HTML document; ``sections`` holds ``(id, title, body_html)``;
    ``lead`` (HTML) sits under the title, before the navigation: the page's answer in a few lines."""
    nav = " ".join(f'<a href="#{esc(sid)}">{esc(stitle)}</a>' for sid, stitle, _ in sections)
    body = "\n".join(section(sid, stitle, sbody) for sid, stitle, sbody in sections)
    return (
        "<!DOCTYPE html>\n"
        '<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'<meta name="generator" content="dmlkit {esc(__version__)}">'
        f"<title>{esc(title)}</title><style>{PAGE_STYLE}</style></head>\n"
        f"<body><header><h1>{esc(title)}</h1><p class=\"subtitle\">{esc(subtitle)}</p>{lead}"
        f"<nav>{nav}</nav></header>\n{body}\n</body></html>\n"
    )
