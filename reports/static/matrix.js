// Matrix filters and sorting. Rows are read once into plain objects, so a keystroke on 2,000 rows only
// toggles `hidden`; typing is debounced so the page never stalls while a filter is being written.
(function () {
  const table = document.getElementById("matrix");
  if (!table) return;
  const body = table.tBodies[0];
  const rows = Array.from(body.rows).map((tr) => ({
    tr,
    text: (tr.dataset.name + " " + tr.dataset.type + " " + tr.dataset.tasks).toLowerCase(),
    type: tr.dataset.type,
    tasks: tr.dataset.tasks.split(" "),
    cells: Array.from(tr.cells).slice(3).map((td) => ({ backend: td.dataset.backend, status: td.dataset.status, stage: td.dataset.stage })),
  }));
  const field = (id) => document.getElementById(id);
  const count = field("f-count");

  function apply() {
    const text = field("f-text").value.trim().toLowerCase();
    const backend = field("f-backend").value, status = field("f-status").value, stage = field("f-stage").value;
    const type = field("f-type").value, task = field("f-task").value;
    let shown = 0;
    for (const row of rows) {
      let visible = (!text || row.text.includes(text)) && (!type || row.type === type) && (!task || row.tasks.includes(task));
      if (visible && (backend || status || stage)) {
        visible = row.cells.some((c) => (!backend || c.backend === backend) && (!status || c.status === status) && (!stage || c.stage === stage));
      }
      row.tr.hidden = !visible;
      if (visible) shown++;
    }
    count.textContent = shown + " of " + rows.length + " classes";
  }

  let timer = null;
  field("f-text").addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(apply, 80); });
  for (const id of ["f-backend", "f-status", "f-stage", "f-type", "f-task"]) field(id).addEventListener("change", apply);

  const order = { pass: 0, mismatch: 1, fail: 2, crash: 3, timeout: 4, oom: 5, skip: 6, unavailable: 7, missing: 8 };
  Array.from(table.tHead.rows[0].cells).forEach((th, column) => {
    th.addEventListener("click", () => {
      const descending = th.classList.contains("sorted-asc");
      table.tHead.querySelectorAll("th").forEach((h) => h.classList.remove("sorted-asc", "sorted-desc"));
      th.classList.add(descending ? "sorted-desc" : "sorted-asc");
      const key = (row) => {
        if (column < 3) return row.tr.cells[column].textContent;
        const cell = row.cells[column - 3];
        return String(order[cell.status] ?? 9) + cell.stage;
      };
      rows.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0) * (descending ? -1 : 1));
      const fragment = document.createDocumentFragment();
      for (const row of rows) fragment.appendChild(row.tr);
      body.appendChild(fragment);
    });
  });

  const params = new URLSearchParams(location.search);
  if (params.get("q")) field("f-text").value = params.get("q");
  apply();
  window.exportSweepMatrix = { apply, rows: rows.length };  // lets the browser test time a filter pass
})();
