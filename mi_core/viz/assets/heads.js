// Head scores: a layers x heads grid per kind (previous-token, duplicate-token, induction),
// all on one 0..1 scale. Hover a cell: that head's score of every kind in the side panel;
// the same head is outlined in every grid.
(() => {
  const t0 = performance.now();
  const D = MI.data(), S = MI.f32(D.scores), [K, R, C] = D.scores.shape;
  const v = (k, r, c) => S[(k * R + r) * C + c];
  const app = document.getElementById("app");
  const {main, side} = MI.layout(app, 340);
  const info = MI.el("div", {id: "info", class: "panel"}, "Hover a cell for that head's scores.");
  const top = MI.el("div", {id: "best", class: "panel"});
  side.append(info, top);
  main.append(MI.legend((x) => MI.seqRGB(x), 0, 1, "score"));
  const cw = Math.max(8, Math.min(28, Math.floor(300 / C))), ch = Math.max(8, Math.min(20, Math.floor(520 / R)));
  const row = MI.el("div", {class: "row", style: "flex-wrap:wrap;gap:18px"});
  const grids = [];
  for (let k = 0; k < K; k++) {
    const fig = MI.el("figure", {style: "margin:0", "data-kind": D.kinds[k]});
    fig.append(MI.el("figcaption", {style: "font-weight:bold;font-size:13px"}, MI.txt(D.kinds[k]).replace(/_/g, "-")),
               MI.el("div", {class: "note", style: `max-width:${C * cw + 34}px;height:2.6em;overflow:hidden`}, MI.txt(D.meanings[k])));
    const left = MI.el("canvas", {width: 34, height: R * ch}), head = MI.el("canvas", {width: C * cw, height: 16});
    const gl = left.getContext("2d"); gl.font = "10px ui-monospace,monospace"; gl.textBaseline = "middle";
    for (let r = 0; r < R; r += Math.ceil(11 / ch)) gl.fillText("L" + r, 2, r * ch + ch / 2);
    const gh = head.getContext("2d"); gh.font = "10px ui-monospace,monospace"; gh.textBaseline = "middle";
    for (let c = 0; c < C; c += Math.ceil(16 / cw)) gh.fillText("H" + c, c * cw + 1, 8);
    const g = MI.heatmap({rows: R, cols: C, cw, ch, rgb: (r, c) => MI.seqRGB(v(k, r, c)), onHover: show});
    g.className = "scores"; g.dataset.kind = D.kinds[k];
    grids.push(g);
    const grid = MI.el("div", {style: `display:grid;grid-template-columns:34px ${C * cw}px`});
    grid.append(MI.el("div"), head, left, g);
    fig.append(grid); row.append(fig);
  }
  main.append(MI.el("p", {class: "note"}, "rows: layer, columns: head"), row);
  const best = [];
  for (let k = 0; k < K; k++) {
    const cellsK = [...Array(R * C).keys()].sort((a, b) => (v(k, Math.floor(b / C), b % C) || -1) - (v(k, Math.floor(a / C), a % C) || -1)).slice(0, 5);
    best.push(MI.el("h3", {}, `top ${MI.txt(D.kinds[k]).replace(/_/g, "-")} heads`),
              MI.table(["head", "score"], cellsK.map((i) => [`L${Math.floor(i / C)}H${i % C}`, [MI.fmt(v(k, Math.floor(i / C), i % C), 3), "num"]])));
  }
  top.replaceChildren(...best);
  function show(r, c) {
    grids.forEach((g) => g.mark(r, c));
    info.replaceChildren(MI.el("h3", {}, `layer ${r}, head ${c} (L${r}H${c})`),
      MI.table(["kind", "score"], D.kinds.map((kind, k) => [MI.txt(kind).replace(/_/g, "-"), [MI.fmt(v(k, r, c)), "num"]])));
    info.dataset.row = r; info.dataset.col = c;
  }
  let bi = 0;  // the panel opens on the best head of the last kind (induction)
  for (let i = 0; i < R * C; i++) if (v(K - 1, Math.floor(i / C), i % C) > v(K - 1, Math.floor(bi / C), bi % C)) bi = i;
  if (R * C) show(Math.floor(bi / C), bi % C);
  MI.ready(t0);
})();
