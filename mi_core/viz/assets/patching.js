// Patching grid: rows = layers, columns = positions (or heads); diverging colour centred at 0
// (0 = corrupted behaviour, 1 = clean). Hover a cell for its value in the side panel;
// click to pin it. Column headers and layer labels stay in view while the grid scrolls.
(() => {
  const t0 = performance.now();
  const D = MI.data(), G = MI.f32(D.grid), [R, C] = D.grid.shape;
  let max = 0;
  for (const v of G) if (Math.abs(v) > max) max = Math.abs(v);
  max = Math.max(max, 1e-12);
  const units = D.units ? ` (${MI.txt(D.units)})` : "";
  const app = document.getElementById("app");
  const {main, side} = MI.layout(app, 380);
  const metric = MI.el("div", {class: "panel", id: "metric"});
  metric.append(MI.el("h3", {}, "metric"),
    MI.el("div", {class: "tok-cell", id: "metric-name"}, MI.txt(D.metric) + units),
    MI.table(["", "value"], [["clean prompt", [MI.fmt(D.clean_metric), "num"]], ["corrupted prompt", [MI.fmt(D.corrupted_metric), "num"]]]),
    MI.el("div", {class: "note"}, "A cell: the metric with that one activation patched from the clean run into the corrupted run, normalised (patched − corrupted) / (clean − corrupted): 0 = corrupted, 1 = clean."));
  const info = MI.el("div", {id: "info", class: "panel"}, "Hover a cell for its value; click to pin it.");
  side.append(info, metric);
  main.append(MI.legend((v) => MI.divRGB(v, max), -max, max, D.normalised ? "normalised metric (0 = corrupted, 1 = clean)" : "metric" + units + " (raw values)"));
  const cw = D.cell_width, ch = 22, lw = 56;
  const head = MI.el("canvas", {width: C * cw, height: 22});
  const left = MI.el("canvas", {width: lw, height: R * ch});
  const paintHeads = (hr, hc) => {
    const g = head.getContext("2d");
    g.clearRect(0, 0, head.width, head.height);
    g.font = "11px ui-monospace,Menlo,Consolas,monospace"; g.textBaseline = "middle";
    D.columns.forEach((s, c) => {
      g.save(); g.beginPath(); g.rect(c * cw, 0, cw - 2, 22); g.clip();
      if (c === hc) { g.fillStyle = "#fff3c4"; g.fillRect(c * cw, 0, cw, 22); }
      g.fillStyle = "#000"; g.fillText(D.column_kind === "head" ? MI.txt(s) : MI.txt(s), c * cw + 2, 11); g.restore();
    });
    const gl = left.getContext("2d");
    gl.clearRect(0, 0, left.width, left.height);
    gl.font = "11px ui-monospace,Menlo,Consolas,monospace"; gl.textBaseline = "middle";
    D.layers.forEach((l, r) => { if (r === hr) { gl.fillStyle = "#fff3c4"; gl.fillRect(0, r * ch, lw, ch); } gl.fillStyle = "#000"; gl.fillText("L" + l, 4, r * ch + ch / 2); });
  };
  paintHeads(-1, -1);
  let pinned = null;
  const grid = MI.heatmap({rows: R, cols: C, cw, ch, rgb: (r, c) => MI.divRGB(G[r * C + c], max),
    text: cw >= 40 ? (r, c) => MI.fmt(G[r * C + c], 2) : null,
    onHover: (r, c) => { if (!pinned) show(r, c); },
    onClick: (r, c) => { pinned = pinned && pinned[0] === r && pinned[1] === c ? null : [r, c]; show(r, c); }});
  grid.id = "grid";
  const gridBox = MI.stickyGrid(head, left, grid, Math.max(300, window.innerHeight - 190));
  main.append(gridBox);
  MI.fit(gridBox);
  // a normalised grid holds (patched - corrupted) / (clean - corrupted); a raw one the metric
  const span = D.clean_metric - D.corrupted_metric;
  function show(r, c) {
    const g = G[r * C + c];
    const v = D.normalised ? g : g === D.corrupted_metric ? 0 : (g - D.corrupted_metric) / span;
    const raw = D.normalised ? D.corrupted_metric + g * span : g;
    grid.mark(r, c); paintHeads(r, c);
    info.replaceChildren(MI.el("h3", {}, `layer ${D.layers[r]}, ${D.column_kind} ${MI.txt(D.columns[c])}` + (pinned ? " (pinned)" : "")),
      MI.table(["", "value"], [
        ["normalised (0 = corrupted, 1 = clean)", [MI.fmt(v), "num"]],
        ["patched metric" + units, [MI.fmt(raw), "num"]],
        ["effect: patched − corrupted" + units, [MI.fmt(raw - D.corrupted_metric), "num"]]]));
    info.dataset.row = r; info.dataset.col = c; info.dataset.value = v;
  }
  let best = 0;  // the panel opens on the largest |value|
  for (let i = 0; i < G.length; i++) if (Math.abs(G[i]) > Math.abs(G[best])) best = i;
  if (G.length) show(Math.floor(best / C), best % C);
  MI.ready(t0);
})();
