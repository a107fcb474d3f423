// Patching grid: rows = layers, columns = positions (or heads); diverging colour centred at 0
// (0 = corrupted behaviour, 1 = clean). Hover a cell for its value; click to pin it.
(() => {
  const t0 = performance.now();
  const D = MI.data(), G = MI.f32(D.grid), [R, C] = D.grid.shape;
  let max = 0;
  for (const v of G) if (Math.abs(v) > max) max = Math.abs(v);
  max = Math.max(max, 1e-12);
  const app = document.getElementById("app");
  const info = MI.el("div", {id: "info", class: "panel"}, "Hover a cell for its value.");
  app.append(MI.el("p", {class: "sub"}, `${D.method} patching of ${D.kind}: metric on the clean prompt ${MI.fmt(D.clean_metric)}, on the corrupted prompt ${MI.fmt(D.corrupted_metric)}. A cell is the metric with that one activation patched from the clean run, normalised: 0 = corrupted, 1 = clean.`),
             MI.legend((v) => MI.divRGB(v, max), -max, max, "normalised metric"), info);
  const cw = D.cell_width, ch = 22, lw = 50;
  const inner = MI.el("div", {style: `display:grid;grid-template-columns:${lw}px ${C * cw}px;`});
  const head = MI.el("canvas", {width: C * cw, height: 20});
  const g = head.getContext("2d");
  g.font = "11px ui-monospace,Menlo,Consolas,monospace"; g.textBaseline = "middle";
  D.columns.forEach((s, c) => { g.save(); g.beginPath(); g.rect(c * cw, 0, cw - 2, 20); g.clip(); g.fillText(MI.tok(s), c * cw + 2, 10); g.restore(); });
  const left = MI.el("canvas", {width: lw, height: R * ch});
  const gl = left.getContext("2d");
  gl.font = "11px ui-monospace,Menlo,Consolas,monospace"; gl.textBaseline = "middle";
  D.layers.forEach((l, r) => gl.fillText("L" + l, 4, r * ch + ch / 2));
  const grid = MI.heatmap({rows: R, cols: C, cw, ch, rgb: (r, c) => MI.divRGB(G[r * C + c], max),
    text: cw >= 40 ? (r, c) => MI.fmt(G[r * C + c], 2) : null, onHover: show, onClick: show});
  grid.id = "grid";
  inner.append(MI.el("div"), head, left, grid);
  const wrap = MI.el("div", {class: "scroll", style: "border:1px solid #ccc"});
  wrap.append(inner); app.append(wrap);
  function show(r, c) {
    const v = G[r * C + c], raw = D.corrupted_metric + v * (D.clean_metric - D.corrupted_metric);
    info.replaceChildren(MI.el("div", {}, `layer ${D.layers[r]}, ${D.column_kind} ${MI.tok(D.columns[c])}`),
      MI.table(["normalised", "patched metric", "effect (patched - corrupted)"],
               [[[MI.fmt(v), "num"], [MI.fmt(raw), "num"], [MI.fmt(raw - D.corrupted_metric), "num"]]]));
    info.dataset.row = r; info.dataset.col = c; info.dataset.value = v;
  }
  MI.ready(t0);
})();
