// Matrix filters and sorting. Rows are read once into plain objects, so a keystroke on 2,000 rows only
// toggles `hidden`; typing is debounced so the page never stalls while a filter is being written. The filters
// and the sort live in the address (?q=...&status=fail&sort=3-desc), so a view can be shared as a link.
(function () {
  const table = document.getElementById("matrix");
  if (!table) return;
  const body = table.tBodies[0];
  const rows = Array.from(body.rows).map((tr, index) => ({
    tr,
    index,
    text: (tr.dataset.name + " " + tr.dataset.type + " " + tr.dataset.tasks).toLowerCase(),
    type: tr.dataset.type,
    tasks: tr.dataset.tasks.split(" "),
    cells: Array.from(tr.cells).slice(3).map((td) => ({ backend: td.dataset.backend, status: td.dataset.status, stage: td.dataset.stage, id: td.dataset.cell })),
  }));
  const field = (id) => document.getElementById(id);
  const count = field("f-count");
  const filters = { q: "f-text", backend: "f-backend", status: "f-status", stage: "f-stage", type: "f-type", task: "f-task", cells: "f-cells" };
  let sort = null;  // {column, descending}

  function apply() {
    const text = field("f-text").value.trim().toLowerCase();
    const backend = field("f-backend").value, status = field("f-status").value, stage = field("f-stage").value;
    const type = field("f-type").value, task = field("f-task").value;
    const wanted = new Set(field("f-cells").value.split(",").map((s) => s.trim()).filter(Boolean));
    let shown = 0;
    for (const row of rows) {
      let visible = (!text || row.text.includes(text)) && (!type || row.type === type) && (!task || row.tasks.includes(task));
      if (visible && (backend || status || stage)) {
        visible = row.cells.some((c) => (!backend || c.backend === backend) && (!status || c.status === status) && (!stage || c.stage === stage));
      }
      if (visible && wanted.size) visible = row.cells.some((c) => wanted.has(c.id));
      row.tr.hidden = !visible;
      if (visible) shown++;
    }
    count.textContent = shown + " of " + rows.length + " classes";
    remember();
  }

  function remember() {
    const params = new URLSearchParams();
    for (const [key, id] of Object.entries(filters)) if (field(id).value) params.set(key, field(id).value);
    if (sort) params.set("sort", sort.column + (sort.descending ? "-desc" : "-asc"));
    const query = params.toString();
    history.replaceState(null, "", query ? "?" + query : location.pathname);
  }

  const order = { missing: 0, crash: 1, oom: 2, timeout: 3, fail: 4, mismatch: 5, skip: 6, unavailable: 7, pass: 8, "": 9 };
  const headers = Array.from(table.tHead.rows[0].cells);
  function sortBy(column, descending) {
    sort = column === null ? null : { column, descending };
    headers.forEach((th, index) => th.setAttribute("aria-sort", sort && index === column ? (descending ? "descending" : "ascending") : "none"));
    const key = (row) => {
      if (sort === null) return row.index;
      if (column < 3) return row.tr.cells[column].textContent;
      const cell = row.cells[column - 3];
      return String(order[cell.status] ?? 9) + cell.stage;
    };
    rows.sort((a, b) => (key(a) < key(b) ? -1 : key(a) > key(b) ? 1 : 0) * (sort && descending ? -1 : 1));
    const fragment = document.createDocumentFragment();
    for (const row of rows) fragment.appendChild(row.tr);
    body.appendChild(fragment);
    remember();
  }
  headers.forEach((th, column) => {
    th.querySelector("button").addEventListener("click", () => {  // a button: Enter and Space sort too
      sortBy(column, th.getAttribute("aria-sort") === "ascending");
    });
  });

  let timer = null;
  for (const id of ["f-text", "f-cells"]) field(id).addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(apply, 80); });
  for (const id of ["f-backend", "f-status", "f-stage", "f-type", "f-task"]) field(id).addEventListener("change", apply);
  field("f-clear").addEventListener("click", () => { for (const id of Object.values(filters)) field(id).value = ""; sortBy(null); apply(); });

  const params = new URLSearchParams(location.search);
  for (const [key, id] of Object.entries(filters)) if (params.get(key)) field(id).value = params.get(key);
  const sorted = /^(\d+)-(asc|desc)$/.exec(params.get("sort") || "");
  if (sorted && headers[+sorted[1]]) sortBy(+sorted[1], sorted[2] === "desc");
  apply();
  window.exportSweepMatrix = { apply, rows: rows.length };  // lets the browser test time a filter pass
})();
