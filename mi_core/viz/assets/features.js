// Feature activations over the prompt: pick a feature (list sorted by its largest
// activation) to highlight every token by that feature's activation; hover a token for its
// value and the strongest features there.
(() => {
  const t0 = performance.now();
  const D = MI.data(), A = MI.f32(D.acts), [S, F] = D.acts.shape, toks = D.tokens;
  const act = (s, f) => A[s * F + f];
  const fmax = new Float32Array(F);
  for (let f = 0; f < F; f++) for (let s = 0; s < S; s++) fmax[f] = Math.max(fmax[f], Math.abs(act(s, f)));
  const order = [...Array(F).keys()].sort((a, b) => fmax[b] - fmax[a]);
  let feat = order[0] === undefined ? -1 : order[0];
  const app = document.getElementById("app");
  const list = MI.el("div", {id: "features", class: "panel", style: "max-height:70vh;overflow:auto;min-width:200px"});
  list.append(MI.el("div", {class: "muted"}, `${F} features, strongest first (max activation)`));
  const items = order.map((f) => {
    const it = MI.el("div", {"data-f": f, class: "feature", style: "cursor:pointer;padding:1px 4px;font-family:monospace"}, `${D.labels[f]}  ${MI.fmt(fmax[f], 3)}`);
    it.addEventListener("click", () => { feat = f; update(); });
    list.append(it); return it;
  });
  const right = MI.el("div", {style: "flex:1;min-width:300px"});
  const title = MI.el("div", {id: "selected", style: "font-weight:bold;margin-bottom:4px"});
  const text = MI.el("div", {id: "tokens", style: "line-height:2"});
  const spans = toks.map((t, s) => { const e = MI.el("span", {class: "tok", "data-s": s}, MI.tok(t)); text.append(e); return e; });
  const info = MI.el("div", {id: "info", class: "panel", style: "margin-top:8px"}, "Hover a token for its activation and the strongest features there.");
  text.addEventListener("mouseover", (ev) => { const s = ev.target.dataset && ev.target.dataset.s; if (s !== undefined) show(+s); });
  right.append(title, text, MI.legend((v) => MI.divRGB(v, 1), -1, 1, "activation / feature max"), info);
  const row = MI.el("div", {class: "row"}); row.append(list, right); app.append(row);
  function update() {
    items.forEach((it) => (it.style.background = +it.dataset.f === feat ? "#dde" : ""));
    title.textContent = feat < 0 ? "no features" : `feature ${D.labels[feat]} (max |activation| ${MI.fmt(fmax[feat])})`;
    title.dataset.f = feat;
    spans.forEach((e, s) => {
      const v = feat < 0 ? 0 : act(s, feat), rgb = MI.divRGB(v, fmax[feat] || 1);
      e.style.background = MI.css(rgb); e.style.color = MI.ink(rgb); e.dataset.act = v;
    });
  }
  function show(s) {
    const top = [...Array(F).keys()].filter((f) => act(s, f) !== 0).sort((a, b) => Math.abs(act(s, b)) - Math.abs(act(s, a))).slice(0, D.top_k);
    info.replaceChildren(
      MI.el("div", {}, `position ${s} ${JSON.stringify(MI.tok(toks[s]))}: ${feat < 0 ? "" : D.labels[feat] + " = " + MI.fmt(act(s, feat))}`),
      MI.table(["feature", "activation"], top.map((f) => [D.labels[f], [MI.fmt(act(s, f)), "num"]])));
    info.dataset.s = s;
    spans.forEach((e, j) => (e.style.outline = j === s ? "2px solid #333" : ""));
  }
  update();
  MI.ready(t0);
})();
