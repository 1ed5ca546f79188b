"""The token view's page: static HTML, inline CSS and a small inline script over embedded JSON.

`render(data)` turns the data of `ppl_jax.analysis.view.page_data` into one self-contained HTML file. It
loads nothing from anywhere: the page's Content-Security-Policy (`default-src 'none'`, inline
style and script only) makes the browser refuse any request, and the data sits in
`<script type="application/json" id="ppl-data">`, its `<`, `>` and `&` written as JSON escapes so
that no token text can end the element. The script builds the page with `textContent` only (a
token's text is never parsed as HTML): the document list, the tokens of the chosen document
coloured by bins of a scale with a legend (surprisal: fixed; the change B - A: fitted to the
page's changes, `view_data.diff_scale`), whitespace made visible (a newline as a mark
and a line break), and the details of a token under the pointer.
"""

from __future__ import annotations

import html
import json
import os
import re
from typing import Any

from ppl_jax.analysis.view_scale import DECIMALS


def _n(count: int, noun: str) -> str:
    return f"{count:,} {noun}{'' if count == 1 else 's'}"


def left_out(sel: dict[str, Any]) -> str:
    """One paragraph saying what the page holds and what it left out."""
    s = sel
    text = (
        f"Shown: {s['shown_documents']:,} of {_n(s['documents'], 'document')} with scored tokens "
        f"({_n(s['shown_tokens'], 'token')}), {s['rule']} first, at most "
        f"{_n(s['max_documents'], 'document')} and {_n(s['max_tokens'], 'token')} "
        f"(--max_documents, --max_tokens)."
    )
    if s["left_out_documents"]:
        text += (
            f" Left out: {_n(s['left_out_documents'], 'document')} "
            f"({_n(s['left_out_tokens'], 'token')})."
        )
    if s["cut_documents"]:
        text += (
            f" Cut: {_n(s['cut_documents'], 'document')} shown from its first scored token up to "
            f"the token budget ({_n(s['cut_tokens'], 'token')} not shown)."
        )
    if not s["left_out_documents"] and not s["cut_documents"]:
        text += " Nothing was left out."
    unscored = s["corpus_documents"] - s["documents"]
    if unscored > 0:
        text += f" {_n(unscored, 'document')} of the corpus had no scored token."
    return text


def _run_line(r: dict[str, Any]) -> str:
    protocol = r["protocol"] if isinstance(r["protocol"], str) else json.dumps(r["protocol"])
    tokenizer = r["tokenizer"] if isinstance(r["tokenizer"], str) else json.dumps(r["tokenizer"])
    return (
        f"{r['label'] + ': ' if r['label'] else ''}{r['path']}: dataset {r['dataset']}, "
        f"protocol {protocol}, tokenizer {tokenizer}, {r['tokens']:,} scored tokens, "
        f"mean surprisal {r['mean']:.{DECIMALS}f} bits/token"
        + (f", top-{r['top_k']} alternatives" if r["top_k"] else "")
        + (", with a reference model" if r["reference"] else "")
    )


def _script_json(data: Any) -> str:
    """JSON safe inside a `<script>` element: `<`, `>` and `&` (only ever inside JSON strings)
    become `\\u003c`, `\\u003e`, `\\u0026`, so no token text can close the element."""
    text = json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    for ch in "<>&\u2028\u2029":
        text = text.replace(ch, f"\\u{ord(ch):04x}")
    return text


def _css_bins(prefix: str, colors: list[str]) -> str:
    rules = []
    for i, c in enumerate(colors):
        r, g, b = (int(c[j : j + 2], 16) for j in (1, 3, 5))
        ink = "#fff" if 0.299 * r + 0.587 * g + 0.114 * b < 140 else "#111"
        rules.append(f".{prefix}{i}{{background:{c};color:{ink}}}")
    return "\n".join(rules)


_MARKER = re.compile(r"@(TITLE|HEADER|BINS|MODE|DATA|SCRIPT)@")


