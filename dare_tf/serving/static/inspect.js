// The inspect page (dare_tf.serving.inspect): draws /api/users/<id> with Plotly.
"use strict";

const models = JSON.parse(document.body.dataset.models);
const KEPT = [{color: "#d62728", symbol: "circle-open"}, {color: "#1f77b4", symbol: "square-open"}];
let view = null;

function element(id) { return document.getElementById(id); }

function say(text, error) {
  const message = element("message");
  message.textContent = text;
  message.className = error ? "error" : "";
}

function cell(row, text, header) {
  const c = document.createElement(header ? "th" : "td");
  c.textContent = text;
  row.appendChild(c);
}

function when(seconds) { return new Date(seconds * 1000).toISOString().replace(".000Z", "Z"); }

// The timeline's x of behaviour i: its time, or its place where a click's time is
// unknown (0: a click loaded from a dataset prepared without --time_gap), so that a
// live click among such clicks does not stretch the axis back to 1970.
function timed() {
  const t = view.history.times;
  return t.length > 0 && t.every(x => x > 0);
}

// A category's name on the axis, cut to fit beside the chart (the whole name in the hover).
const AXIS_NAME = 24;
function axisName(c) { return c.length > AXIS_NAME ? c.slice(0, AXIS_NAME - 1) + "\u2026" : c; }

function xOf(i) { return timed() ? when(view.history.times[i]) : i; }

function behaviour(i) {
  const h = view.history;
  return `#${i} item ${h.items[i]}, category ${h.categories[i]}, ` + (h.times[i] > 0 ? when(h.times[i]) : "time unknown");
}

function clear() {
  view = null;
  for (const id of ["timeline", "attention"]) Plotly.purge(element(id));
  for (const id of ["history-summary", "shared", "candidate-title"]) element(id).textContent = "";
  element("recommendations").querySelector("thead").replaceChildren();
  element("recommendations").querySelector("tbody").replaceChildren();
  element("categories").replaceChildren();
}

function timelineTraces(row) {
  const h = view.history;
  const all = {
    type: "scatter", mode: "markers", name: "history",
    x: h.items.map((_, i) => xOf(i)), y: h.categories.map(String), customdata: h.items.map((_, i) => i),
    text: h.items.map((_, i) => behaviour(i)), hoverinfo: "text",
    marker: {size: 6, color: h.categories, colorscale: "Turbo", opacity: 0.55},
  };
  const kept = row ? row.rankers.map((ranker, m) => ({
    type: "scatter", mode: "markers", name: `kept by ${models[m]}`,
    x: ranker.kept.map(k => xOf(k.index)), y: ranker.kept.map(k => String(h.categories[k.index])),
    customdata: ranker.kept.map(k => k.index),
    text: ranker.kept.map(k => `${behaviour(k.index)}<br>weight ${k.weight.toFixed(4)} (${models[m]})`),
    hoverinfo: "text",
    marker: {size: 13 + 4 * m, symbol: KEPT[m].symbol, line: {width: 2, color: KEPT[m].color}, color: KEPT[m].color},
  })) : [];
  return [all, ...kept];
}

function drawTimeline(row) {
  const names = [...new Set(view.history.categories.map(String))];
  const unknown = view.history.times.filter(x => !(x > 0)).length;
  Plotly.react(element("timeline"), timelineTraces(row), {
    margin: {t: 10, r: 10, b: 40, l: 60},
    xaxis: {title: {text: timed() ? "time" : `click, oldest first (${unknown} of the clicks have no time in the store)`}},
    yaxis: {title: {text: "category"}, type: "category", automargin: true, tickmode: "array", tickvals: names,
            ticktext: names.map(axisName)},
    legend: {orientation: "h"}, hovermode: "closest",
  }, {responsive: true, displaylogo: false});
}

function drawTable() {
  const head = document.createElement("tr");
  const columns = ["rank", "item", "category", "source", "retrieval rank", `P(click) ${models[0]}`];
  if (models.length > 1) columns.push(`P(click) ${models[1]}`, `rank by ${models[1]}`);
  columns.forEach(c => cell(head, c, true));
  element("recommendations").querySelector("thead").replaceChildren(head);
  const body = element("recommendations").querySelector("tbody");
  body.replaceChildren(...view.recommendations.map((r, i) => {
    const tr = document.createElement("tr");
    tr.dataset.row = i;
    [i + 1, r.item, r.category, r.source, r.retrieval_rank, r.rankers[0].probability.toFixed(4)]
      .forEach(v => cell(tr, String(v)));
    if (models.length > 1) {
      cell(tr, r.rankers[1].probability.toFixed(4));
      cell(tr, String(r.rankers[1].place));
    }
    tr.addEventListener("click", () => select(i));
    return tr;
  }));
}

