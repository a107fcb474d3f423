// Shared helpers of every mi-core view (vanilla JS, no dependencies, works from file://).
"use strict";
const MI = {};
// The page's data. Non-finite numbers travel as {"__float__": "NaN" | "Infinity" | "-Infinity"}
// (JSON has no NaN); they come back as numbers and are shown as NaN / inf, never dropped.
MI.data = () => JSON.parse(document.getElementById("mi-data").textContent, (k, v) =>
  v !== null && typeof v === "object" && !Array.isArray(v) && typeof v.__float__ === "string" &&
  Object.keys(v).length === 1 ? Number(v.__float__) : v);
// Float32 tensors travel as base64 of little-endian bytes: {b64, shape}.
MI.f32 = (t) => {
  const s = atob(t.b64), b = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) b[i] = s.charCodeAt(i);
  return new Float32Array(b.buffer);
};
// Text as Python's repr writes it: a character that does not print (controls, format
// characters such as bidi overrides and zero-width spaces, lone surrogates, separators
// other than the space) becomes an escape, so nothing is invisible and nothing reorders
// the text around it. `quote`: also escape the backslash and that quote (for MI.tok).
const NOPRINT = /[\p{C}\p{Z}]/u, NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r"};
MI.esc = (s, quote) => {
  let out = "";
  for (const ch of String(s)) {
    const cp = ch.codePointAt(0);
    if (quote && (ch === "\\" || ch === quote)) out += "\\" + ch;
    else if (ch === " " || !NOPRINT.test(ch)) out += ch;
    else if (NAMED[ch]) out += NAMED[ch];
    else if (cp < 0x100) out += "\\x" + cp.toString(16).padStart(2, "0");
    else if (cp < 0x10000) out += "\\u" + cp.toString(16).padStart(4, "0");
    else out += "\\U" + cp.toString(16).padStart(8, "0");
  }
  return out;
};
// A token as the terminal prints it (Python repr: quoted, escapes), so ' Paris' and 'Paris'
// differ and an empty, zero-width or whitespace token is visible. Always set as
// textContent, never innerHTML: a token that looks like markup stays text.
MI.tok = (s) => {
  s = String(s);
  const q = s.includes("'") && !s.includes('"') ? '"' : "'";
  return q + MI.esc(s, q) + q;
};
// Free text (labels, titles): escaped like a token, without quotes.
MI.txt = (s) => MI.esc(s, null);
// Fixed decimals with no negative zero ("-0.0000" reads as a sign that is not there);
// NaN and infinities are shown as such.
MI.fmt = (x, d = 4) => {
  if (x === null || x === undefined) return "n/a";
  x = Number(x);
  if (Number.isNaN(x)) return "NaN";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  const s = x.toFixed(d);
  return /^-0\.?0*$/.test(s) ? s.slice(1) : s;
};
MI.el = (tag, props = {}, text) => {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(props)) {
    if (k === "class") e.className = v;
    else if (k === "style") e.style.cssText = v;
    else if (k.startsWith("data-")) e.setAttribute(k, v);
    else e[k] = v;
  }
  if (text !== undefined) e.textContent = text;
  return e;
};
MI.table = (head, rows) => {  // rows: arrays of [text, className?]
  const t = MI.el("table"), tr = MI.el("tr");
  head.forEach((h) => tr.appendChild(MI.el("th", {}, h)));
  t.appendChild(tr);
  rows.forEach((r) => {
    const row = MI.el("tr");
    r.forEach((c) => row.appendChild(Array.isArray(c) ? MI.el("td", {class: c[1]}, c[0]) : MI.el("td", {}, c)));
    t.appendChild(row);
  });
  return t;
};
// Colour scales. Sequential (probabilities, attention weights): white -> dark blue.
// Diverging (signed effects): blue (negative) -> white (0) -> red (positive). NaN: grey.
MI.NAN_RGB = [190, 190, 190];
MI.seqRGB = (v) => {
  if (Number.isNaN(v)) return MI.NAN_RGB;
  v = Math.max(0, Math.min(1, v || 0));
  return [Math.round(255 - 247 * v), Math.round(255 - 207 * v), Math.round(255 - 148 * v)];
};
MI.divRGB = (v, max) => {
  if (Number.isNaN(v)) return MI.NAN_RGB;
  const t = Math.max(-1, Math.min(1, max > 0 ? (v || 0) / max : 0));
  if (t >= 0) return [Math.round(255 - 77 * t), Math.round(255 - 231 * t), Math.round(255 - 212 * t)];
  const a = -t;
  return [Math.round(255 - 222 * a), Math.round(255 - 153 * a), Math.round(255 - 83 * a)];
};
MI.css = (rgb) => `rgb(${rgb[0]},${rgb[1]},${rgb[2]})`;
MI.ink = (rgb) => (rgb[0] * 0.299 + rgb[1] * 0.587 + rgb[2] * 0.114 < 140 ? "#fff" : "#000");
// A legend bar for a colour function on [lo, hi].
MI.legend = (fn, lo, hi, label) => {
  const box = MI.el("div", {class: "legend"}), c = MI.el("canvas", {width: 160, height: 10});
  const g = c.getContext("2d");
  for (let x = 0; x < 160; x++) { g.fillStyle = MI.css(fn(lo + (hi - lo) * x / 159)); g.fillRect(x, 0, 1, 10); }
  box.append(MI.el("span", {}, label + "  " + MI.fmt(lo, 2)), c, MI.el("span", {}, MI.fmt(hi, 2)));
  return box;
};
// The page layout: the view on the left, a side panel on the right that stays in the
// viewport while the page scrolls (position: sticky), so what a hover or click shows is
// always visible beside what was hovered.
MI.layout = (app, sideWidth = 380) => {
  const box = MI.el("div", {class: "layout"});
  const main = MI.el("div", {class: "main"});
  const side = MI.el("aside", {class: "side", id: "side", style: `flex-basis:${sideWidth}px;width:${sideWidth}px`});
  box.append(main, side); app.append(box);
  return {main, side};
};
// A heatmap on one canvas (fast for thousands of cells): rgb(r, c) colours a cell, text(r, c)
// optionally writes into it; onHover(r, c) / onClick(r, c) get the cell under the pointer.
// canvas.mark(r, c) outlines one cell (the hovered or selected one); mark(-1) clears it.
MI.heatmap = (opt) => {
  const {rows, cols, cw, ch, rgb, text, badge, onHover, onClick} = opt;
  const c = MI.el("canvas", {width: cols * cw, height: rows * ch});
  c.dataset.rows = rows; c.dataset.cols = cols; c.dataset.cw = cw; c.dataset.ch = ch;
  const g = c.getContext("2d");
  const lines = cw >= 6 && ch >= 6;  // thin grid lines only where cells are large enough to read
  const paint = (r, k) => {
    const col = rgb(r, k);
    g.fillStyle = MI.css(col);
    g.fillRect(k * cw, r * ch, cw, ch);
    if (lines) { g.strokeStyle = "rgba(0,0,0,0.08)"; g.lineWidth = 1; g.strokeRect(k * cw + 0.5, r * ch + 0.5, cw - 1, ch - 1); }
    if (text) {
      const s = text(r, k);
      if (s) {
        g.save(); g.beginPath(); g.rect(k * cw + 1, r * ch, cw - 2, ch); g.clip();
        g.font = "11px ui-monospace,Menlo,Consolas,monospace"; g.textBaseline = "middle";
        g.fillStyle = MI.ink(col); g.fillText(s, k * cw + 2, r * ch + ch / 2); g.restore();
      }
    }
    const b = badge ? badge(r, k) : null;  // [text, colour]: a mark at the cell's right edge
    if (b) {
      g.save(); g.font = "bold 10px system-ui,sans-serif"; g.textBaseline = "middle"; g.textAlign = "right";
      const tw = g.measureText(b[0]).width + 4;
      g.fillStyle = "rgba(255,255,255,0.85)"; g.fillRect((k + 1) * cw - tw - 1, r * ch + 2, tw, ch - 4);
      g.fillStyle = b[1]; g.fillText(b[0], (k + 1) * cw - 3, r * ch + ch / 2); g.restore();
    }
  };
  for (let r = 0; r < rows; r++) for (let k = 0; k < cols; k++) paint(r, k);
  let marked = null;
  c.mark = (r, k) => {
    if (marked) paint(marked[0], marked[1]);
    marked = r >= 0 ? [r, k] : null;
    c.dataset.markRow = r; c.dataset.markCol = r >= 0 ? k : -1;
    if (!marked) return;
    g.save(); g.strokeStyle = "#e6550d"; g.lineWidth = Math.min(3, Math.max(1, Math.min(cw, ch) / 5));
    const lw = g.lineWidth; g.strokeRect(k * cw + lw / 2, r * ch + lw / 2, cw - lw, ch - lw); g.restore();
  };
  c.repaint = () => { for (let r = 0; r < rows; r++) for (let k = 0; k < cols; k++) paint(r, k); if (marked) c.mark(...marked); };
  const cell = (ev) => {
    const b = c.getBoundingClientRect();
    const k = Math.floor((ev.clientX - b.left) * c.width / b.width / cw);
    const r = Math.floor((ev.clientY - b.top) * c.height / b.height / ch);
    return r >= 0 && r < rows && k >= 0 && k < cols ? [r, k] : null;
  };
  if (onHover) c.addEventListener("mousemove", (ev) => { const x = cell(ev); if (x) onHover(x[0], x[1]); });
  if (onClick) c.addEventListener("click", (ev) => { const x = cell(ev); if (x) onClick(x[0], x[1]); });
  return c;
};
// A grid with sticky headers inside a scroll box: the column headers stay on top and the
// row labels on the left while the grid scrolls. `top` and `left` are elements (canvases).
MI.stickyGrid = (top, left, body, maxHeight) => {
  const wrap = MI.el("div", {class: "scroll sticky-grid", style: `max-height:${maxHeight}px`});
  const grid = MI.el("div", {style: `display:grid;grid-template-columns:${left.width || left.offsetWidth}px auto;width:max-content`});
  const corner = MI.el("div", {class: "corner"});
  top.classList.add("col-head"); left.classList.add("row-head");
  grid.append(corner, top, left, body);
  wrap.append(grid);
  return wrap;
};
// A scroll box as tall as the viewport leaves below its top, so the whole page fits the
// window and the box (not the page) scrolls, keeping the side panel and headers in view.
MI.fit = (box, min = 240) => {
  box.style.maxHeight = Math.max(min, window.innerHeight - box.getBoundingClientRect().top - 14) + "px";
};
MI.ready = (t0) => {
  window.MI_RENDER_MS = performance.now() - t0;
  document.body.dataset.ready = "1";
};