def render(data: dict[str, Any]) -> str:
    """The page: static HTML (the runs, what was left out), the data as JSON, inline CSS and JS."""
    compare = len(data["runs"]) == 2
    title = "ppl_jax token view: " + (
        " vs ".join(os.path.basename(os.path.dirname(r["path"])) or r["path"] for r in data["runs"])
    )
    header = "".join(f"<p>{html.escape(_run_line(r))}</p>" for r in data["runs"])
    header += f'<p class="note">{html.escape(left_out(data["selection"]))}</p>'
    css = _css_bins("s", data["scale"]["surprisal"]["colors"])
    css += "\n" + _css_bins("d", data["scale"]["diff"]["colors"])
    values = {
        "TITLE": html.escape(title),
        "HEADER": header,
        "BINS": css,
        "MODE": "compare" if compare else "single",
        "DATA": _script_json(data),
        "SCRIPT": _SCRIPT,
    }
    # One pass over the template: a value is never searched for the markers again, so a run's
    # path or a document's name holding `@SCRIPT@` (or `@DATA@`) stays text. (Chained
    # `str.replace` put the whole script into the data's JSON, and the page broke.)
    return _MARKER.sub(lambda m: values[m.group(1)], _TEMPLATE)


_TEMPLATE = """<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta http-equiv="Content-Security-Policy"
 content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>@TITLE@</title>
<style>
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#111;background:#fff;
 height:100vh;display:flex;flex-direction:column}
header{padding:8px 16px;border-bottom:1px solid #ccc}
header p{margin:2px 0}
.note{color:#444}
.foot{font-size:12px;padding:2px 6px}
main{display:flex;flex:1;min-height:300px}
#list{flex:0 0 40%;min-width:300px;overflow:auto;border-right:1px solid #ccc}
body[data-mode=compare] #list{flex-basis:46%}
#list table{border-collapse:collapse;width:100%}
#list th,#list td{padding:2px 5px;text-align:right;white-space:nowrap;
 font-variant-numeric:tabular-nums}
#list th{position:sticky;top:0;background:#eee;cursor:pointer;white-space:normal;
 vertical-align:bottom}
#list th.src,#list td.src{text-align:left}
#list td.src{max-width:0;width:100%;overflow:hidden;text-overflow:ellipsis}
#list tr.sel{outline:2px solid #333}
#list tbody tr:hover{background:#f3f3f3;cursor:pointer}
#doc{flex:1;overflow:auto;padding:8px 16px}
#tokens{font:13px/1.9 ui-monospace,monospace;white-space:pre-wrap;overflow-wrap:anywhere;
 tab-size:4}
.doctitle{font-weight:600;margin:4px 0 0}
#tokens span{border-right:1px solid rgba(0,0,0,.15)}
#tokens span.miss{text-decoration:underline dotted}
.legend span{display:inline-block;padding:0 6px;font-size:12px}
#tip{position:fixed;display:none;width:max-content;max-width:calc(100vw - 16px);background:#fff;
 border:1px solid #888;padding:6px 8px;font-size:12px;box-shadow:2px 2px 6px rgba(0,0,0,.2);
 pointer-events:none}
#tip table{border-collapse:collapse}
#tip td{padding:0 4px}
#tip .tt{font-family:ui-monospace,monospace;white-space:pre}
#tip .sides{display:flex;gap:12px}
#tip .side{margin-top:4px}
#tip tr.target{font-weight:bold}
@BINS@
</style>
</head>
<body data-mode="@MODE@">
<header>
<h1 style="font-size:16px;margin:4px 0">@TITLE@</h1>
@HEADER@
<noscript><p>This page needs JavaScript (inline, no network) to show the tokens.</p></noscript>
<div id="controls"></div>
</header>
<main>
<div id="list"></div><div id="doc"><div id="dochead"></div><div id="tokens"></div></div>
</main>
<div id="tip"></div>
<script type="application/json" id="ppl-data">@DATA@</script>
<script>@SCRIPT@</script>
</body>
</html>
"""

