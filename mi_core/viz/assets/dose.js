// Dose-response of a steering sweep: KL(baseline || steered) and the target's probability
// against the strength s, as an SVG chart. Hover a point: its values in the side panel.
(() => {
  const t0 = performance.now();
  const D = MI.data(), pts = D.points, n = pts.length;
  const app = document.getElementById("app");
  const {main, side} = MI.layout(app, 380);
  const info = MI.el("div", {id: "info", class: "panel"}, "Hover a point for its values.");
  const W = 760, H = 420, m = {l: 64, r: 64, t: 16, b: 46};
  const NS = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(NS, "svg");
  svg.setAttribute("width", W); svg.setAttribute("height", H); svg.id = "chart";
  const s = (tag, at, text) => { const e = document.createElementNS(NS, tag); for (const [k, v] of Object.entries(at)) e.setAttribute(k, v); if (text !== undefined) e.textContent = text; svg.append(e); return e; };
  const fin = (v) => (Number.isFinite(v) ? v : 0);
  const xs = pts.map((p) => p.strength), x0 = Math.min(...xs), x1 = Math.max(...xs) + (n === 1 || Math.max(...xs) === x0 ? 1 : 0);
  const kmax = Math.max(1e-9, ...pts.map((p) => fin(p.kl)));
  const X = (v) => m.l + (W - m.l - m.r) * (v - x0) / (x1 - x0);
  const Y = (v, top) => H - m.b - (H - m.t - m.b) * fin(v) / top;
  s("line", {x1: m.l, y1: H - m.b, x2: W - m.r, y2: H - m.b, stroke: "#444"});
  s("line", {x1: m.l, y1: m.t, x2: m.l, y2: H - m.b, stroke: "#444"});
  const xlabel = D.kind === "attention" ? "strength s (attention scale on the steered edges)" : "strength s (multiple of the direction added)";
  s("text", {x: (W + m.l - m.r) / 2, y: H - 8, "text-anchor": "middle", "font-size": 12, id: "x-label"}, xlabel);
  s("text", {x: 16, y: H / 2, "font-size": 12, transform: `rotate(-90 16 ${H / 2})`, "text-anchor": "middle", fill: "#1f77b4"}, "KL(baseline || steered), nats");
  [0, 0.25, 0.5, 0.75, 1].forEach((f) => {
    s("line", {x1: m.l, y1: Y(f * kmax, kmax), x2: W - m.r, y2: Y(f * kmax, kmax), stroke: "#eee"});
    s("text", {x: m.l - 4, y: Y(f * kmax, kmax) + 4, "text-anchor": "end", "font-size": 10}, MI.fmt(f * kmax, 3));
  });
  xs.forEach((v) => s("text", {x: X(v), y: H - m.b + 14, "text-anchor": "middle", "font-size": 10}, String(v)));
  const line = (vals, top, color, dash) => s("polyline", {fill: "none", stroke: color, "stroke-width": 2, "stroke-dasharray": dash,
    points: pts.map((p, i) => `${X(p.strength)},${Y(vals[i], top)}`).join(" ")});
  line(pts.map((p) => p.kl), kmax, "#1f77b4", "");
  const hasT = D.target !== null;
  if (hasT) {
    s("line", {x1: W - m.r, y1: m.t, x2: W - m.r, y2: H - m.b, stroke: "#444"});
    s("text", {x: W - 14, y: H / 2, "font-size": 12, transform: `rotate(90 ${W - 14} ${H / 2})`, "text-anchor": "middle", fill: "#d62728"}, `p(${MI.tok(D.target)})`);
    [0, 0.5, 1].forEach((f) => s("text", {x: W - m.r + 4, y: Y(f, 1) + 4, "font-size": 10}, MI.fmt(f, 1)));
    if (D.baseline_prob !== null) s("line", {x1: m.l, y1: Y(D.baseline_prob, 1), x2: W - m.r, y2: Y(D.baseline_prob, 1), stroke: "#d62728", "stroke-dasharray": "2 3", "stroke-width": 1});
    line(pts.map((p) => p.target_prob), 1, "#d62728", "5 3");
  }
  const marks = [];
  const show = (i) => {
    const p = pts[i];
    const rows = [["strength s", MI.fmt(p.strength, 3)], ["KL(baseline || steered), nats", MI.fmt(p.kl, 5)], ["top token", MI.tok(p.top_token)]];
    if (hasT) {
      rows.push([`p(${MI.tok(D.target)})`, MI.fmt(p.target_prob)]);
      if (p.target_prob_diff !== null) rows.push(["Δ prob (steered − baseline)", MI.fmt(p.target_prob_diff)]);
      if (p.target_logprob_diff !== null) rows.push(["Δ log-prob, nats", MI.fmt(p.target_logprob_diff)]);
      rows.push(["Δ logit", MI.fmt(p.target_logit_diff)]);
    }
    if (p.attention !== null) rows.push(["attention on the steered keys", MI.fmt(p.attention)]);
    info.replaceChildren(MI.el("h3", {}, `point ${i + 1} of ${n}`), MI.table(["", "value"], rows.map(([a, b]) => [a, [b, "num"]])));
    info.dataset.i = i;
    marks.forEach((c, j) => c.setAttribute("stroke", j === i ? "#000" : "none"));
  };
  pts.forEach((p, i) => {
    const c = s("circle", {cx: X(p.strength), cy: Y(p.kl, kmax), r: 6, fill: "#1f77b4", "stroke-width": 2, "data-i": i, class: "pt"});
    c.addEventListener("mouseover", () => show(i)); marks.push(c);
    if (hasT) s("rect", {x: X(p.strength) - 5, y: Y(p.target_prob, 1) - 5, width: 10, height: 10, fill: "#d62728", "data-i": i, class: "pt-target"}).addEventListener("mouseover", () => show(i));
  });
  const legend = MI.el("div", {class: "legend", id: "legend"});
  legend.append(MI.el("span", {style: "color:#1f77b4"}, "● KL(baseline || steered)"));
  if (hasT) legend.append(MI.el("span", {style: "color:#d62728"}, `■ p(${MI.tok(D.target)})` + (D.baseline_prob !== null ? `, dotted: unsteered ${MI.fmt(D.baseline_prob)}` : "")));
  main.append(legend, svg);
  if (n) show(n - 1);
  side.append(info, MI.el("p", {class: "note"}, "Effects are steered − baseline. Prefer Δ log-prob and KL over the raw Δ logit."));
  MI.ready(t0);
})();
