/* tracealyze fleet page: sort the runs table by a column (click its header), filter it by
 * text and by worst severity. Rows carry their sort keys in data-* attributes. */
(function () {
  "use strict";
  var table = document.getElementById("runs-table");
  if (!table) { return; }
  var body = table.tBodies[0];
  var rows = Array.prototype.slice.call(body.rows);
  var text = document.getElementById("filter-text");
  var sev = document.getElementById("filter-severity");
  var count = document.getElementById("shown-count");

  function key(row, col) {
    var v = row.cells[col].getAttribute("data-key");
    if (v === null) { v = row.cells[col].textContent; }
    var n = parseFloat(v);
    return isNaN(n) || /[^0-9eE+\-.]/.test(v) ? v.toLowerCase() : n;
  }

  Array.prototype.forEach.call(table.tHead.rows[0].cells, function (th, col) {
    th.addEventListener("click", function () {
      var asc = th.getAttribute("data-dir") !== "asc";
      Array.prototype.forEach.call(table.tHead.rows[0].cells, function (o) { o.removeAttribute("data-dir"); });
      th.setAttribute("data-dir", asc ? "asc" : "desc");
      rows.sort(function (a, b) {
        var x = key(a, col), y = key(b, col);
        if (x === y) { return 0; }
        if (typeof x !== typeof y) { return (typeof x === "number" ? -1 : 1) * (asc ? 1 : -1); }
        return (x < y ? -1 : 1) * (asc ? 1 : -1);
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });

  function filter() {
    var q = (text.value || "").toLowerCase(), s = sev.value, shown = 0;
    rows.forEach(function (r) {
      var ok = (!q || r.textContent.toLowerCase().indexOf(q) >= 0) &&
               (!s || r.getAttribute("data-severity") === s);
      r.style.display = ok ? "" : "none";
      if (ok) { shown += 1; }
    });
    count.textContent = shown;
  }
  text.addEventListener("input", filter);
  sev.addEventListener("change", filter);
})();
