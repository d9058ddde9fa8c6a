// Draws the charts of a testbed dashboard as inline SVG. Inlined into the page by
// testbed/report/dashboard.py; reads the JSON in <script id="charts">, a list of charts shaped
// like testbed.report.charts.Chart. Every point carries its numbers (data-x, data-y), so a test
// can read the values back from the DOM.
(function () {
  "use strict";
  var NS = "http://www.w3.org/2000/svg";
  var W = 640, H = 340, L = 64, R = 16, T = 16, B = 44;
  var COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b",
                "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

  function el(name, attrs, parent) {
    var node = document.createElementNS(NS, name);
    Object.keys(attrs).forEach(function (k) { node.setAttribute(k, attrs[k]); });
    if (parent) { parent.appendChild(node); }
    return node;
  }

  // a series named "regression" (the index's flagged values) is always drawn in red
  function colorOf(name, k) { return name === "regression" ? "#d00020" : COLORS[k % COLORS.length]; }

  function finite(v) { return typeof v === "number" && isFinite(v); }

  function extent(chart) {
    var xs = [], ys = [];
    chart.series.forEach(function (s) {
      s.x.forEach(function (x, i) {
        if (finite(s.y[i])) { xs.push(x); ys.push(s.y[i]); }
        if (s.low && finite(s.low[i])) { ys.push(s.low[i]); }
        if (s.high && finite(s.high[i])) { ys.push(s.high[i]); }
      });
    });
    chart.refs.forEach(function (r) { ys.push(r.y); });
    if (!xs.length) { xs = [0, 1]; }
    if (!ys.length) { ys = [0, 1]; }
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var y0 = Math.min(0, Math.min.apply(null, ys)), y1 = Math.max.apply(null, ys);
    if (x0 === x1) { x0 -= 1; x1 += 1; }
    if (y0 === y1) { y1 = y0 + 1; }
    return { x0: x0, x1: x1, y0: y0, y1: y1 + (y1 - y0) * 0.05 };
  }

  function ticks(a, b, n, integers) {
    var step = Math.pow(10, Math.floor(Math.log10((b - a) / n)));
    [1, 2, 5, 10].some(function (m) {
      if ((b - a) / (step * m) <= n) { step *= m; return true; }
      return false;
    });
    if (integers) { step = Math.max(1, Math.round(step)); }
    var out = [];
    for (var v = Math.ceil(a / step) * step; v <= b + step * 1e-9; v += step) {
      out.push(Math.round(v / step) * step);
    }
    return out;
  }

  function fmt(v) {
    var a = Math.abs(v);
    if (a !== 0 && (a >= 1e5 || a < 1e-3)) { return v.toExponential(1); }
    return String(Math.round(v * 1000) / 1000);
  }

  function draw(chart, host) {
    var e = extent(chart);
    var sx = function (x) { return L + (x - e.x0) / (e.x1 - e.x0) * (W - L - R); };
    var sy = function (y) { return H - B - (y - e.y0) / (e.y1 - e.y0) * (H - T - B); };
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, role: "img",
                          "aria-label": chart.title, "class": "chart" }, host);
    ticks(e.y0, e.y1, 6).forEach(function (v) {
      el("line", { x1: L, x2: W - R, y1: sy(v), y2: sy(v), "class": "grid" }, svg);
      el("text", { x: L - 6, y: sy(v) + 4, "class": "tick", "text-anchor": "end" }, svg)
        .textContent = fmt(v);
    });
    var wholeX = chart.series.every(function (s) {
      return s.x.every(function (x) { return Math.round(x) === x; });
    });
    ticks(e.x0, e.x1, 8, wholeX).forEach(function (v) {
      el("text", { x: sx(v), y: H - B + 16, "class": "tick", "text-anchor": "middle" }, svg)
        .textContent = fmt(v);
    });
    el("line", { x1: L, x2: W - R, y1: H - B, y2: H - B, "class": "axis" }, svg);
    el("line", { x1: L, x2: L, y1: T, y2: H - B, "class": "axis" }, svg);
    el("text", { x: (L + W - R) / 2, y: H - 6, "class": "label", "text-anchor": "middle" }, svg)
      .textContent = chart.xlabel;
    el("text", { x: 14, y: (T + H - B) / 2, "class": "label", "text-anchor": "middle",
                 transform: "rotate(-90 14 " + (T + H - B) / 2 + ")" }, svg)
      .textContent = chart.ylabel;

    chart.series.forEach(function (s, k) {
      var color = colorOf(s.name, k);
      var g = el("g", { "class": "series", "data-series": s.name }, svg);
      if (s.low && s.high) {
        var upper = [], lower = [];
        s.x.forEach(function (x, i) {
          if (finite(s.low[i]) && finite(s.high[i])) {
            upper.push(sx(x) + "," + sy(s.high[i]));
            lower.unshift(sx(x) + "," + sy(s.low[i]));
          }
        });
        if (upper.length) {
          el("polygon", { points: upper.concat(lower).join(" "), fill: color,
                          "fill-opacity": 0.18, "class": "band" }, g);
        }
      }
      var pts = [];
      s.x.forEach(function (x, i) {
        if (!finite(s.y[i])) { return; }
        if (s.style === "step" && pts.length) {
          pts.push(sx(x) + "," + pts[pts.length - 1].split(",")[1]);
        }
        pts.push(sx(x) + "," + sy(s.y[i]));
      });
      if (s.style !== "points" && pts.length > 1) {
        el("polyline", { points: pts.join(" "), fill: "none", stroke: color,
                         "stroke-width": 2 }, g);
      }
      s.x.forEach(function (x, i) {
        if (!finite(s.y[i])) { return; }
        var c = el("circle", { cx: sx(x), cy: sy(s.y[i]), r: 3.5, fill: color,
                               "class": "point", "data-x": x, "data-y": s.y[i] }, g);
        el("title", {}, c).textContent = s.name + ": " + fmt(s.y[i]) + " at " + fmt(x);
      });
    });
    chart.refs.forEach(function (r, j) {
      var color = COLORS[(chart.series.length + j) % COLORS.length];
      el("line", { x1: L, x2: W - R, y1: sy(r.y), y2: sy(r.y), stroke: color,
                   "stroke-dasharray": "6 4", "class": "ref", "data-ref": r.name,
                   "data-y": r.y }, svg);
    });
    var legend = document.createElement("div");
    legend.className = "legend";
    chart.series.map(function (s) { return s.name; })
      .concat(chart.refs.map(function (r) { return r.name + " (reference)"; }))
      .forEach(function (name, k) {
        var item = document.createElement("span");
        item.style.borderColor = colorOf(name, k);
        item.textContent = name;
        legend.appendChild(item);
      });
    host.appendChild(legend);
  }

  function main() {
    var data = JSON.parse(document.getElementById("charts").textContent);
    data.forEach(function (chart) {
      var host = document.getElementById("chart-" + chart.key);
      if (host) { draw(chart, host); }
    });
    document.body.setAttribute("data-charts-drawn", String(data.length));
  }

  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", main);
  } else {
    main();
  }
})();
