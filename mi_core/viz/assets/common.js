// Shared helpers of every mi-core view (vanilla JS, no dependencies, works from file://).
"use strict";
const MI = {};
MI.data = () => JSON.parse(document.getElementById("mi-data").textContent);
// Float32 tensors travel as base64 of little-endian bytes: {b64, shape}.
MI.f32 = (t) => {
  const s = atob(t.b64), b = new Uint8Array(s.length);
  for (let i = 0; i < s.length; i++) b[i] = s.charCodeAt(i);
  return new Float32Array(b.buffer);
};
// A token as shown: control characters and no-break spaces escaped, a token of spaces only
// as "␣" per space (else it would be invisible), everything else verbatim. Always set as
// textContent, never innerHTML, so a token that looks like markup stays text.
MI.tok = (s) => {
  s = String(s);
  if (/^ +$/.test(s)) return "␣".repeat(s.length);
  return s.replace(/[\u0000-\u001f\u007f\u00a0]/g, (c) =>
    ({"\n": "\\n", "\t": "\\t", "\r": "\\r"})[c] || "\\x" + c.charCodeAt(0).toString(16).padStart(2, "0"));
};
// Fixed decimals with no negative zero ("-0.0000" reads as a sign that is not there).
MI.fmt = (x, d = 4) => {
  if (x === null || x === undefined || Number.isNaN(x)) return "n/a";
  const s = Number(x).toFixed(d);
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
// Diverging (signed effects): blue (negative) -> white (0) -> red (positive).
MI.seqRGB = (v) => {
  v = Math.max(0, Math.min(1, v || 0));
  return [Math.round(255 - 247 * v), Math.round(255 - 207 * v), Math.round(255 - 148 * v)];
};
MI.divRGB = (v, max) => {
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
// A heatmap on one canvas (fast for thousands of cells): rgb(r, c) colours a cell, text(r, c)
// optionally writes into it; onHover(r, c) / onClick(r, c) get the cell under the pointer.
MI.heatmap = (opt) => {
  const {rows, cols, cw, ch, rgb, text, onHover, onClick} = opt;
  const c = MI.el("canvas", {width: cols * cw, height: rows * ch});
  c.dataset.rows = rows; c.dataset.cols = cols; c.dataset.cw = cw; c.dataset.ch = ch;
  const g = c.getContext("2d");
  g.font = "11px ui-monospace,Menlo,Consolas,monospace";
  g.textBaseline = "middle";
  for (let r = 0; r < rows; r++) for (let k = 0; k < cols; k++) {
    const col = rgb(r, k);
    g.fillStyle = MI.css(col);
    g.fillRect(k * cw, r * ch, cw, ch);
    if (text) {
      const s = text(r, k);
      if (s) {
        g.save(); g.beginPath(); g.rect(k * cw + 1, r * ch, cw - 2, ch); g.clip();
        g.fillStyle = MI.ink(col); g.fillText(s, k * cw + 2, r * ch + ch / 2); g.restore();
      }
    }
  }
  if (cw >= 6 && ch >= 6) {  // thin grid lines only where cells are large enough to read
    g.strokeStyle = "rgba(0,0,0,0.08)";
    for (let r = 0; r <= rows; r++) { g.beginPath(); g.moveTo(0, r * ch); g.lineTo(cols * cw, r * ch); g.stroke(); }
    for (let k = 0; k <= cols; k++) { g.beginPath(); g.moveTo(k * cw, 0); g.lineTo(k * cw, rows * ch); g.stroke(); }
  }
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
MI.ready = (t0) => {
  window.MI_RENDER_MS = performance.now() - t0;
  document.body.dataset.ready = "1";
};
