// Attention patterns of one layer: every head as a [query x key] grid, the prompt as tokens.
// Hover a token (a query) to colour every token by the weight it receives and list the top
// keys; hover a head's grid to read one weight; click a head (or its button) to select it.
(() => {
  const t0 = performance.now();
  const D = MI.data(), P = MI.f32(D.pattern), [H, Q, K] = D.pattern.shape, toks = D.tokens;
  const mean = new Float32Array(Q * K);
  for (let h = 0; h < H; h++) for (let i = 0; i < Q * K; i++) mean[i] += P[h * Q * K + i] / H;
  const w = (h, q, k) => (h < 0 ? mean[q * K + k] : P[(h * Q + q) * K + k]);
  const name = (h) => (h < 0 ? "mean of heads" : D.head_labels[h]);
  let head = D.initial_head, query = Q - 1;
  const app = document.getElementById("app");

  const bar = MI.el("div", {id: "heads-select", class: "legend"});
  bar.append(MI.el("span", {}, "head:"));
  const buttons = [];
  for (let h = -1; h < H; h++) {
    const b = MI.el("button", {type: "button", "data-head": h}, h < 0 ? "mean" : D.head_labels[h]);
    b.addEventListener("click", () => select(h));
    buttons.push(b); bar.append(b);
  }
  app.append(bar);

  const strip = MI.el("div", {id: "tokens"});
  const spans = toks.map((s, i) => {
    const e = MI.el("span", {class: "tok", "data-i": i}, MI.tok(s));
    strip.append(e); return e;
  });
  strip.addEventListener("mouseover", (ev) => {
    const i = ev.target.dataset && ev.target.dataset.i;
    if (i !== undefined) { query = +i; update(); }
  });
  app.append(MI.el("p", {class: "muted"}, "Hover a token to see what it attends to (colour = attention weight from that query)."), strip);
  const info = MI.el("div", {id: "info", class: "panel"});
  const cellInfo = MI.el("div", {id: "cell", class: "panel muted"}, "Hover a head's grid to read one weight.");
  app.append(info, cellInfo,
             MI.legend((v) => MI.seqRGB(v), 0, 1, "weight"));

  const grid = MI.el("div", {id: "grid", class: "row"});
  const size = Math.max(1, Math.min(10, Math.floor(200 / Math.max(Q, K))));
  const marks = [];
  for (let h = 0; h < H; h++) {
    const fig = MI.el("figure", {style: "margin:4px;position:relative", "data-head": h});
    fig.append(MI.el("figcaption", {style: "font-size:12px"}, D.head_labels[h]));
    const c = MI.heatmap({rows: Q, cols: K, cw: size, ch: size, rgb: (q, k) => MI.seqRGB(w(h, q, k)),
      onHover: (q, k) => {
        cellInfo.textContent = `${D.head_labels[h]}: query ${q} ${JSON.stringify(MI.tok(toks[q]))} -> key ${k} ${JSON.stringify(MI.tok(toks[k]))}: ${MI.fmt(w(h, q, k))}`;
        cellInfo.dataset.value = w(h, q, k);
      },
      onClick: (q) => { query = q; select(h); }});
    c.className = "head"; c.dataset.head = h;
    const wrap = MI.el("div", {style: "position:relative;border:1px solid #ccc"});
    const mark = MI.el("div", {style: `position:absolute;left:0;right:0;height:${size}px;outline:1px solid #e66;pointer-events:none`});
    wrap.append(c, mark); fig.append(wrap); grid.append(fig); marks.push([fig, mark]);
  }
  app.append(MI.el("h3", {style: "font-size:14px"}, `all ${H} heads (rows: query, columns: key)`), grid);

  function select(h) { head = h; update(); }
  function update() {
    buttons.forEach((b) => (b.style.fontWeight = +b.dataset.head === head ? "bold" : "normal"));
    marks.forEach(([fig, m], h) => { m.style.top = query * size + "px"; fig.style.background = h === head ? "#eef" : ""; });
    spans.forEach((e, k) => {
      const v = k < K ? w(head, query, k) : 0, rgb = MI.seqRGB(v);
      e.style.background = MI.css(rgb); e.style.color = MI.ink(rgb); e.dataset.weight = v;
      e.style.outline = k === query ? "2px solid #e66" : "";
    });
    const order = [...Array(K).keys()].sort((a, b) => w(head, query, b) - w(head, query, a)).slice(0, D.top_k);
    info.replaceChildren(
      MI.el("div", {}, `${name(head)}: query ${query} ${JSON.stringify(MI.tok(toks[query]))} attends to`),
      MI.table(["key", "token", "weight"], order.map((k) => [[String(k), "num"], [MI.tok(toks[k]), "tok-cell"], [MI.fmt(w(head, query, k)), "num"]])));
    info.dataset.head = head; info.dataset.query = query;
  }
  update();
  MI.ready(t0);
})();
