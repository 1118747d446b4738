"""The page of ``vt-bench view``: its CSS, its filter script and the HTML skeleton.

Everything the page shows was escaped by :mod:`vt_bench.view` before it gets
here; the script only reads ``data-*`` attributes and the URL fragment, sets
``hidden`` and ``textContent``, and never parses markup (no ``innerHTML``).

The filter lives in the URL fragment, so a filtered view is a link::

    view.html#env=VT-Math-v0&kind=modpow&solved=0&min_reward=0.5&truncated=1&tool_error=1

Keys (all optional, combined with AND): ``env``, ``kind`` (the task's kind or
family), ``step`` (a training run's transcript file), ``solved`` (1/0),
``min_reward`` (a number: reward >= it), ``truncated`` (1/0), ``tool_error``
(1/0: any tool call failed), ``error`` (1/0: the rollout raised). Every
rollout is a ``<details class="rollout">`` carrying those values as
``data-*`` attributes; a hidden one has the ``hidden`` attribute, a shown one
``data-visible="1"``; ``#shown`` holds how many are shown. ``open=1`` also
expands the shown rollouts (for a screenshot, or a link to read them).
"""

from __future__ import annotations

#: The filter keys the script reads from the URL fragment, in the order of the form.
FILTER_KEYS = ("env", "kind", "step", "solved", "min_reward", "truncated", "tool_error", "error")

CSS = """
body{font:14px/1.4 system-ui,sans-serif;margin:0 1.5em 3em;color:#1d1d1f;background:#fafafa}
h1{font-size:20px;margin:.8em 0 .2em}h2{font-size:16px;margin:1.2em 0 .4em}
.src{color:#666;font-size:12px;word-break:break-all}
table.sum{border-collapse:collapse;background:#fff;font-variant-numeric:tabular-nums}
table.sum td,table.sum th{border:1px solid #ddd;padding:2px 8px;text-align:right}
table.sum td:first-child,table.sum td:nth-child(2),table.sum th{text-align:left}
table.sum tr.env td{font-weight:600;background:#f0f3f7}
#filters{position:sticky;top:0;z-index:2;background:#fafafa;padding:.5em 0;
  border-bottom:1px solid #ddd;display:flex;flex-wrap:wrap;gap:.6em;align-items:center}
#filters label{font-size:12px;color:#444}#filters input{width:5em}
details.rollout{background:#fff;border:1px solid #ddd;border-radius:4px;margin:.3em 0}
details.rollout>summary{cursor:pointer;padding:.3em .6em;font-size:13px}
.b{display:inline-block;border-radius:3px;padding:0 .4em;margin-right:.3em;font-size:12px}
.ok{background:#d7f5dd;color:#0a5c1a}.bad{background:#fbdada;color:#8a1010}
.warn{background:#fff0c2;color:#6b4f00}.dim{color:#777}
.body{padding:.2em .8em .8em;border-top:1px solid #eee}
.turn{border-left:3px solid #9bb4d6;margin:.6em 0;padding-left:.6em}
.turn h4{margin:.2em 0;font-size:12px;color:#345}
pre{white-space:pre-wrap;word-break:break-word;margin:.2em 0;padding:.4em;font-size:12px;
  background:#f6f6f6;border-radius:3px;max-height:40em;overflow:auto}
pre.action{background:#eef4ff}pre.obs,pre.q{background:#f4f4f4;max-height:none}
.sp{color:#999}.cut{color:#a60;font-style:italic}
.call{font-size:12px;margin:.2em 0}
img{max-width:420px;max-height:420px;display:block;margin:.3em 0;border:1px solid #ccc}
dl.meta{display:grid;grid-template-columns:max-content auto;gap:0 1em;font-size:12px}
dl.meta dt{color:#666}dl.meta dd{margin:0;word-break:break-all}
"""

SCRIPT = """
(function () {
  "use strict";
  var KEYS = %(keys)s;
  var rollouts = Array.prototype.slice.call(document.querySelectorAll("details.rollout"));
  var form = document.getElementById("filters");
  function current() {
    var params = new URLSearchParams(location.hash.replace(/^#/, "")), f = {};
    KEYS.forEach(function (k) { var v = params.get(k); if (v !== null && v !== "") f[k] = v; });
    return f;
  }
  function matches(el, f) {
    for (var i = 0; i < KEYS.length; i++) {
      var k = KEYS[i];
      if (!(k in f)) continue;
      if (k === "min_reward") {
        var m = parseFloat(f[k]), r = parseFloat(el.getAttribute("data-reward"));
        if (!isNaN(m) && !(r >= m)) return false;
      } else if (el.getAttribute("data-" + k.replace("_", "-")) !== f[k]) {
        return false;
      }
    }
    return true;
  }
  function apply() {
    var f = current(), shown = 0;
    rollouts.forEach(function (el) {
      var ok = matches(el, f);
      el.hidden = !ok;
      if (ok) { el.setAttribute("data-visible", "1"); shown++; }
      else { el.removeAttribute("data-visible"); }
    });
    document.getElementById("shown").textContent = String(shown);
    if (new URLSearchParams(location.hash.replace(/^#/, "")).get("open") === "1") {
      rollouts.forEach(function (el) { if (!el.hidden) el.open = true; });
    }
    KEYS.forEach(function (k) {
      var input = form.elements.namedItem(k);
      if (input) input.value = k in f ? f[k] : "";
    });
  }
  function fromForm() {
    var params = new URLSearchParams();
    KEYS.forEach(function (k) {
      var input = form.elements.namedItem(k);
      if (input && input.value !== "") params.set(k, input.value);
    });
    history.replaceState(null, "", "#" + params.toString());
    apply();
  }
  form.addEventListener("change", fromForm);
  form.addEventListener("submit", function (e) { e.preventDefault(); fromForm(); });
  document.getElementById("reset").addEventListener("click", function () {
    history.replaceState(null, "", "#"); apply();
  });
  document.getElementById("expand").addEventListener("click", function () {
    rollouts.forEach(function (el) { if (!el.hidden) el.open = true; });
  });
  document.getElementById("collapse").addEventListener("click", function () {
    rollouts.forEach(function (el) { el.open = false; });
  });
  window.addEventListener("hashchange", apply);
  apply();
})();
"""


def script() -> str:
    """The filter script, its keys filled in (constants only: nothing from the data)."""
    keys = "[" + ",".join(f'"{k}"' for k in FILTER_KEYS) + "]"
    return SCRIPT % {"keys": keys}


def page(*, title: str, header: str, summary: str, filters: str, rollouts: str) -> str:
    """The whole document; every argument is HTML already escaped by the caller."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{title}</title><style>{CSS}</style></head><body>\n"
        f"{header}\n<h2>Summary</h2>\n{summary}\n<h2>Rollouts</h2>\n{filters}\n"
        f'<div id="rollouts">\n{rollouts}\n</div>\n'
        f"<script>{script()}</script>\n</body></html>\n"
    )
