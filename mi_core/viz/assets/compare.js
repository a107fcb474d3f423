// Baseline vs intervened next-token distribution (knockout, ablation, steering).
// Effects are intervened - baseline. Click a column header to sort; hover a row for details
// in the side panel (beside the table, always in view). Ranks are 1-based (1 = top token).
(() => {
  const t0 = performance.now();
  const D = MI.data(), rows = D.rows;
  const app = document.getElementById("app");
  const {main, side} = MI.layout(app, 400);
  const sum = MI.el("div", {id: "summary", class: "panel"});
  sum.append(MI.el("h3", {}, "summary"),
             MI.table(["measure", "value"], D.summary.map(([k, v]) => [MI.txt(k), [MI.fmt(v, 5), "num"]])));
  const info = MI.el("div", {id: "info", class: "panel"}, "Hover a row for its probability, log-probability, logit and rank, before and after.");
  side.append(sum, info);
  main.append(MI.el("p", {class: "note"}, `Effects are ${MI.txt(D.label)} − baseline (negative: the intervention lowered it). ` +
    `Prefer Δ log-prob and KL: a raw logit change includes the shift every logit shares. Bars: probability (grey = baseline, blue = ${MI.txt(D.label)}). ` +
    `${rows.length} tokens of ${D.vocab}: the top of each distribution and the most changed.`));
  const cols = [["token", (r) => r.token], ["p baseline", (r) => r.p_base], [`p ${MI.txt(D.label)}`, (r) => r.p_int],
                ["Δ prob", (r) => r.d_prob], ["Δ log-prob", (r) => r.d_logprob], ["Δ logit", (r) => r.d_logit]];
  let sortCol = 3, desc = false;  // most lowered first
  const finite = (xs) => xs.filter((x) => Number.isFinite(x));
  const maxP = Math.max(1e-12, ...finite(rows.map((r) => Math.max(r.p_base, r.p_int))));
  const maxD = Math.max(1e-12, ...finite(rows.map((r) => Math.abs(r.d_prob))));
  const box = MI.el("div", {class: "scroll", style: `max-height:${Math.max(320, window.innerHeight - 170)}px;border:1px solid #ddd`});
  const table = MI.el("table", {id: "effects", style: "border-collapse:collapse;font-size:13px"});
  box.append(table); main.append(box);
  MI.fit(box);
  let hovered = null;
  function show(r, tr) {
    if (hovered) hovered.classList.remove("hover");
    hovered = tr; tr.classList.add("hover");
    info.replaceChildren(MI.el("div", {style: "font-weight:bold"}, `token ${MI.tok(r.token)} (id ${r.id})`),
      MI.table(["", "baseline", MI.txt(D.label), "Δ"], [
        ["prob", [MI.fmt(r.p_base), "num"], [MI.fmt(r.p_int), "num"], [MI.fmt(r.d_prob), "num"]],
        ["log-prob", [MI.fmt(r.lp_base), "num"], [MI.fmt(r.lp_int), "num"], [MI.fmt(r.d_logprob), "num"]],
        ["logit", [MI.fmt(r.logit_base), "num"], [MI.fmt(r.logit_int), "num"], [MI.fmt(r.d_logit), "num"]],
        ["rank (1 = top)", [String(r.rank_base + 1), "num"], [String(r.rank_int + 1), "num"], ""]]));
    info.dataset.id = r.id;
  }
  function render() {
    const sorted = rows.slice().sort((a, b) => {
      const x = cols[sortCol][1](a), y = cols[sortCol][1](b);
      if (typeof x !== "string" && (Number.isNaN(x) || Number.isNaN(y)))  // NaN always last
        return Number.isNaN(x) === Number.isNaN(y) ? 0 : Number.isNaN(x) ? 1 : -1;
      const c = typeof x === "string" ? x.localeCompare(y) : x - y;
      return desc ? -c : c;
    });
    const head = MI.el("tr");
    cols.forEach(([name], i) => {
      const th = MI.el("th", {class: "sticky", style: "cursor:pointer;padding:2px 8px;text-align:left", "data-col": i,
                              title: "click to sort"}, name + (i === sortCol ? (desc ? " ▼" : " ▲") : ""));
      th.addEventListener("click", () => { desc = sortCol === i ? !desc : i !== 0; sortCol = i; render(); });
      head.append(th);
    });
    head.append(MI.el("th", {class: "sticky"}, "probability"));
    table.replaceChildren(head);
    hovered = null;
    sorted.forEach((r) => {
      const tr = MI.el("tr", {"data-id": r.id});
      tr.append(MI.el("td", {class: "tok-cell"}, MI.tok(r.token)));
      [r.p_base, r.p_int].forEach((v) => tr.append(MI.el("td", {class: "num"}, MI.fmt(v))));
      const dc = MI.divRGB(r.d_prob, maxD);
      tr.append(MI.el("td", {class: "num", style: `background:${MI.css(dc)};color:${MI.ink(dc)}`}, MI.fmt(r.d_prob)));
      tr.append(MI.el("td", {class: "num"}, MI.fmt(r.d_logprob)), MI.el("td", {class: "num"}, MI.fmt(r.d_logit)));
      const bars = MI.el("td", {style: "width:220px"});
      const w = (p) => (Number.isFinite(p) ? 200 * p / maxP : 0);
      bars.append(MI.el("div", {style: `height:6px;background:#999;width:${w(r.p_base)}px`}),
                  MI.el("div", {style: `height:6px;background:#2166ac;width:${w(r.p_int)}px;margin-top:1px`}));
      tr.append(bars);
      tr.addEventListener("mouseover", () => show(r, tr));
      table.append(tr);
    });
  }
  render();
  const first = table.querySelector("tr[data-id]");  // the panel opens on the first row
  if (first) show(rows.find((r) => String(r.id) === first.dataset.id), first);
  MI.ready(t0);
})();
