// Logit lens: rows = lens points (layers, first at the top, the model's output last),
// columns = positions; a cell shows the top-1 token. Colour by the top-1 probability or by
// a tracked target's probability (then the cell also reads the target's rank). Hover a cell:
// the side panel lists its top-k and the targets, and draws the targets' probability over
// the layers at that position. Ranks are 1-based (1 = top token) everywhere.
(() => {
  const t0 = performance.now();
  const D = MI.data(), R = D.labels.length, C = D.positions.length, k = D.k, T = D.target_ids.length;
  const P = MI.f32(D.top_probs), I = D.top_ids, TP = T ? MI.f32(D.target_probs) : null;
  const tok = (id) => MI.tok(D.vocab[id] !== undefined ? D.vocab[id] : `<${id}>`);
  const at = (r, c, j) => (r * C + c) * k + j;
  const tp = (r, c, j) => TP[(r * C + c) * T + j], rank = (r, c, j) => D.target_ranks[r][c][j] + 1;
  const app = document.getElementById("app");
  const {main, side} = MI.layout(app, 400);
  let mode = -1;  // -1: colour by the top-1 probability; j: by target j
  const bar = MI.el("div", {class: "legend", id: "colour-by"});
  bar.append(MI.el("span", {}, "colour by:"));
  const buttons = [];
  for (let j = -1; j < T; j++) {
    const b = MI.el("button", {type: "button", "data-mode": j}, j < 0 ? "top-1 probability" : `p(${tok(D.target_ids[j])}) and rank`);
    b.addEventListener("click", () => { mode = j; grid.repaint(); paintButtons(); if (hover) show(...hover); });
    buttons.push(b); bar.append(b);
  }
  const paintButtons = () => buttons.forEach((b) => b.classList.toggle("on", +b.dataset.mode === mode));
  main.append(MI.el("p", {class: "note"}, `${R} lens points x ${C} positions. A cell: the top-1 token there, coloured by its probability` +
    (T ? `; red #n: the rank of ${tok(D.target_ids[0])} where it is in the top 10. Colour by a target to see its probability and rank in every cell` : "") +
    ". Rows run from the first layer (top) to the model's output (bottom); ranks are 1-based (1 = top)."),
    bar, MI.legend((v) => MI.seqRGB(v), 0, 1, "probability"));
  const cw = Math.max(7, Math.min(D.cell_width, Math.floor(32000 / Math.max(1, C)))), ch = 18, lw = 72;
  const head = MI.el("canvas", {width: C * cw, height: 34}), left = MI.el("canvas", {width: lw, height: R * ch});
  const paintHeads = (hr, hc) => {
    const g = head.getContext("2d");
    g.clearRect(0, 0, head.width, 34);
    g.font = "11px ui-monospace,Menlo,Consolas,monospace"; g.textBaseline = "middle";
    for (let c = 0; c < C; c++) {
      const p = D.positions[c];
      g.save(); g.beginPath(); g.rect(c * cw, 0, cw - 2, 34); g.clip();
      if (c === hc) { g.fillStyle = "#fff3c4"; g.fillRect(c * cw, 0, cw, 34); }
      g.fillStyle = "#777"; g.fillText(String(p), c * cw + 2, 8);
      g.fillStyle = "#000"; g.fillText(MI.tok(D.tokens[p]), c * cw + 2, 24); g.restore();
    }
    const gl = left.getContext("2d");
    gl.clearRect(0, 0, lw, left.height);
    gl.font = "11px ui-monospace,Menlo,Consolas,monospace"; gl.textBaseline = "middle";
    D.labels.forEach((s, r) => { if (r === hr) { gl.fillStyle = "#fff3c4"; gl.fillRect(0, r * ch, lw, ch); } gl.fillStyle = "#000"; gl.fillText(MI.txt(s), 4, r * ch + ch / 2); });
  };
  paintHeads(-1, -1);
  const grid = MI.heatmap({rows: R, cols: C, cw, ch,
    rgb: (r, c) => MI.seqRGB(mode < 0 ? P[at(r, c, 0)] : tp(r, c, mode)),
    text: cw >= 30 ? (r, c) => (mode < 0 ? tok(I[r][c][0]) : `#${rank(r, c, mode)} ${MI.fmt(tp(r, c, mode), 2)}`) : null,
    // in top-1 mode, the first target's rank where it is among the top 10
    badge: T && cw >= 30 ? (r, c) => (mode < 0 && rank(r, c, 0) <= 10 ? [`#${rank(r, c, 0)}`, "#d62728"] : null) : null,
    onHover: show});
  grid.id = "lens";
  const gridBox = MI.stickyGrid(head, left, grid, Math.max(300, window.innerHeight - 200));
  main.append(gridBox);
  MI.fit(gridBox);
  const info = MI.el("div", {id: "info", class: "panel"}, "Hover a cell for its top tokens and probabilities.");
  const chart = MI.el("div", {id: "target-chart", class: "panel"});
  side.append(info);
  if (T) side.append(chart);
  let hover = null;

  // The targets' probability over the lens points at one position: a line per target,
  // each point labelled with its rank where it changes.
  function drawChart(c) {
    const NS = "http://www.w3.org/2000/svg", W = 370, H = 190, m = {l: 34, r: 8, t: 8, b: 26};
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("width", W); svg.setAttribute("height", H);
    const s = (tag, a, text) => { const e = document.createElementNS(NS, tag); for (const [x, v] of Object.entries(a)) e.setAttribute(x, v); if (text !== undefined) e.textContent = text; svg.append(e); return e; };
    const X = (r) => m.l + (W - m.l - m.r) * (R === 1 ? 0.5 : r / (R - 1)), Y = (v) => H - m.b - (H - m.t - m.b) * (Number.isFinite(v) ? v : 0);
    s("line", {x1: m.l, y1: H - m.b, x2: W - m.r, y2: H - m.b, stroke: "#444"});
    s("line", {x1: m.l, y1: m.t, x2: m.l, y2: H - m.b, stroke: "#444"});
    [0, 0.5, 1].forEach((f) => s("text", {x: m.l - 4, y: Y(f) + 4, "text-anchor": "end", "font-size": 10}, MI.fmt(f, 1)));
    [0, R - 1].forEach((r) => s("text", {x: X(r), y: H - m.b + 13, "text-anchor": "middle", "font-size": 10}, MI.txt(D.labels[r])));
    s("text", {x: (W + m.l) / 2, y: H - 2, "text-anchor": "middle", "font-size": 10, fill: "#555"}, "lens point (layer)");
    const colours = ["#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2"], names = ["red", "green", "purple", "brown", "pink"];
    for (let j = 0; j < T; j++) {
      const col = colours[j % colours.length];
      s("polyline", {fill: "none", stroke: col, "stroke-width": 2, points: [...Array(R).keys()].map((r) => `${X(r)},${Y(tp(r, c, j))}`).join(" "), class: "target-line", "data-j": j});
      let last = -1;
      for (let r = 0; r < R; r++) {
        const rk = rank(r, c, j);
        if (rk !== last && (rk <= 10 || r === R - 1)) s("text", {x: X(r), y: Y(tp(r, c, j)) - 4, "font-size": 9, fill: col, "text-anchor": "middle"}, `#${rk}`);
        last = rk;
      }
    }
    const p = D.positions[c];
    chart.replaceChildren(MI.el("h3", {}, `targets over the layers at position ${p} ${MI.tok(D.tokens[p])}`), svg,
      MI.el("div", {class: "note"}, D.target_ids.map((id, j) => `${names[j % names.length]}: p(${tok(id)})`).join(", ") + "; #n = rank (1 = top)"));
    chart.dataset.col = c;
  }
  function show(r, c) {
    hover = [r, c];
    grid.mark(r, c); paintHeads(r, c);
    const p = D.positions[c];
    const rows = [];
    for (let j = 0; j < k; j++) rows.push([[String(j + 1), "num"], [tok(I[r][c][j]), "tok-cell"], [MI.fmt(P[at(r, c, j)]), "num"]]);
    const parts = [MI.el("h3", {}, `${MI.txt(D.labels[r])}, position ${p} ${MI.tok(D.tokens[p])}`),
                   MI.table(["rank", "token", "prob"], rows)];
    if (T) {
      const tr = D.target_ids.map((id, j) => [[tok(id), "tok-cell"], [MI.fmt(tp(r, c, j)), "num"], [String(rank(r, c, j)), "num"]]);
      parts.push(MI.el("h3", {}, "tracked tokens (rank 1 = top)"), MI.table(["token", "prob", "rank"], tr));
      drawChart(c);
    }
    info.replaceChildren(...parts);
    info.dataset.row = r; info.dataset.col = c;
  }
  paintButtons();
  show(R - 1, C - 1);
  MI.ready(t0);
})();
