// fusionwatch dashboard: local times, Plotly charts, live run progress. The pages work without it.
"use strict";

function localTimes(root) {
  for (const el of root.querySelectorAll("time[datetime]")) {
    const when = new Date(el.getAttribute("datetime"));
    if (Number.isNaN(when.getTime())) continue;
    el.title = when.toISOString();
    el.textContent = when.toLocaleString(undefined, {dateStyle: "medium", timeStyle: "short"});
  }
}

function drawCharts() {
  for (const el of document.querySelectorAll("[data-figure]")) {
    const figure = JSON.parse(document.getElementById(el.dataset.figure).textContent);
    Plotly.newPlot(el, figure.data, figure.layout, {responsive: true, displaylogo: false});
    // customdata[0] of every point is its commit page.
    el.on("plotly_click", (event) => {
      const point = event.points && event.points[0];
      if (point && point.customdata) window.location.assign(point.customdata[0]);
    });
    el.dataset.rendered = String(figure.data.length);
  }
}

async function followRuns() {
  const rows = [...document.querySelectorAll("tr[data-run-url]")];
  if (!rows.length) return;
  let running = false;
  for (const row of rows) {
    const reply = await fetch(row.dataset.runUrl, {headers: {accept: "application/json"}});
    if (!reply.ok) throw new Error(`${row.dataset.runUrl}: HTTP ${reply.status}`);
    const run = await reply.json();
    const bar = row.querySelector("progress");
    if (bar) bar.value = run.jobs_done + run.jobs_failed;
    const text = row.querySelector(".progress-text");
    if (text) text.textContent = `${run.jobs_done}/${run.jobs_total} done` + (run.jobs_failed ? `, ${run.jobs_failed} failed` : "");
    if (run.state === "running") running = true;
  }
  if (running) setTimeout(followRuns, 2000);
  else window.location.reload();  // the diff against the baseline is there now
}

document.addEventListener("DOMContentLoaded", () => {
  localTimes(document);
  if (window.Plotly) drawCharts();
  followRuns();
});
