// Attention patterns of one layer, after CircuitsVis: every head as a thumbnail (click one,
// or "mean", to select it), the selected head large with its tokens on both axes (rows:
// query, columns: key), and the prompt coloured by the weight the current query gives each
// token. Hover a token or a row of the large grid to choose the query; the side panel lists
// its top keys and the hovered weight.
(() => {
  const t0 = performance.now();
  const D = MI.data(), P = MI.f32(D.pattern), [H, Q, K] = D.pattern.shape, toks = D.tokens;
  const mean = new Float32Array(Q * K);
  for (let h = 0; h < H; h++) for (let i = 0; i < Q * K; i++) mean[i] += P[h * Q * K + i] / H;
  const w = (h, q, k) => (h < 0 ? mean[q * K + k] : P[(h * Q + q) * K + k]);
  const name = (h) => (h < 0 ? "mean of heads" : D.head_labels[h]);
  let head = D.initial_head, query = Q - 1;
  const app = document.getElementById("app");
  const {main, side} = MI.layout(app, 360);
  const info = MI.el("div", {id: "info", class: "panel"});
  const cellInfo = MI.el("div", {id: "cell", class: "panel muted"}, "Hover the large grid to read one weight.");
  side.append(info, cellInfo, MI.legend((v) => MI.seqRGB(v), 0, 1, "attention weight"));

  // head selector: a thumbnail per head
  const bar = MI.el("div", {id: "heads-select", class: "row", style: "gap:6px;margin-bottom:6px"});
  const t = Math.max(1, Math.min(10, Math.floor(64 / Math.max(Q, K))));
  const buttons = [];
  for (let h = -1; h < H; h++) {
    const b = MI.el("button", {type: "button", "data-head": h, class: "head-btn", title: `select ${name(h)}`,
                               style: "display:flex;flex-direction:column;align-items:center;padding:2px 4px;cursor:pointer"});
    b.append(MI.el("span", {style: "font-size:11px"}, h < 0 ? "mean" : D.head_labels[h]));
    const thumb = MI.heatmap({rows: Q, cols: K, cw: t, ch: t, rgb: (q, k) => MI.seqRGB(w(h, q, k))});
    thumb.className = h < 0 ? "head-mean" : "head"; thumb.dataset.head = h;
    b.append(thumb);
    b.addEventListener("click", () => select(h));
    buttons.push(b); bar.append(b);
  }
  main.append(MI.el("div", {class: "note"}, `${H} heads; click one (or "mean") to show it large below.`), bar);

  // the prompt, coloured by the query's attention
  const strip = MI.el("div", {id: "tokens", style: "margin:4px 0 8px;line-height:1.9"});
  const spans = toks.map((s, i) => { const e = MI.el("span", {class: "tok", "data-i": i}, MI.tok(s)); strip.append(e); return e; });
  strip.addEventListener("mouseover", (ev) => { const i = ev.target.dataset && ev.target.dataset.i; if (i !== undefined) { query = +i; update(); } });
  main.append(MI.el("div", {class: "note"}, "Hover a token to make it the query: every token is coloured by the weight the query gives it (outlined: the query)."), strip);

  // the selected head, large, with token labels
  const longest = Math.max(...toks.map((s) => MI.tok(s).length), 3);
  const lw = Math.min(190, 7 * longest + 34), th = Math.min(150, 7 * longest + 34);
  // cells as large as the window allows (the grid fits under the thumbnails and tokens)
  const cs = Math.max(6, Math.min(56, Math.floor(640 / Math.max(Q, K)),
                                  Math.floor((window.innerHeight - 330 - th) / Q)));
  const every = Math.ceil(13 / cs);  // label every n-th token when rows are too thin for text
  const left = MI.el("canvas", {width: lw, height: Q * cs, id: "query-labels"}), top = MI.el("canvas", {width: K * cs, height: th, id: "key-labels"});
  const label = (i) => `${i} ${MI.tok(toks[i])}`;
  function paintLabels(hq, hk) {
    const gl = left.getContext("2d");
    gl.clearRect(0, 0, lw, left.height); gl.font = "11px ui-monospace,Menlo,Consolas,monospace"; gl.textBaseline = "middle"; gl.textAlign = "right";
    for (let q = 0; q < Q; q++) {
      if (q === hq || q === query) { gl.fillStyle = q === hq ? "#fff3c4" : "#fde0dd"; gl.fillRect(0, q * cs, lw, cs); }
      if (q % every === 0 || q === hq) { gl.fillStyle = "#000"; gl.fillText(label(q), lw - 4, q * cs + cs / 2); }
    }
    const gt = top.getContext("2d");
    gt.clearRect(0, 0, top.width, th); gt.font = "11px ui-monospace,Menlo,Consolas,monospace"; gt.textBaseline = "middle";
    for (let k = 0; k < K; k++) {
      if (k === hk) { gt.fillStyle = "#fff3c4"; gt.fillRect(k * cs, 0, cs, th); }
      if (k % every === 0 || k === hk) {
        gt.save(); gt.translate(k * cs + cs / 2, th - 4); gt.rotate(-Math.PI / 2); gt.fillStyle = "#000"; gt.fillText(label(k), 0, 0); gt.restore();
      }
    }
  }
  const big = MI.heatmap({rows: Q, cols: K, cw: cs, ch: cs, rgb: (q, k) => MI.seqRGB(w(head, q, k)),
    text: cs >= 34 ? (q, k) => (k <= q ? MI.fmt(w(head, q, k), 2) : "") : null,
    onHover: (q, k) => {
      big.mark(q, k); paintLabels(q, k);
      cellInfo.classList.remove("muted");
      cellInfo.replaceChildren(MI.el("h3", {}, `${name(head)}: one weight`),
        MI.table(["", ""], [["query", label(q)], ["key", label(k)], ["weight", [MI.fmt(w(head, q, k)), "num"]]]));
      cellInfo.dataset.value = w(head, q, k); cellInfo.dataset.query = q; cellInfo.dataset.key = k;
    },
    onClick: (q) => { query = q; update(); }});
  big.id = "pattern";
  const caption = MI.el("h3", {id: "pattern-title", style: "font-size:14px;margin:6px 0 2px"});
  const gridBox = MI.stickyGrid(top, left, big, Math.max(320, window.innerHeight - 120));
  main.append(caption, MI.el("div", {class: "note"}, "rows: query (attending), columns: key (attended to); a query attends only to itself and earlier tokens. Click a row to make it the query."),
              gridBox);
  MI.fit(gridBox);

  function select(h) { head = h; big.repaint(); update(); }
  function update() {
    buttons.forEach((b) => b.classList.toggle("on", +b.dataset.head === head));
    caption.textContent = `${name(head)} (${H} heads in this layer)`;
    paintLabels(-1, -1);
    spans.forEach((e, k) => {
      const v = k < K ? w(head, query, k) : 0, rgb = MI.seqRGB(v);
      e.style.background = MI.css(rgb); e.style.color = MI.ink(rgb); e.dataset.weight = v;
      e.style.outline = k === query ? "2px solid #e6550d" : "";
    });
    const order = [...Array(K).keys()].sort((a, b) => {
      const x = w(head, query, a), y = w(head, query, b);
      return Number.isNaN(x) ? 1 : Number.isNaN(y) ? -1 : y - x;
    }).slice(0, D.top_k);
    info.replaceChildren(
      MI.el("h3", {}, `${name(head)}: query ${label(query)} attends to`),
      MI.table(["key", "token", "weight"], order.map((k) => [[String(k), "num"], [MI.tok(toks[k]), "tok-cell"], [MI.fmt(w(head, query, k)), "num"]])));
    info.dataset.head = head; info.dataset.query = query;
  }
  update();
  MI.ready(t0);
})();
