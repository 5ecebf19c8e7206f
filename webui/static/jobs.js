// The job list keeps itself current: it polls GET /api/v1/jobs (the signed-in session's cookie)
// and redraws the rows in place. Plain DOM, no framework, no inline script (CSP).
"use strict";
(function () {
  const table = document.getElementById("jobs");
  if (!table) return;
  const labels = JSON.parse(table.dataset.labels || "{}");
  const every = parseInt(table.dataset.refreshMs, 10) || 2000;
  const empty = document.getElementById("jobs-empty");

  function utc(ns) {
    if (!ns) return "–";
    return new Date(ns / 1e6).toISOString().replace("T", " ").replace(/\.\d+Z$/, " UTC");
  }
  function cell(row, text, cls) {
    const td = row.insertCell();
    td.textContent = text;
    if (cls) td.className = cls;
    return td;
  }
  function draw(jobs) {
    const body = document.createElement("tbody");
    jobs.forEach(function (j) {
      const row = body.insertRow();
      row.dataset.job = j.id;
      if (j.state === "failed" || j.state === "interrupted") row.className = "sev-error";
      else if (j.state === "warnings") row.className = "sev-warning";
      const link = document.createElement("a");
      link.href = table.dataset.detail + j.id;
      link.textContent = j.id;
      row.insertCell().appendChild(link);
      cell(row, j.kind);
      cell(row, labels[j.state] || j.state, "state");
      const bar = document.createElement("progress");
      bar.max = 1;
      bar.value = j.fraction;
      row.insertCell().appendChild(bar);
      cell(row, j.actor);
      cell(row, utc(j.created_ns), "nowrap");
      cell(row, j.message || "");
    });
    table.replaceChild(body, table.tBodies[0]);
    table.hidden = jobs.length === 0;
    if (empty) empty.hidden = jobs.length !== 0;
  }
  function poll() {
    if (document.hidden) return;
    fetch(table.dataset.api, { credentials: "same-origin", headers: { Accept: "application/json" } })
      .then(function (r) { return r.ok ? r.json() : Promise.reject(r.status); })
      .then(draw)
      .catch(function () { /* signed out or the server restarting: the next round tries again */ });
  }
  setInterval(poll, every);
})();
