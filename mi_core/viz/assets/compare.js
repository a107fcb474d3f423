// Baseline vs intervened next-token distribution (knockout, ablation, steering).
// Effects are intervened - baseline. Click a column header to sort; hover a row for details.
(() => {
  const t0 = performance.now();
  const D = MI.data(), rows = D.rows;
  const app = document.getElementById("app");
  const sum = MI.el("div", {id: "summary", class: "panel"});
  sum.append(MI.table(["measure", "value"], D.summary.map(([k, v]) => [k, [MI.fmt(v, 5), "num"]])));
  const info = MI.el("div", {id: "info", class: "panel"}, "Hover a row for its values.");
  app.append(MI.el("p", {class: "sub"}, `Effects are ${D.label} - baseline (negative: the intervention lowered it). Bars: probability (grey = baseline, colour = ${D.label}).`),
             sum, MI.el("div", {style: "height:8px"}), info);
  const cols = [["token", (r) => r.token], ["p baseline", (r) => r.p_base], [`p ${D.label}`, (r) => r.p_int],
                ["Δ prob", (r) => r.d_prob], ["Δ log-prob", (r) => r.d_logprob], ["Δ logit", (r) => r.d_logit]];
  let sortCol = 3, desc = false;  // most lowered first
  const maxP = Math.max(1e-12, ...rows.map((r) => Math.max(r.p_base, r.p_int)));
  const maxD = Math.max(1e-12, ...rows.map((r) => Math.abs(r.d_prob)));
  const table = MI.el("table", {id: "effects", style: "border-collapse:collapse;margin-top:8px;font-size:13px"});
  app.append(table);
  function render() {
    const sorted = rows.slice().sort((a, b) => {
      const x = cols[sortCol][1](a), y = cols[sortCol][1](b);
      const c = typeof x === "string" ? x.localeCompare(y) : x - y;
      return desc ? -c : c;
    });
    const head = MI.el("tr");
    cols.forEach(([name], i) => {
      const th = MI.el("th", {style: "cursor:pointer;padding:2px 8px;text-align:left", "data-col": i}, name + (i === sortCol ? (desc ? " ▼" : " ▲") : ""));
      th.addEventListener("click", () => { desc = sortCol === i ? !desc : i !== 0; sortCol = i; render(); });
      head.append(th);
    });
    head.append(MI.el("th", {}, "probability"));
    table.replaceChildren(head);
    sorted.forEach((r) => {
      const tr = MI.el("tr", {"data-id": r.id});
      tr.append(MI.el("td", {class: "tok-cell"}, MI.tok(r.token)));
      [r.p_base, r.p_int].forEach((v) => tr.append(MI.el("td", {class: "num"}, MI.fmt(v))));
      const dc = MI.divRGB(r.d_prob, maxD);
      tr.append(MI.el("td", {class: "num", style: `background:${MI.css(dc)};color:${MI.ink(dc)}`}, MI.fmt(r.d_prob)));
      tr.append(MI.el("td", {class: "num"}, MI.fmt(r.d_logprob)), MI.el("td", {class: "num"}, MI.fmt(r.d_logit)));
      const bars = MI.el("td", {style: "width:220px"});
      bars.append(MI.el("div", {style: `height:6px;background:#999;width:${200 * r.p_base / maxP}px`}),
                  MI.el("div", {style: `height:6px;background:#2166ac;width:${200 * r.p_int / maxP}px;margin-top:1px`}));
      tr.append(bars);
      tr.addEventListener("mouseover", () => {
        info.replaceChildren(MI.el("div", {}, `token ${JSON.stringify(MI.tok(r.token))} (id ${r.id})`),
          MI.table(["", "baseline", D.label, "Δ"], [
            ["prob", [MI.fmt(r.p_base), "num"], [MI.fmt(r.p_int), "num"], [MI.fmt(r.d_prob), "num"]],
            ["log-prob", [MI.fmt(r.lp_base), "num"], [MI.fmt(r.lp_int), "num"], [MI.fmt(r.d_logprob), "num"]],
            ["logit", [MI.fmt(r.logit_base), "num"], [MI.fmt(r.logit_int), "num"], [MI.fmt(r.d_logit), "num"]],
            ["rank", [String(r.rank_base + 1), "num"], [String(r.rank_int + 1), "num"], ""]]));
        info.dataset.id = r.id;
      });
      table.append(tr);
    });
  }
  render();
  MI.ready(t0);
})();