_SCRIPT = r"""
"use strict";
(function () {
  const D = JSON.parse(document.getElementById("ppl-data").textContent);
  const two = D.runs.length === 2;
  const $ = (id) => document.getElementById(id);
  function el(tag, text, cls) {
    const e = document.createElement(tag);
    if (text !== undefined) e.textContent = text;
    if (cls) e.className = cls;
    return e;
  }
  function bin(edges, x) { let i = 0; while (i < edges.length && x >= edges[i]) i++; return i; }
  function f(x) { return x === null || x === undefined ? "n/a" : x.toFixed(4); }
  function sg(x) { return x === null ? "n/a" : (x > 0 ? "+" : "") + x.toFixed(4); }
  const dd = two ? D.scale.diff.decimals : 4;  // the change B - A: the scale's decimals
  function sgd(x) { return x === null ? "n/a" : (x > 0 ? "+" : "") + x.toFixed(dd); }
  function pr(p) { return p >= 0.001 ? p.toFixed(4) : p.toExponential(3); }
  function shown(t) {  // whitespace made visible: a mark, then the line break or tab itself
    if (t === "") return "\u2205";
    return t.replace(/\r/g, "\u240d").replace(/\t/g, "\u21e5\t").replace(/\n/g, "\u21b5\n");
  }
  let colour = two ? "delta" : "a", sortBy = two ? "diff" : "a", current = null;

  function legend() {
    const box = el("div", undefined, "legend");
    const s = colour === "delta" ? D.scale.diff : D.scale.surprisal;
    const p = colour === "delta" ? "d" : "s";
    box.appendChild(el("span", colour === "delta"
      ? "surprisal B \u2212 A, bits (blue: B less surprised, red: more" +
        (s.adapted ? "; scale fitted to this page's changes" : "") + "):"
      : "surprisal" + (two ? " " + colour.toUpperCase() : "") + ", bits:"));
    for (let i = 0; i <= s.edges.length; i++) {
      const lo = i ? s.edges[i - 1] : null, hi = i < s.edges.length ? s.edges[i] : null;
      const label = lo === null ? "< " + hi : hi === null ? "\u2265 " + lo : lo + " to " + hi;
      box.appendChild(el("span", label, p + i));
    }
    box.appendChild(el("span", "dotted underline: not the model's first choice" +
      (two ? " (" + (colour === "b" ? "B" : "A") + ")" : "")));
    return box;
  }

  function controls() {
    const c = $("controls");
    c.textContent = "";
    if (two) {
      const sel = el("select");
      const options = [["delta", "change B \u2212 A"], ["a", "surprisal A"], ["b", "surprisal B"]];
      for (const [v, t] of options) {
        const o = el("option", t);
        o.value = v;
        o.selected = v === colour;
        sel.appendChild(o);
      }
      sel.onchange = () => { colour = sel.value; controls(); if (current) show(current); };
      c.appendChild(el("span", "colour by: "));
      c.appendChild(sel);
    }
    c.appendChild(legend());
  }

  function list() {
    const cols = [["#", null], ["document", null], ["tokens", null]];
    cols.push(["bits/token" + (two ? " A" : ""), "a"]);
    if (two) cols.push(["bits/token B", "b"], ["B \u2212 A", "diff"]);
    const t = el("table"), h = el("tr");
    for (const [name, key] of cols) {
      const th = el("th", name + (key && key === sortBy ? " \u25be" : ""),
        name === "document" ? "src" : undefined);
      if (key) th.title = key === "diff" ? "sort: largest change |B \u2212 A| first" : "sort";
      if (key) th.onclick = () => { sortBy = key; list(); };
      h.appendChild(th);
    }
    t.appendChild(el("thead")).appendChild(h);
    const body = t.appendChild(el("tbody"));
    const docs = D.documents.slice();
    const key = (d) =>
      sortBy === "a" ? -d.mean[0] : sortBy === "b" ? -d.mean[1] : -Math.abs(d.diff);
    docs.sort((x, y) => key(x) - key(y) || x.document - y.document);
    for (const d of docs) {
      const r = el("tr");
      r.appendChild(el("td", String(d.document)));
      r.appendChild(el("td", d.title, "src")).title = d.title + "\n" + d.source;
      const n = el("td", d.tokens.toLocaleString("en-US") + (d.shown < d.tokens ? "*" : ""));
      if (d.shown < d.tokens) n.title = "only its first " + d.shown + " tokens are in this page";
      r.appendChild(n);
      r.appendChild(el("td", f(d.mean[0])));
      if (two) {
        r.appendChild(el("td", f(d.mean[1])));
        r.appendChild(el("td", sgd(d.diff)));
      }
      if (d === current) r.className = "sel";
      r.onclick = () => { current = d; list(); show(d); };
      body.appendChild(r);
    }
    $("list").textContent = "";
    $("list").appendChild(t);
    if (D.documents.some((d) => d.shown < d.tokens)) {
      $("list").appendChild(el("p", "* cut: only its first tokens are in this page " +
        "(--max_tokens)", "note foot"));
    }
  }

  function show(d) {
    const head = $("dochead");
    head.textContent = "";
    head.appendChild(el("p", d.title, "doctitle"));
    let line = "document " + d.document + " (" + d.source + "), " + d.tokens +
      " scored tokens, mean " + f(d.mean[0]) + " bits/token";
    if (two) line += " (A), " + f(d.mean[1]) + " (B), B \u2212 A " + sgd(d.diff);
    if (d.shown < d.tokens) line += "; only its first " + d.shown + " tokens are in this page";
    head.appendChild(el("p", line));
    const box = $("tokens"), frag = document.createDocumentFragment();
    const s = D.scale, v = d.sides[colour === "b" ? 1 : 0];
    for (let i = 0; i < d.id.length; i++) {
      const cls = colour === "delta" ? "d" + bin(s.diff.edges, d.delta[i])
        : "s" + bin(s.surprisal.edges, v.surprisal[i]);
      const sp = el("span", shown(d.text[i]), cls + (v.correct[i] ? "" : " miss"));
      sp.dataset.i = i;
      frag.appendChild(sp);
    }
    box.textContent = "";
    box.appendChild(frag);
  }

  function side(d, i, v, who) {
    const box = el("div", undefined, "side");
    if (who) box.appendChild(el("b", who));
    const s = v.surprisal[i];
    box.appendChild(el("div", "probability " + pr(Math.pow(2, -s))));
    box.appendChild(el("div", "surprisal " + f(s) + " bits"));
    box.appendChild(el("div", "entropy " + f(v.entropy[i]) + " nats (" +
      f(v.entropy[i] / Math.LN2) + " bits)"));
    box.appendChild(el("div", v.correct[i] ? "the model's first choice" : "not its first choice"));
    if (v.kl) {
      box.appendChild(el("div", "KL(reference \u2016 model) " + f(v.kl[i]) + " nats"));
      box.appendChild(el("div", "\u0394 log p (model \u2212 reference) " +
        sg(v.delta_logprob[i]) + " nats"));
      box.appendChild(el("div", "same first choice as the reference: " +
        (v.same_top1[i] ? "yes" : "no")));
    }
    if (v.top) {
      box.appendChild(el("div", "top " + v.top[i].length + ":"));
      const t = el("table");
      v.top[i].forEach((id, j) => {
        const r = el("tr");
        const text = D.vocab[id] !== undefined ? JSON.stringify(D.vocab[id]) : "id " + id;
        r.appendChild(el("td", j + 1 + "."));
        r.appendChild(el("td", text, "tt"));
        r.appendChild(el("td", pr(v.top_p[i][j])));
        if (id === d.id[i]) r.className = "target";
        t.appendChild(r);
      });
      box.appendChild(t);
    }
    return box;
  }

  function details(d, i) {
    const tip = el("div");
    tip.appendChild(el("div", JSON.stringify(d.text[i]), "tt"));
    tip.appendChild(el("div", "document " + d.document + ", offset " + d.offset[i] +
      ", context " + d.position[i] + " tokens, token id " + d.id[i]));
    if (two) tip.appendChild(el("div", "surprisal B \u2212 A: " + sgd(d.delta[i]) + " bits"));
    const row = el("div", undefined, "sides");
    d.sides.forEach((v, k) => row.appendChild(side(d, i, v, two ? "AB"[k] : "")));
    tip.appendChild(row);
    return tip;
  }

  const tip = $("tip");
  $("tokens").addEventListener("mousemove", (e) => {
    const sp = e.target.closest("span[data-i]");
    if (!sp || !current) { tip.style.display = "none"; return; }
    tip.textContent = "";
    tip.appendChild(details(current, +sp.dataset.i));
    tip.style.display = "block";
    const below = e.clientY + 16 + tip.offsetHeight <= window.innerHeight;
    const x = Math.min(e.clientX + 14, window.innerWidth - tip.offsetWidth - 4);
    const y = below ? e.clientY + 16 : e.clientY - tip.offsetHeight - 8;
    tip.style.left = Math.max(0, x) + "px";
    tip.style.top = Math.max(0, y) + "px";
  });
  $("tokens").addEventListener("mouseleave", () => { tip.style.display = "none"; });

  controls();
  current = D.documents.slice().sort((x, y) =>
    (two ? Math.abs(y.diff) - Math.abs(x.diff) : y.mean[0] - x.mean[0]) ||
    x.document - y.document)[0] || null;
  list();
  if (current) show(current);
})();
"""
