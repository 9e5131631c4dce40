// Sorts a table.sortable by the clicked column (numbers by data-value, text otherwise).
"use strict";
document.addEventListener("DOMContentLoaded", () => {
  for (const table of document.querySelectorAll("table.sortable")) {
    const headers = Array.from(table.querySelectorAll("thead th"));
    headers.forEach((header, column) => {
      header.addEventListener("click", () => {
        const ascending = header.getAttribute("aria-sort") !== "ascending";
        headers.forEach((h) => h.removeAttribute("aria-sort"));
        header.setAttribute("aria-sort", ascending ? "ascending" : "descending");
        const numeric = header.dataset.type === "number";
        const body = table.tBodies[0];
        const key = (row) => {
          const value = row.cells[column].dataset.value ?? row.cells[column].textContent;
          return numeric ? Number(value) : value.toLowerCase();
        };
        const rows = Array.from(body.rows).sort((a, b) => {
          const x = key(a), y = key(b);
          return (x < y ? -1 : x > y ? 1 : 0) * (ascending ? 1 : -1);
        });
        body.append(...rows);
      });
    });
  }
});
