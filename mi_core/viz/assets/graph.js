// Attribution graph: nodes by layer (rows: embeddings at the bottom, logits on top) and
// position (columns); edges coloured by sign (blue +, red -), width ~ |weight|. Sliders prune:
// nodes by cumulative influence on the logits, edges by |weight|. Click a node for its
// inputs, outputs and top tokens.
(() => {
  const t0 = performance.now();
  const D = MI.data(), N = D.nodes.length, npos = D.tokens.length, L = D.n_layers;
  const src = D.edges.src, dst = D.edges.dst, W = MI.f32(D.edges.weight), E = W.length;
  const KIND = ["feature", "error", "token", "logit"];
  let wmax = 1e-12;
  for (let e = 0; e < E; e++) wmax = Math.max(wmax, Math.abs(W[e]));
  const ins = Array.from({length: N}, () => []), outs = Array.from({length: N}, () => []);
  for (let e = 0; e < E; e++) { ins[dst[e]].push(e); outs[src[e]].push(e); }
  const byAbs = (a, b) => Math.abs(W[b]) - Math.abs(W[a]);
  ins.forEach((l) => l.sort(byAbs)); outs.forEach((l) => l.sort(byAbs));

  // layout: a row per layer (0 = embeddings, L + 1 = logits), a column per position
  const colW = Math.max(70, Math.min(170, Math.floor(1150 / npos))), rowH = 46, padL = 56, padT = 12;
  const width = padL + npos * colW + 10, height = padT + (L + 2) * rowH + 44;
  const row = (n) => (n.kind === 2 ? 0 : n.kind === 3 ? L + 1 : n.layer + 1);
  const cells = new Map();
  D.nodes.forEach((n, i) => { const key = row(n) * 100000 + n.pos; if (!cells.has(key)) cells.set(key, []); cells.get(key).push(i); });
  const X = new Float32Array(N), Y = new Float32Array(N);
  for (const [key, list] of cells) {
    const r = Math.floor(key / 100000), p = key % 100000, per = Math.max(1, Math.floor((colW - 12) / 11));
    list.forEach((i, j) => {
      X[i] = padL + p * colW + 8 + (j % per) * 11;
      Y[i] = padT + (L + 1 - r) * rowH + rowH / 2 - 8 + Math.floor(j / per) % 3 * 9;
    });
  }
  const app = document.getElementById("app");
  const controls = MI.el("div", {class: "panel", id: "controls"});
  const nodeSlider = MI.el("input", {type: "range", min: 0, max: 1, step: 0.01, value: D.node_threshold, id: "node-threshold", style: "width:220px"});
  const edgeSlider = MI.el("input", {type: "range", min: 0, max: 1, step: 0.005, value: D.edge_threshold, id: "edge-threshold", style: "width:220px"});
  const nodeVal = MI.el("span", {id: "node-threshold-value"}), edgeVal = MI.el("span", {id: "edge-threshold-value"});
  const counts = MI.el("div", {id: "counts", class: "muted"});
  const l1 = MI.el("label", {}, "node threshold (cumulative influence kept) "), l2 = MI.el("label", {}, "  edge threshold (min |weight|, fraction of the largest) ");
  controls.append(l1, nodeSlider, nodeVal, MI.el("br"), l2, edgeSlider, edgeVal, counts);
  const info = MI.el("div", {id: "info", class: "panel"}, "Click a node to see its inputs, outputs and top tokens.");
  app.append(MI.el("p", {class: "sub"}, `${N} nodes, ${E} edges (before pruning). Green: features, grey: error nodes, black: token embeddings, orange: logits.`), controls);
  const layout = MI.el("div", {class: "row", style: "margin-top:8px"});
  const svgBox = MI.el("div", {class: "scroll", style: "border:1px solid #ccc;max-width:100%"});
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", width); svg.setAttribute("height", height); svg.id = "graph";
  const mk = (tag, at, parent = svg, text) => { const e = document.createElementNS(NS, tag); for (const k in at) e.setAttribute(k, at[k]); if (text !== undefined) e.textContent = text; parent.append(e); return e; };
  for (let r = 0; r < L + 2; r++) {
    const y = padT + (L + 1 - r) * rowH;
    mk("rect", {x: 0, y, width, height: rowH, fill: r % 2 ? "#fafafa" : "#fff"});
    mk("text", {x: 4, y: y + rowH / 2 + 4, "font-size": 11, fill: "#555"}, svg, r === 0 ? "emb" : r === L + 1 ? "logit" : "L" + (r - 1));
  }
  D.tokens.forEach((t, p) => {
    mk("text", {x: padL + p * colW + 4, y: height - 24, "font-size": 11, fill: "#777"}, svg, String(p));
    const tx = mk("text", {x: padL + p * colW + 4, y: height - 10, "font-size": 12, "font-family": "monospace"}, svg, MI.tok(t));
    tx.setAttribute("textLength", Math.min(colW - 8, 7.2 * MI.tok(t).length)); tx.setAttribute("lengthAdjust", "spacingAndGlyphs");
  });
  const gE = mk("g", {id: "edges"}), gN = mk("g", {id: "nodes"});
  const lines = new Array(E);
  for (let e = 0; e < E; e++) {
    const a = Math.abs(W[e]) / wmax;
    lines[e] = mk("line", {x1: X[src[e]], y1: Y[src[e]], x2: X[dst[e]], y2: Y[dst[e]],
      stroke: W[e] >= 0 ? "#2166ac" : "#b2182b", "stroke-width": (0.4 + 3 * a).toFixed(2),
      "stroke-opacity": (0.15 + 0.6 * a).toFixed(2)}, gE);
  }
  const COLOR = ["#2ca02c", "#999", "#222", "#ff7f0e"];
  const circles = D.nodes.map((n, i) => {
    const c = mk("circle", {cx: X[i], cy: Y[i], r: n.kind === 0 ? 4 : 5, fill: COLOR[n.kind], "data-i": i, class: "node", style: "cursor:pointer"}, gN);
    mk("title", {}, c, n.label);
    c.addEventListener("click", (ev) => { ev.stopPropagation(); select(i); });
    return c;
  });
  svgBox.append(svg); layout.append(svgBox, info); app.append(layout);

  let selected = -1;
  const nodeOn = new Uint8Array(N), edgeOn = new Uint8Array(E);
  function prune() {
    const nt = +nodeSlider.value, et = +edgeSlider.value * wmax;
    nodeVal.textContent = " " + MI.fmt(nt, 2);
    edgeVal.textContent = ` ${MI.fmt(+edgeSlider.value, 3)} (|w| >= ${MI.fmt(et, 4)})`;
    let nn = 0, ne = 0;
    D.nodes.forEach((n, i) => { nodeOn[i] = n.kind >= 2 || n.influence === null || n.influence <= nt + 1e-9 ? 1 : 0; });
    for (let e = 0; e < E; e++) {
      edgeOn[e] = nodeOn[src[e]] && nodeOn[dst[e]] && Math.abs(W[e]) >= et ? 1 : 0;
      lines[e].style.display = edgeOn[e] ? "" : "none";
      ne += edgeOn[e];
    }
    circles.forEach((c, i) => { c.style.display = nodeOn[i] ? "" : "none"; nn += nodeOn[i]; });
    counts.textContent = `${nn} nodes, ${ne} edges shown`;
    counts.dataset.nodes = nn; counts.dataset.edges = ne;
    if (selected >= 0) select(selected);
  }
  function edgeRows(list, end) {
    return list.filter((e) => edgeOn[e]).slice(0, D.list_k).map((e) => {
      const j = end === "src" ? src[e] : dst[e];
      return [MI.tok(D.nodes[j].label), [MI.fmt(W[e]), "num"]];
    });
  }
  function select(i) {
    selected = i;
    const n = D.nodes[i];
    circles.forEach((c, j) => c.setAttribute("stroke", j === i ? "#000" : "none"));
    const near = new Set([...ins[i], ...outs[i]]);
    for (let e = 0; e < E; e++) lines[e].setAttribute("stroke-opacity", near.has(e) ? "0.95" : "0.07");
    const facts = [["kind", KIND[n.kind]], ["layer", n.kind === 2 ? "emb" : n.kind === 3 ? "logit" : String(n.layer)],
                   ["position", String(n.pos) + " " + JSON.stringify(MI.tok(D.tokens[n.pos]))]];
    if (n.activation !== null) facts.push(["activation", MI.fmt(n.activation)]);
    if (n.influence !== null) facts.push(["cumulative influence", MI.fmt(n.influence)]);
    const parts = [MI.el("div", {style: "font-weight:bold"}, MI.tok(n.label)), MI.table(["", ""], facts)];
    parts.push(MI.el("div", {style: "margin-top:6px"}, `inputs (${ins[i].filter((e) => edgeOn[e]).length} shown, strongest first)`));
    const ti = MI.table(["from", "weight"], edgeRows(ins[i], "src")); ti.id = "inputs"; parts.push(ti);
    parts.push(MI.el("div", {style: "margin-top:6px"}, `outputs (${outs[i].filter((e) => edgeOn[e]).length} shown)`));
    const to = MI.table(["to", "weight"], edgeRows(outs[i], "dst")); to.id = "outputs"; parts.push(to);
    if (n.top_tokens && n.top_tokens.length) {
      parts.push(MI.el("div", {style: "margin-top:6px"}, D.top_tokens_label));
      const tt = MI.table(["token", "score"], n.top_tokens.map(([t, s]) => [MI.tok(t), [MI.fmt(s), "num"]])); tt.id = "top-tokens"; parts.push(tt);
    }
    info.replaceChildren(...parts);
    info.dataset.node = i;
  }
  svg.addEventListener("click", () => { selected = -1; circles.forEach((c) => c.setAttribute("stroke", "none")); prune(); lines.forEach((l, e) => l.setAttribute("stroke-opacity", (0.15 + 0.6 * Math.abs(W[e]) / wmax).toFixed(2))); });
  nodeSlider.addEventListener("input", prune);
  edgeSlider.addEventListener("input", prune);
  prune();
  MI.ready(t0);
})();
