// Logit lens: rows = lens points (layers), columns = positions; a cell shows the top-1 token,
// coloured by its probability. Hover a cell for its top-k tokens and the tracked targets.
(() => {
  const t0 = performance.now();
  const D = MI.data(), R = D.labels.length, C = D.positions.length, k = D.k, T = D.target_ids.length;
  const P = MI.f32(D.top_probs), I = D.top_ids, TP = T ? MI.f32(D.target_probs) : null;
  const tok = (id) => MI.tok(D.vocab[id] !== undefined ? D.vocab[id] : `<${id}>`);
  const at = (r, c, j) => (r * C + c) * k + j;
  const app = document.getElementById("app");
  const info = MI.el("div", {id: "info", class: "panel"}, "Hover a cell for its top tokens and probabilities.");
  app.append(MI.el("p", {class: "muted"}, `${R} lens points x ${C} positions; cell = top-1 token, colour = its probability. Rows run from the first layer (top) to the output (bottom).`),
             MI.legend((v) => MI.seqRGB(v), 0, 1, "top-1 probability"), info);
  const cw = D.cell_width, ch = 18, lw = 70;
  const wrap = MI.el("div", {class: "scroll", style: `max-height:${Math.max(300, window.innerHeight - 220)}px;border:1px solid #ccc`});
  const inner = MI.el("div", {style: `display:grid;grid-template-columns:${lw}px ${C * cw}px;`});
  // column headers: the prompt token at each position
  const head = MI.el("canvas", {width: C * cw, height: 34});
  const g = head.getContext("2d");
  g.font = "11px ui-monospace,Menlo,Consolas,monospace"; g.textBaseline = "middle";
  for (let c = 0; c < C; c++) {
    const p = D.positions[c];
    g.save(); g.beginPath(); g.rect(c * cw, 0, cw - 2, 34); g.clip();
    g.fillStyle = "#777"; g.fillText(String(p), c * cw + 2, 8);
    g.fillStyle = "#000"; g.fillText(MI.tok(D.tokens[p]), c * cw + 2, 24); g.restore();
  }
  const left = MI.el("canvas", {width: lw, height: R * ch});
  const gl = left.getContext("2d");
  gl.font = "11px ui-monospace,Menlo,Consolas,monospace"; gl.textBaseline = "middle";
  D.labels.forEach((s, r) => gl.fillText(s, 4, r * ch + ch / 2));
  const grid = MI.heatmap({rows: R, cols: C, cw, ch,
    rgb: (r, c) => MI.seqRGB(P[at(r, c, 0)]),
    text: (r, c) => tok(I[r][c][0]),
    onHover: show});
  grid.id = "lens";
  inner.append(MI.el("div"), head, left, grid);
  wrap.append(inner); app.append(wrap);

  function show(r, c) {
    const p = D.positions[c];
    const rows = [];
    for (let j = 0; j < k; j++) rows.push([[String(j + 1), "num"], [tok(I[r][c][j]), "tok-cell"], [MI.fmt(P[at(r, c, j)]), "num"]]);
    const parts = [MI.el("div", {}, `${D.labels[r]}, position ${p} ${JSON.stringify(MI.tok(D.tokens[p]))}`),
                   MI.table(["rank", "token", "prob"], rows)];
    if (T) {
      const tr = D.target_ids.map((id, j) => [tok(id), [MI.fmt(TP[(r * C + c) * T + j]), "num"], [String(D.target_ranks[r][c][j] + 1), "num"]]);
      parts.push(MI.el("div", {style: "margin-top:4px"}, "tracked tokens:"), MI.table(["token", "prob", "rank"], tr));
    }
    info.replaceChildren(...parts);
    info.dataset.row = r; info.dataset.col = c;
  }
  MI.ready(t0);
})();
