// Attribution graph, after circuit-tracer's viewer: a row per layer (token embeddings at
// the bottom, logits on top), a column per position; nodes of one (layer, position) cell
// form a group that collapses into one counted box when dense (click it to expand; "−"
// collapses again). Each node carries a label (feature id, or the logit's token) and a
// tooltip with its layer, position token and top tokens. Edges: blue positive, red
// negative, width ~ |weight|. The side panel (always in view) holds the pruning sliders,
// the legend and the selected node with its inputs and outputs among the visible edges.
// One render() decides every edge's visibility and emphasis from (pruning, selection,
// hover), so moving a slider with a node selected keeps the two consistent.
(() => {
  const t0 = performance.now();
  const D = MI.data(), nodes = D.nodes, N = nodes.length, npos = D.tokens.length, L = D.n_layers;
  const src = D.edges.src, dst = D.edges.dst, W = MI.f32(D.edges.weight), E = W.length;
  const KIND = ["feature", "error node", "token embedding", "logit"], COLOR = ["#2ca02c", "#8c8c8c", "#333", "#ff7f0e"];
  let wmax = 1e-12;
  for (let e = 0; e < E; e++) if (Number.isFinite(W[e])) wmax = Math.max(wmax, Math.abs(W[e]));
  const mag = (e) => (Number.isFinite(W[e]) ? Math.abs(W[e]) : -1);
  const ins = Array.from({length: N}, () => []), outs = Array.from({length: N}, () => []);
  for (let e = 0; e < E; e++) { ins[dst[e]].push(e); outs[src[e]].push(e); }
  const byAbs = (a, b) => mag(b) - mag(a);
  ins.forEach((l) => l.sort(byAbs)); outs.forEach((l) => l.sort(byAbs));
  const posName = (p) => `${p} ${MI.tok(D.tokens[p])}`;
  const layerName = (n) => (n.kind === 2 ? "embedding" : n.kind === 3 ? "logit" : "L" + n.layer);
  const short = (n) => (n.kind === 3 ? (n.top_tokens.length ? MI.tok(n.top_tokens[0][0]) : "logit") : n.kind === 0 && n.feature !== null ? "#" + MI.txt(n.feature) : n.kind === 1 ? "err" : "");
  const tops = (n) => n.top_tokens.slice(0, 3).map(([t, s]) => `${MI.tok(t)} ${MI.fmt(s, 2)}`).join(", ");
  const full = (i) => { const n = nodes[i]; return `${MI.txt(n.label)}\n${KIND[n.kind]}, ${layerName(n)}, position ${posName(n.pos)}` + (n.top_tokens.length ? `\n${MI.txt(D.top_tokens_label)}: ${tops(n)}` : ""); };

  // cells: the nodes of one (row, position), most influential first
  const row = (n) => (n.kind === 2 ? 0 : n.kind === 3 ? L + 1 : n.layer + 1);
  const cellIndex = new Map(), cells = [], cellOf = new Int32Array(N);
  nodes.forEach((n, i) => {
    const key = row(n) * 100000 + n.pos;
    if (!cellIndex.has(key)) { cellIndex.set(key, cells.length); cells.push({row: row(n), pos: n.pos, members: []}); }
    cellOf[i] = cellIndex.get(key); cells[cellOf[i]].members.push(i);
  });
  const infl = (i) => (nodes[i].influence === null || Number.isNaN(nodes[i].influence) ? -1 : nodes[i].influence);
  cells.forEach((c) => c.members.sort((a, b) => infl(a) - infl(b)));
  const SP = 15, maxIn = new Array(npos).fill(1);
  // column widths from the nodes shown at the opening threshold (at most 8 a cell; denser cells
  // collapse into a counted box), so the layout stays put while the sliders move
  const shownAt = (i) => infl(i) <= D.node_threshold + 1e-9;
  cells.forEach((c) => { if (c.row <= L) maxIn[c.pos] = Math.max(maxIn[c.pos], Math.min(c.members.filter(shownAt).length, 8)); });
  const colW = maxIn.map((m, p) => Math.max(70, Math.min(230, Math.max(SP * m + 26, 12 + 7.2 * MI.tok(D.tokens[p]).length))));
  const padL = 58, padT = 84, padB = 44;
  const rowH = Math.max(34, Math.min(90, Math.floor((window.innerHeight - 220) / (L + 2))));
  const colX = []; let acc = padL;
  colW.forEach((w) => { colX.push(acc); acc += w; });
  const width = acc + 12, height = padT + (L + 2) * rowH + padB;
  const yOf = (r) => padT + (L + 1 - r) * rowH + rowH / 2;
  const X = new Float32Array(N), Y = new Float32Array(N), J = new Int32Array(N), CX = [], CY = [];
  cells.forEach((c, ci) => {
    c.per = Math.max(1, Math.floor((colW[c.pos] - 16) / SP));
    c.mode = "auto";  // auto: one counted box when more visible nodes than two sub-rows hold
    CX[ci] = colX[c.pos] + colW[c.pos] / 2; CY[ci] = yOf(c.row);
  });
  const dense = (c, vis) => c.mode === "closed" || (c.mode === "auto" && c.row <= L && vis > 2 * c.per);
  // positions of the visible members of every cell (recomputed when pruning changes them);
  // logits spread leftwards from the last column along the otherwise empty top row
  function layout(on) {
    cells.forEach((c) => {
      const vis = c.members.filter((i) => on[i]), m = vis.length;
      c.visible = m; c.collapsed = m > 0 && dense(c, m);
      if (c.row === L + 1) {
        const sp = 26, right = colX[c.pos] + colW[c.pos] - 14;
        vis.forEach((i, j) => { X[i] = Math.max(padL + 8, right - (m - 1 - j) * sp); Y[i] = yOf(c.row) + 6; });
        return;
      }
      const per = c.per, nsub = Math.ceil(m / per), dy = Math.min(11, (rowH - 14) / Math.max(1, nsub - 1));
      c.nsub = nsub;
      vis.forEach((i, j) => {
        J[i] = j;
        const inRow = Math.min(per, m - Math.floor(j / per) * per);
        X[i] = colX[c.pos] + colW[c.pos] / 2 + ((j % per) - (inRow - 1) / 2) * SP;
        Y[i] = yOf(c.row) + (Math.floor(j / per) - (nsub - 1) / 2) * dy;
      });
    });
  }

  // the page: graph on the left, a fixed side panel on the right
  const app = document.getElementById("app");
  const {main, side} = MI.layout(app, 400);
  const controls = MI.el("div", {class: "panel", id: "controls"});
  const nodeSlider = MI.el("input", {type: "range", min: 0, max: 1, step: 0.01, value: D.node_threshold, id: "node-threshold", style: "width:200px"});
  const edgeSlider = MI.el("input", {type: "range", min: 0, max: 1, step: 0.005, value: D.edge_threshold, id: "edge-threshold", style: "width:200px"});
  const nodeVal = MI.el("span", {id: "node-threshold-value"}), edgeVal = MI.el("span", {id: "edge-threshold-value"});
  const counts = MI.el("div", {id: "counts", class: "muted"});
  const expandAll = MI.el("button", {type: "button", id: "expand-all"}, "expand all groups");
  const collapseAll = MI.el("button", {type: "button", id: "collapse-all"}, "collapse dense groups");
  const saveSvg = MI.el("button", {type: "button", id: "save-svg"}, "save SVG");
  controls.append(MI.el("label", {}, "node threshold (cumulative influence kept) "), nodeSlider, nodeVal, MI.el("br"),
                  MI.el("label", {}, "edge threshold (|weight|, fraction of the largest) "), edgeSlider, edgeVal, counts,
                  MI.el("div", {style: "margin-top:4px;display:flex;gap:4px;flex-wrap:wrap"}, undefined));
  controls.lastChild.append(expandAll, collapseAll, saveSvg);
  const legend = MI.el("div", {class: "legend", id: "graph-legend"});
  [["●", 0, "feature"], ["■", 1, "error node"], ["■", 2, "token embedding"], ["■", 3, "logit"]].forEach(([g, k, t]) =>
    legend.append(MI.el("span", {style: `color:${COLOR[k]}`}, `${g} ${t}`)));
  legend.append(MI.el("span", {style: "color:#2166ac"}, "— positive edge"), MI.el("span", {style: "color:#b2182b"}, "— negative edge"),
                MI.el("span", {class: "muted"}, "▭ n: a group of n nodes (click to expand)"));
  const info = MI.el("div", {id: "info", class: "panel"}, "Click a node (or hover it) to see its inputs, outputs and top tokens.");
  side.append(controls, legend, info);

  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", width); svg.setAttribute("height", height); svg.id = "graph";
  svg.setAttribute("font-family", "system-ui,sans-serif");
  const mk = (tag, at, parent = svg, text) => { const e = document.createElementNS(NS, tag); for (const k in at) e.setAttribute(k, at[k]); if (text !== undefined) e.textContent = text; parent.append(e); return e; };
  for (let r = 0; r < L + 2; r++) {
    const y = padT + (L + 1 - r) * rowH;
    mk("rect", {x: 0, y, width, height: rowH, fill: r % 2 ? "#f7f7f7" : "#fff"});
    mk("text", {x: 6, y: y + rowH / 2 + 4, "font-size": 11, fill: "#555", class: "row-label"}, svg, r === 0 ? "Emb" : r === L + 1 ? "Logit" : "L" + (r - 1));
  }
  D.tokens.forEach((t, p) => {
    mk("line", {x1: colX[p], y1: padT, x2: colX[p], y2: height - padB, stroke: "#e4e4e4"});
    mk("text", {x: colX[p] + colW[p] / 2, y: height - padB + 14, "font-size": 10, fill: "#777", "text-anchor": "middle"}, svg, String(p));
    const tx = mk("text", {x: colX[p] + colW[p] / 2, y: height - padB + 30, "font-size": 12, "font-family": "ui-monospace,monospace", "text-anchor": "middle", class: "pos-label", "data-pos": p}, svg, MI.tok(t));
    tx.style.unicodeBidi = "isolate";
  });
  const gE = mk("g", {id: "edges"}), gN = mk("g", {id: "nodes"}), gC = mk("g", {id: "clusters"});
  const base = (e) => (Number.isFinite(W[e]) ? 0.12 + 0.6 * Math.abs(W[e]) / wmax : 0.5);
  const lines = new Array(E);
  for (let e = 0; e < E; e++) {
    const a = Number.isFinite(W[e]) ? Math.abs(W[e]) / wmax : 0;
    lines[e] = mk("line", {stroke: Number.isNaN(W[e]) ? "#999" : W[e] >= 0 ? "#2166ac" : "#b2182b", "stroke-width": (0.5 + 3 * a).toFixed(2),
      "stroke-dasharray": Number.isNaN(W[e]) ? "3 2" : "none", class: "edge", "data-e": e}, gE);
  }
  const glyphs = nodes.map((n, i) => {
    const g = mk("g", {class: "node", "data-i": i, style: "cursor:pointer"}, gN);
    if (n.kind === 0) mk("circle", {r: 5, fill: COLOR[0], class: "shape"}, g);
    else mk("rect", {x: -5, y: -5, width: 10, height: 10, fill: COLOR[n.kind], class: "shape"}, g);
    mk("title", {}, g, full(i));
    const s = short(n);
    if (s) {
      const lab = n.kind === 3 ? mk("text", {x: 3, y: -9, "font-size": 10.5, transform: "rotate(-50)", class: "node-label"}, g, s)
                               : mk("text", {y: 14, "font-size": 8, "text-anchor": "middle", fill: "#333", class: "node-label"}, g, s);
      lab.style.unicodeBidi = "isolate";
    }
    g.addEventListener("click", (ev) => { ev.stopPropagation(); select(i); });
    g.addEventListener("mouseenter", () => { hovered = i; render(); });
    g.addEventListener("mouseleave", () => { hovered = -1; render(); });
    return g;
  });
  const boxes = cells.map((c, ci) => {
    const g = mk("g", {class: "cluster", "data-cell": ci, style: "cursor:pointer"}, gC);
    const w = Math.min(colW[c.pos] - 10, 62);
    mk("rect", {x: CX[ci] - w / 2, y: CY[ci] - 9, width: w, height: 18, rx: 6, fill: "#e8f3e6", stroke: COLOR[c.row === 0 ? 2 : c.row === L + 1 ? 3 : 0]}, g);
    const t = mk("text", {x: CX[ci], y: CY[ci] + 4, "font-size": 10, "text-anchor": "middle", class: "cluster-count"}, g, "");
    const tip = mk("title", {}, g, "");
    g.addEventListener("click", (ev) => { ev.stopPropagation(); c.mode = "open"; layout(nodeOn); render(); });
    const minus = mk("text", {x: colX[c.pos] + colW[c.pos] - 9, y: CY[ci] - rowH / 2 + 11, "font-size": 12, fill: "#555", class: "collapse", "data-cell": ci, style: "cursor:pointer"}, svg, "−");
    mk("title", {}, minus, "collapse this group");
    minus.addEventListener("click", (ev) => { ev.stopPropagation(); c.mode = "closed"; layout(nodeOn); render(); });
    return {g, t, tip, minus};
  });
  const box = MI.el("div", {class: "scroll", id: "graph-box", style: `border:1px solid #ccc;max-height:${Math.max(360, window.innerHeight - 130)}px`});
  box.append(svg); main.append(box);
  MI.fit(box, 360);

  let selected = -1, hovered = -1, note = "";
  const nodeOn = new Uint8Array(N), edgeOn = new Uint8Array(E);
  const ex = (i) => (cells[cellOf[i]].collapsed ? CX[cellOf[i]] : X[i]), ey = (i) => (cells[cellOf[i]].collapsed ? CY[cellOf[i]] : Y[i]);
  function prune() {
    const nt = +nodeSlider.value, et = +edgeSlider.value * wmax;
    nodeVal.textContent = " " + MI.fmt(nt, 2);
    edgeVal.textContent = ` ${MI.fmt(+edgeSlider.value, 3)} (|w| ≥ ${MI.fmt(et, 4)})`;
    nodes.forEach((n, i) => { nodeOn[i] = n.kind >= 2 || n.influence === null || Number.isNaN(n.influence) || n.influence <= nt + 1e-9 ? 1 : 0; });
    let ne = 0, nn = 0;
    for (let e = 0; e < E; e++) { edgeOn[e] = nodeOn[src[e]] && nodeOn[dst[e]] && (Number.isNaN(W[e]) || Math.abs(W[e]) >= et) ? 1 : 0; ne += edgeOn[e]; }
    for (let i = 0; i < N; i++) nn += nodeOn[i];
    counts.textContent = `${nn} nodes, ${ne} edges shown`;
    counts.dataset.nodes = nn; counts.dataset.edges = ne;
    if (selected >= 0 && !nodeOn[selected]) { note = `${MI.txt(nodes[selected].label)} was pruned at this threshold.`; selected = -1; }
    layout(nodeOn);
    render();
  }
  // every edge's visibility and emphasis, every node's and group's visibility, the panel
  function render() {
    const focus = selected >= 0 ? selected : hovered;
    for (let e = 0; e < E; e++) {
      const l = lines[e];
      if (!edgeOn[e]) { l.style.display = "none"; continue; }
      l.style.display = "";
      const s = src[e], d = dst[e];
      l.setAttribute("x1", ex(s)); l.setAttribute("y1", ey(s)); l.setAttribute("x2", ex(d)); l.setAttribute("y2", ey(d));
      const near = focus >= 0 && (s === focus || d === focus);
      l.setAttribute("stroke-opacity", (focus < 0 ? base(e) : near ? 0.95 : 0.05).toFixed(2));
      l.dataset.near = near ? "1" : "0";
    }
    nodes.forEach((n, i) => {
      const g = glyphs[i], c = cells[cellOf[i]], on = nodeOn[i] && !c.collapsed;
      g.style.display = on ? "" : "none";
      if (!on) return;
      g.setAttribute("transform", `translate(${X[i]},${Y[i]})`);
      const lab = g.querySelector(".node-label");  // a feature's id where the cell leaves room:
      if (lab && n.kind !== 3) {                   // one row of nodes, labels on two staggered lines
        // nodes sit SP apart: the cell's widest label decides, so neighbours never collide
        const need = 5 * Math.max(...c.members.filter((k) => nodeOn[k]).map((k) => short(nodes[k]).length)) + 4;
        const room = c.nsub === 1 && 2 * SP >= need;
        lab.setAttribute("y", J[i] % 2 && SP < need ? 23 : 14);
        lab.style.display = i === focus || room ? "" : "none";
      }
      g.querySelector(".shape").setAttribute("stroke", i === selected ? "#000" : i === hovered ? "#e6550d" : "none");
      g.querySelector(".shape").setAttribute("stroke-width", 2);
    });
    cells.forEach((c, ci) => {
      const b = boxes[ci];
      b.g.style.display = c.collapsed ? "" : "none";
      b.t.textContent = `▭ ${c.visible}`;
      b.tip.textContent = `${c.row === 0 ? "embedding" : c.row === L + 1 ? "logits" : "L" + (c.row - 1)} at position ${posName(c.pos)}: ${c.visible} nodes (click to expand)`;
      b.minus.style.display = !c.collapsed && c.visible > 2 && c.row <= L ? "" : "none";
      b.g.dataset.count = c.visible;
    });
    panel();
  }
  function edgeRows(list, end) {
    return list.filter((e) => edgeOn[e]).slice(0, D.list_k).map((e) => {
      const j = end === "src" ? src[e] : dst[e];
      return [[MI.txt(nodes[j].label), "link"], [MI.fmt(W[e]), "num"], j];
    });
  }
  function edgeTable(id, head, rows) {
    const t = MI.table([head, "weight"], rows.map((r) => r.slice(0, 2)));
    t.id = id;
    [...t.querySelectorAll("tr")].slice(1).forEach((tr, k) => {
      tr.style.cursor = "pointer"; tr.dataset.node = rows[k][2];
      tr.addEventListener("click", () => select(rows[k][2]));
    });
    return t;
  }
  function panel() {
    const i = selected >= 0 ? selected : hovered;
    info.dataset.node = selected;
    if (i < 0) { overview(); return; }
    const n = nodes[i];
    const facts = [["kind", KIND[n.kind]], ["layer", layerName(n)], ["position", posName(n.pos)]];
    if (n.feature !== null) facts.push(["feature", MI.txt(n.feature)]);
    if (n.activation !== null) facts.push(["activation", MI.fmt(n.activation)]);
    if (n.influence !== null) facts.push(["cumulative influence", MI.fmt(n.influence)]);
    const parts = [MI.el("div", {style: "font-weight:bold", id: "node-title"}, MI.txt(n.label) + (selected < 0 ? " (hover)" : "")), MI.table(["", ""], facts)];
    if (n.top_tokens.length) {
      parts.push(MI.el("h3", {}, MI.txt(D.top_tokens_label)));
      const tt = MI.table(["token", "score"], n.top_tokens.map(([t, s]) => [[MI.tok(t), "tok-cell"], [MI.fmt(s), "num"]])); tt.id = "top-tokens"; parts.push(tt);
    }
    const ri = edgeRows(ins[i], "src"), ro = edgeRows(outs[i], "dst");
    parts.push(MI.el("h3", {}, `inputs: ${ins[i].filter((e) => edgeOn[e]).length} visible, strongest ${ri.length}`), edgeTable("inputs", "from", ri));
    parts.push(MI.el("h3", {}, `outputs: ${outs[i].filter((e) => edgeOn[e]).length} visible, strongest ${ro.length}`), edgeTable("outputs", "to", ro));
    info.replaceChildren(...parts);
  }
  // nothing selected: the logits and the most influential visible features, each a link
  function overview() {
    const link = (t, j) => { [...t.querySelectorAll("tr")].slice(1).forEach((tr, k) => {
      tr.style.cursor = "pointer"; tr.dataset.node = j[k]; tr.addEventListener("click", () => select(j[k])); }); return t; };
    const logits = [...Array(N).keys()].filter((i) => nodes[i].kind === 3 && nodeOn[i]);
    const feats = [...Array(N).keys()].filter((i) => nodes[i].kind === 0 && nodeOn[i]).sort((a, b) => infl(a) - infl(b)).slice(0, 8);
    info.replaceChildren(MI.el("div", {class: "muted"}, note || "Click a node (or hover it, or a row below) to see its inputs, outputs and top tokens."),
      MI.el("h3", {}, "logits"), link(MI.table(["node", "p"], logits.map((i) => [[MI.txt(nodes[i].label), "link"],
        [nodes[i].top_tokens.length ? MI.fmt(nodes[i].top_tokens[0][1], 3) : "", "num"]])), logits),
      MI.el("h3", {}, "most influential features shown"), link(MI.table(["node", "influence"], feats.map((i) => [[MI.txt(nodes[i].label), "link"],
        [MI.fmt(nodes[i].influence, 3), "num"]])), feats));
  }
  function select(i) {
    note = "";
    if (i >= 0) {
      if (!nodeOn[i]) { note = `${MI.txt(nodes[i].label)} is pruned at this threshold.`; i = -1; }
      else if (cells[cellOf[i]].collapsed) { cells[cellOf[i]].mode = "open"; layout(nodeOn); }
    }
    selected = i; hovered = -1; render();
    if (i >= 0) {  // keep the selected node in view inside the scroll box
      const bx = box.getBoundingClientRect(), r = glyphs[i].getBoundingClientRect();
      if (r.left < bx.left || r.right > bx.right || r.top < bx.top || r.bottom > bx.bottom) { box.scrollLeft += r.left - bx.left - bx.width / 2; box.scrollTop += r.top - bx.top - bx.height / 2; }
    }
  }
  svg.addEventListener("click", () => { selected = -1; note = ""; render(); });
  nodeSlider.addEventListener("input", prune);
  edgeSlider.addEventListener("input", prune);
  expandAll.addEventListener("click", () => { cells.forEach((c) => (c.mode = "open")); layout(nodeOn); render(); });
  collapseAll.addEventListener("click", () => { cells.forEach((c) => (c.mode = "auto")); layout(nodeOn); render(); });
  saveSvg.addEventListener("click", () => {
    const a = MI.el("a", {download: "attribution_graph.svg", href: "data:image/svg+xml;charset=utf-8," + encodeURIComponent(new XMLSerializer().serializeToString(svg))});
    document.body.append(a); a.click(); a.remove();
  });
  window.MI_GRAPH = {select, render, prune, cells, nodeOn, edgeOn};
  prune();
  MI.ready(t0);
})();
