// Feature activations over the prompt: pick a feature (list sorted by its largest
// |activation|; NaN first) to highlight every token by that feature's activation; hover a
// token for its value and the strongest features there (side panel).
(() => {
  const t0 = performance.now();
  const D = MI.data(), A = MI.f32(D.acts), [S, F] = D.acts.shape, toks = D.tokens;
  const act = (s, f) => A[s * F + f];
  const fmax = new Float32Array(F);
  for (let f = 0; f < F; f++) for (let s = 0; s < S; s++) { const v = Math.abs(act(s, f)); fmax[f] = Number.isNaN(v) || Number.isNaN(fmax[f]) ? NaN : Math.max(fmax[f], v); }
  const byAbs = (x, y) => (Number.isNaN(x) ? (Number.isNaN(y) ? 0 : -1) : Number.isNaN(y) ? 1 : Math.abs(y) - Math.abs(x));
  const order = [...Array(F).keys()].sort((a, b) => byAbs(fmax[a], fmax[b]));
  let feat = order[0] === undefined ? -1 : order[0];
  const app = document.getElementById("app");
  const {main, side} = MI.layout(app, 360);
  const list = MI.el("div", {id: "features", class: "panel", style: `max-height:${Math.max(300, window.innerHeight - 160)}px;overflow:auto;min-width:210px`});
  list.append(MI.el("div", {class: "muted"}, `${F} features, strongest first (max |activation|)`));
  const items = order.map((f) => {
    const it = MI.el("div", {"data-f": f, class: "feature", style: "cursor:pointer;padding:1px 4px;font-family:monospace;white-space:pre"}, `${MI.txt(D.labels[f])}  ${MI.fmt(fmax[f], 3)}`);
    it.addEventListener("click", () => { feat = f; update(); });
    list.append(it); return it;
  });
  const right = MI.el("div", {style: "flex:1;min-width:300px"});
  const title = MI.el("div", {id: "selected", style: "font-weight:bold;margin-bottom:4px"});
  const text = MI.el("div", {id: "tokens", style: "line-height:2"});
  const spans = toks.map((t, s) => { const e = MI.el("span", {class: "tok", "data-s": s}, MI.tok(t)); text.append(e); return e; });
  const info = MI.el("div", {id: "info", class: "panel"}, "Hover a token for its activation and the strongest features there.");
  text.addEventListener("mouseover", (ev) => { const s = ev.target.dataset && ev.target.dataset.s; if (s !== undefined) show(+s); });
  right.append(title, text, MI.legend((v) => MI.divRGB(v, 1), -1, 1, "activation / feature max (grey: NaN)"));
  const row = MI.el("div", {class: "row", style: "flex-wrap:nowrap"}); row.append(list, right); main.append(row);
  MI.fit(list, 200);
  side.append(info);
  function update() {
    items.forEach((it) => (it.style.background = +it.dataset.f === feat ? "#dde" : ""));
    title.textContent = feat < 0 ? "no features" : `feature ${MI.txt(D.labels[feat])} (max |activation| ${MI.fmt(fmax[feat])})`;
    title.dataset.f = feat;
    spans.forEach((e, s) => {
      const v = feat < 0 ? 0 : act(s, feat), rgb = MI.divRGB(v, fmax[feat] || 1);
      e.style.background = MI.css(rgb); e.style.color = MI.ink(rgb); e.dataset.act = v;
    });
  }
  function show(s) {
    const top = [...Array(F).keys()].filter((f) => act(s, f) !== 0).sort((a, b) => byAbs(act(s, a), act(s, b))).slice(0, D.top_k);
    info.replaceChildren(
      MI.el("h3", {}, `position ${s} ${MI.tok(toks[s])}` + (feat < 0 ? "" : `: ${MI.txt(D.labels[feat])} = ${MI.fmt(act(s, feat))}`)),
      MI.table(["feature", "activation"], top.map((f) => [MI.txt(D.labels[f]), [MI.fmt(act(s, f)), "num"]])));
    info.dataset.s = s;
    spans.forEach((e, j) => (e.style.outline = j === s ? "2px solid #333" : ""));
  }
  update();
  if (feat >= 0 && S) {  // the panel opens on the token where the selected feature is largest
    let s0 = 0;
    for (let s = 1; s < S; s++) if (Math.abs(act(s, feat)) > Math.abs(act(s0, feat))) s0 = s;
    show(s0);
  }
  MI.ready(t0);
})();