function drawCategories(row) {
  const table = element("categories");
  const head = document.createElement("tr");
  ["", "categories", "matching the target's"].forEach(c => cell(head, c, true));
  const target = document.createElement("tr");
  ["target", String(row.category), ""].forEach(c => cell(target, c));
  const rows = [head, target];
  row.rankers.forEach((ranker, m) => {
    const counts = new Map();
    ranker.kept.forEach(k => {
      const c = view.history.categories[k.index];
      counts.set(c, (counts.get(c) || 0) + 1);
    });
    const tr = document.createElement("tr");
    cell(tr, `kept by ${models[m]}`);
    const list = document.createElement("td");
    [...counts.entries()].sort((a, b) => b[1] - a[1]).forEach(([c, n], j) => {
      const span = document.createElement("span");
      span.textContent = `${j ? ", " : ""}${c} ×${n}`;
      if (c === row.category) span.className = "match";
      list.appendChild(span);
    });
    tr.appendChild(list);
    cell(tr, `${counts.get(row.category) || 0} of ${ranker.kept.length}`);
    rows.push(tr);
  });
  table.replaceChildren(...rows);
}

function select(i) {
  const row = view.recommendations[i];
  element("recommendations").querySelectorAll("tbody tr").forEach(tr =>
    tr.classList.toggle("selected", Number(tr.dataset.row) === i));
  element("candidate-title").textContent =
    `Candidate ${i + 1}: item ${row.item}, category ${row.category} (proposed by ${row.source})`;
  drawTimeline(row);
  Plotly.react(element("attention"), row.rankers.map((ranker, m) => ({
    type: "bar", name: models[m], x: ranker.kept.map(k => `#${k.index}`), y: ranker.kept.map(k => k.weight),
    customdata: ranker.kept.map(k => k.index), text: ranker.kept.map(k => behaviour(k.index)),
    hoverinfo: "text+y", textposition: "none", marker: {color: KEPT[m].color},
  })), {margin: {t: 10, r: 10, b: 60, l: 50}, xaxis: {title: {text: "kept behaviour (#place in the history)"},
                                                        type: "category"}, yaxis: {title: {text: "attention weight"}}, barmode: "group",
        legend: {orientation: "h"}}, {responsive: true, displaylogo: false});
  drawCategories(row);
  if (models.length > 1) {
    const first = new Set(row.rankers[0].kept.map(k => k.index));
    const shared = row.rankers[1].kept.filter(k => first.has(k.index)).length;
    element("shared").textContent = `${models[0]} ranks it ${row.rankers[0].place}, ${models[1]} ` +
      `${row.rankers[1].place} of ${view.candidates}; they kept ${shared} behaviours in common ` +
      `(of ${row.rankers[0].kept.length} and ${row.rankers[1].kept.length}).`;
  }
  document.body.dataset.selected = i;
}

async function load(user) {
  const url = new URL(window.location);
  url.searchParams.set("user", user);
  window.history.replaceState(null, "", url);
  say(`reading user ${user}…`, false);
  delete document.body.dataset.status;
  let response, data;
  try {
    response = await fetch(`api/users/${encodeURIComponent(user)}`);
    data = await response.json();
  } catch (e) {
    clear();
    say(`the page's own server does not answer (${e.message}); is python -m serving.inspect still running?`, true);
    document.body.dataset.status = "unreachable";
    return;
  }
  if (!response.ok) {
    clear();
    say(data.error, true);
  } else {
    view = data;
    const h = data.history;
    element("history-summary").textContent = `(${h.items.length} clicks` +
      (timed() ? `, ${when(h.times[0])} to ${when(h.times[h.times.length - 1])})` : ")");
    say(`user ${data.user}: ${data.recommendations.length} of ${data.candidates} retrieved candidates, ` +
        `ranked by ${models[0]}` + [data.unknown, ...data.notes].filter(Boolean).map(n => `; ${n}`).join(""), false);
    drawTable();
    select(0);
  }
  document.body.dataset.status = response.status;
}

element("user-form").addEventListener("submit", event => {
  event.preventDefault();
  load(element("user-id").value.trim());
});
const initial = new URL(window.location).searchParams.get("user");
if (initial) {
  element("user-id").value = initial;
  load(initial);
}
