/* tracealyze report: hands each embedded figure spec to plotly.js. No chart drawing here,
 * only shared styling and the heatmap hover text (computed here to keep the page small). */
(function () {
  "use strict";
  var data = JSON.parse(document.getElementById("tz-data").textContent);

  var AXIS = { gridcolor: "#eef2f7", linecolor: "#cbd5e1", zeroline: false, ticks: "outside",
               tickcolor: "#cbd5e1", automargin: true, title: { font: { size: 12, color: "#475569" } } };
  var BASE = {
    font: { family: "system-ui, -apple-system, 'Segoe UI', Roboto, Arial, sans-serif", size: 12,
            color: "#1e293b" },
    paper_bgcolor: "#ffffff", plot_bgcolor: "#ffffff",
    margin: { l: 64, r: 24, t: 44, b: 52 },
    height: 340, hovermode: "closest",
    hoverlabel: { bgcolor: "#0f172a", bordercolor: "#0f172a", font: { color: "#f8fafc", size: 12 } },
    legend: { orientation: "h", x: 0, y: 1.0, xanchor: "left", yanchor: "bottom",
              bgcolor: "rgba(255,255,255,0)", font: { size: 11 } },
    xaxis: AXIS, yaxis: AXIS
  };
  var CONFIG = { responsive: true, displaylogo: false, scrollZoom: false,
                 modeBarButtonsToRemove: ["lasso2d", "select2d"] };

  function isObj(v) { return v && typeof v === "object" && !Array.isArray(v); }
  function merge(a, b) {
    var out = {}, k;
    for (k in a) { if (Object.prototype.hasOwnProperty.call(a, k)) { out[k] = a[k]; } }
    for (k in b) {
      if (Object.prototype.hasOwnProperty.call(b, k)) {
        out[k] = isObj(out[k]) && isObj(b[k]) ? merge(out[k], b[k]) : b[k];
      }
    }
    return out;
  }

  function fmt(v) {
    if (v === 0) { return "0"; }
    var a = Math.abs(v);
    return (a >= 1e4 || a < 1e-3) ? v.toExponential(2) : v.toPrecision(3);
  }

  // Heatmap hover: (row name, norm) from the row names and log10 z, so the page does not
  // carry a second grid of strings.
  function heatmapHover(trace, names) {
    trace.customdata = trace.z.map(function (row, i) {
      var name = names[Math.min(i, names.length - 1)];
      return row.map(function (z) {
        if (z === null) { return [name, "no data"]; }
        return [name, z <= -29 ? "0" : fmt(Math.pow(10, z))];
      });
    });
  }

  data.charts.forEach(function (chart) {
    var el = document.getElementById("plot-" + chart.anchor);
    if (!el) { return; }
    var fig = chart.figure;
    if (chart.extra && chart.extra.names) {
      fig.data.forEach(function (t) { if (t.type === "heatmap") { heatmapHover(t, chart.extra.names); } });
    }
    var title = { text: el.getAttribute("data-title"), x: 0, xanchor: "left", y: 0.98,
                  yanchor: "top", font: { size: 15, color: "#0f172a" } };
    var layout = merge(merge(BASE, { title: title }), fig.layout);
    if (!fig.layout.hovermode && fig.data.some(function (t) {
      return t.type === "scatter" && (t.mode || "").indexOf("lines") >= 0;
    })) {
      // line charts: hovering anywhere above a step shows the values there (TensorBoard-like)
      layout.hovermode = "x";
    }
    if (layout.updatemenus) {
      // the linear/log switch takes the top right: legend goes under the plot
      layout.legend = merge(layout.legend, { x: 0, y: -0.2, yanchor: "top" });
      layout.margin = merge(layout.margin, { b: 64 });
    } else {
      // the legend sits on the right of the title line
      layout.legend = merge(layout.legend, { x: 1, xanchor: "right" });
    }
    try {
      Plotly.newPlot(el, fig.data, layout, CONFIG);
    } catch (err) {
      el.textContent = "This chart could not be drawn: " + err;
      el.className += " plot-error";
      throw err;
    }
  });
})();
