// Sortable tables: a click on a heading with data-sort sorts the rows by that column
// (a cell's data-value when it has one, else its text). No framework, no inline script (CSP).
"use strict";
(function () {
  function key(cell, numeric) {
    const raw = cell ? (cell.dataset.value !== undefined ? cell.dataset.value : cell.textContent.trim()) : "";
    if (!numeric) return raw.toLowerCase();
    const n = parseFloat(raw);
    return Number.isNaN(n) ? -Infinity : n;
  }
  function sortBy(table, th) {
    const index = Array.prototype.indexOf.call(th.parentNode.children, th);
    const numeric = th.dataset.sort === "number";
    const ascending = th.getAttribute("aria-sort") !== "ascending";
    table.querySelectorAll("th[aria-sort]").forEach(function (h) { h.removeAttribute("aria-sort"); });
    th.setAttribute("aria-sort", ascending ? "ascending" : "descending");
    const body = table.tBodies[0];
    const rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      const x = key(a.cells[index], numeric), y = key(b.cells[index], numeric);
      return (x < y ? -1 : x > y ? 1 : 0) * (ascending ? 1 : -1);
    });
    rows.forEach(function (row) { body.appendChild(row); });
  }
  document.querySelectorAll("table.sortable").forEach(function (table) {
    table.querySelectorAll("th[data-sort]").forEach(function (th) {
      th.tabIndex = 0;
      th.addEventListener("click", function () { sortBy(table, th); });
      th.addEventListener("keydown", function (e) { if (e.key === "Enter") sortBy(table, th); });
    });
  });
})();
