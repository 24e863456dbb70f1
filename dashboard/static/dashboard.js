// The Fedge dashboard page: the run list, and one or two runs side by side, refreshed every second from the
// server's JSON (/api/runs, /api/run). Charts are uPlot (vendored: VENDOR.json). Reads only; the page keeps each
// run's rows and asks for the ones it does not have (since, generation), taking them all again after a resume
// rewrote the file. window.fedgeCharts and window.fedgeRows expose what is drawn, for the browser tests.
"use strict";
(function () {
  const POLL_MS = 1000;
  const LIST_POLL_MS = 5000;
  const shown = {};          // run id -> {rows, total, generation, headline, el, charts, agentsKey}
  const ticked = new Set();  // run ids ticked in the list, for side by side
  let page = 1;
  let timer = null;
  let routed = 0;            // bumped by every route: a refresh loop of an earlier route stops at its next step
  // the figure a run is judged by: the first of these its rows have (classification, multi-label, regression)
  const HEADLINES = [["test_accuracy", "accuracy", true], ["test_exact_match", "exact match", true],
                     ["test_label_accuracy", "label accuracy", true], ["test_mse", "mse", false], ["test_mae", "mae", false]];
  window.fedgeCharts = {};
  window.fedgeRows = {};

  const $ = (selector, root) => (root || document).querySelector(selector);
  const num = (v) => (typeof v === "number" && isFinite(v) ? v : null);
  const dash = (v) => (v === null || v === undefined || v === "" ? "–" : String(v));
  const bytes = (n) => (num(n) === null ? "–" : n >= 1e9 ? (n / 1e9).toFixed(2) + " GB" : n >= 1e6 ?
    (n / 1e6).toFixed(2) + " MB" : n >= 1e3 ? (n / 1e3).toFixed(1) + " kB" : n + " B");
  const percent = (v) => (num(v) === null ? "–" : (100 * v).toFixed(2) + " %");
  const duration = (s) => (num(s) === null ? "–" : s < 90 ? Math.round(s) + " s" : (s / 60).toFixed(1) + " min");

  async function getJson(url) {
    const response = await fetch(url, { cache: "no-store", credentials: "same-origin" });
    if (!response.ok) throw new Error(url + ": HTTP " + response.status);
    return response.json();
  }

  function live(ok, why) {
    const mark = $("#live");
    mark.textContent = ok ? "live" : "not updating: " + why;
    mark.className = ok ? "" : "stale";
  }

  function cell(row, value, numeric) {
    const td = document.createElement("td");
    td.textContent = dash(value);
    if (numeric) td.className = "num";
    row.appendChild(td);
    return td;
  }

  // ------------------------------------------------------------------------------------------ the run list
  async function showList(route) {
    $("#list").hidden = false;
    $("#runs-shown").hidden = true;
    try {
      const data = await getJson("/api/runs?page=" + page);
      if (route !== routed) return;
      page = data.page;
      $("#where").textContent = data.root;
      $("#page").textContent = "page " + data.page + " of " + data.pages + " (" + data.total + " runs)";
      $("#prev").disabled = data.page <= 1;
      $("#next").disabled = data.page >= data.pages;
      const body = $("#runs tbody");
      body.replaceChildren();
      for (const run of data.runs) {
        const row = document.createElement("tr");
        row.dataset.run = run.id;
        const tick = document.createElement("input");
        tick.type = "checkbox";
        tick.checked = ticked.has(run.id);
        tick.addEventListener("click", (event) => {
          event.stopPropagation();
          if (tick.checked) ticked.add(run.id); else ticked.delete(run.id);
          $("#compare").disabled = ticked.size !== 2;
        });
        row.appendChild(document.createElement("td")).appendChild(tick);
        cell(row, run.id);
        cell(row, run.algorithm);
        cell(row, run.state).className = "state-" + String(run.state).replace(/ /g, "-");
        cell(row, run.round + (run.rounds ? " / " + run.rounds : ""), true);
        const figure = HEADLINES.find((h) => h[0] === run.headline);
        cell(row, figure ? figure[1] + " " + (figure[2] ? percent(run.headline_value) : dash(run.headline_value)) : "–", true);
        cell(row, run.state === "running" ? duration(run.eta_s) : "–", true);
        row.addEventListener("click", () => { location.hash = "run=" + encodeURIComponent(run.id); });
        body.appendChild(row);
      }
      live(true);
    } catch (error) {
      if (route !== routed) return;
      live(false, error.message);
    }
    timer = setTimeout(() => showList(route), LIST_POLL_MS);
  }

  // ------------------------------------------------------------------------------------------ a run
  const ROUNDS = { label: "round", incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000] };
  const CHARTS = {
    accuracy: {
      data: (rows, h) => [rows.map((r) => r.round), rows.map((r) => num(r[h[0]])), rows.map((r) => num(r.test_loss))],
      series: (h) => [figureSeries(h), { label: "loss", stroke: "#e76f51", scale: "loss" }],
      axes: (h) => [ROUNDS, figureAxis(h), { scale: "loss", side: 1, grid: { show: false } }],
    },
    accuracy_bytes: {
      data: (rows, h) => {
        let sum = 0;
        const x = rows.map((r) => (sum += (num(r.bytes_down) || 0) + (num(r.bytes_up) || 0)) / 1e6);
        return [x, rows.map((r) => num(r[h[0]]))];
      },
      series: (h) => [figureSeries(h)],
      axes: (h) => [{ label: "cumulative MB, down + up" }, figureAxis(h)],
    },
    bytes: {
      data: (rows) => [rows.map((r) => r.round), rows.map((r) => num(r.bytes_down)), rows.map((r) => num(r.bytes_up))],
      series: () => [{ label: "down", stroke: "#457b9d", value: (u, v) => bytes(v) },
                     { label: "up", stroke: "#2a9d8f", value: (u, v) => bytes(v) }],
      axes: () => [ROUNDS, { size: 80, values: (u, vs) => vs.map((v) => bytes(v)) }],
    },
    epsilon: {
      data: (rows) => [rows.map((r) => r.round), rows.map((r) => num(r.epsilon))],
      series: () => [{ label: "epsilon", stroke: "#6d597a" }],
      axes: () => [ROUNDS, {}],
    },
  };

  function figureSeries(h) {
    return { label: h[1], stroke: "#1d3557", scale: "figure", value: (u, v) => (h[2] ? percent(v) : dash(v)) };
  }

  function figureAxis(h) {
    return { scale: "figure", values: (u, vs) => vs.map((v) => (h[2] ? (100 * v).toFixed(0) + "%" : String(v))) };
  }

  function drawChart(run, name, container, rows) {
    const spec = CHARTS[name];
    const data = spec.data(rows, run.headline);
    const chart = run.charts[name];
    if (chart && chart.headline === run.headline) {
      chart.setData(data);
      return;
    }
    if (chart) chart.destroy();  // the run's headline figure changed: new labels
    const width = Math.max(320, container.clientWidth - 8);
    const options = {
      width: width, height: 220, scales: { x: { time: false } },
      series: [{}, ...spec.series(run.headline).map((s) => Object.assign({ spanGaps: true, points: { show: true, size: 4 } }, s))],
      axes: spec.axes(run.headline),
    };
    run.charts[name] = new uPlot(options, data, container);
    run.charts[name].headline = run.headline;
  }

  function showState(run, detail) {
    const summary = detail.summary;
    const status = detail.status || {};
    const parts = [summary.state, "round " + summary.round + (summary.rounds ? " / " + summary.rounds : ""),
                   dash(summary.algorithm)];
    if (summary.state === "running") parts.push("ETA " + duration(summary.eta_s));
    if (status.phase && status.phase !== summary.state) parts.push(status.phase);
    if (num(status.updated_at) !== null) parts.push("updated " + duration(Date.now() / 1000 - status.updated_at) + " ago");
    const privacy = detail.privacy;
    if (privacy && num(privacy.epsilon) !== null) parts.push("epsilon " + privacy.epsilon.toPrecision(4) + " at delta " + privacy.delta);
    const line = $(".run-state", run.el);
    line.textContent = parts.join(" · ");
    line.className = "run-state state-" + String(summary.state).replace(/ /g, "-");
  }

  function showAgents(run, detail) {
    if (detail.agents === null) return;  // unchanged since the table the page holds
    run.agentsKey = detail.agents_key;
    const body = $(".agents tbody", run.el);
    const rows = document.createDocumentFragment();
    for (const a of detail.agents) {
      const row = document.createElement("tr");
      cell(row, a.client_id);
      cell(row, a.index, true);
      cell(row, a.connected ? "yes" : "no");
      cell(row, duration(a.seconds_since_seen), true);
      cell(row, duration(a.round_s), true);
      cell(row, bytes(a.bytes_down), true);
      cell(row, bytes(a.bytes_up), true);
      cell(row, a.last_round, true);
      cell(row, a.rejections, true);
      cell(row, a.declined, true);
      cell(row, a.clipped, true);
      cell(row, a.capped, true);
      cell(row, a.quarantined ? "yes" : "no");
      rows.appendChild(row);
    }
    body.replaceChildren(rows);
    $(".agents-note", run.el).textContent = detail.agents.length < detail.agents_total ?
      "(the first " + detail.agents.length + " of " + detail.agents_total + ")" : "(" + detail.agents_total + ")";
  }

  function showUpdates(run, detail) {
    const body = $(".updates tbody", run.el);
    const rows = document.createDocumentFragment();
    for (const u of detail.updates.slice().reverse()) {
      const row = document.createElement("tr");
      cell(row, u.round, true);
      cell(row, u.client_id);
      cell(row, u.available === false ? "declined: " + dash(u.unavailable_reason) : u.num_samples, u.available !== false);
      cell(row, bytes(u.bytes_down), true);
      cell(row, bytes(u.bytes_up), true);
      cell(row, num(u.train_loss) === null ? "–" : u.train_loss.toFixed(4), true);
      cell(row, num(u.train_s) === null ? "–" : u.train_s.toFixed(2), true);
      cell(row, [u.clipped ? "clipped" : "", u.capped ? "capped" : ""].filter(Boolean).join(", "));
      rows.appendChild(row);
    }
    body.replaceChildren(rows);
  }

  function apply(run, detail) {
    run.rows = detail.reset ? detail.rows : run.rows.concat(detail.rows);
    run.total = detail.rows_total;
    run.generation = detail.generation;
    window.fedgeRows[detail.id] = run.rows;
    showState(run, detail);
    run.headline = HEADLINES.find((h) => run.rows.some((r) => num(r[h[0]]) !== null)) || HEADLINES[0];
    $('[data-chart="accuracy"] h3', run.el).textContent = "Test " + run.headline[1] + " and loss per round";
    $('[data-chart="accuracy_bytes"] h3', run.el).textContent = "Test " + run.headline[1] +
      " against cumulative bytes (down + up)";
    const epsilon = $('[data-chart="epsilon"]', run.el);
    epsilon.hidden = !run.rows.some((r) => num(r.epsilon) !== null);
    const rows = run.rows.filter((r) => num(r.round) !== null).sort((a, b) => a.round - b.round);
    for (const container of run.el.querySelectorAll(".chart")) {
      if (!container.hidden) drawChart(run, container.dataset.chart, container, rows);
    }
    window.fedgeCharts[detail.id] = run.charts;
    showAgents(run, detail);
    showUpdates(run, detail);
  }

  async function pollRuns(route) {
    try {
      await Promise.all(Object.entries(shown).map(async ([id, run]) => {
        const detail = await getJson("/api/run?id=" + encodeURIComponent(id) + "&since=" + run.total +
                                     "&generation=" + run.generation + "&agents=" + encodeURIComponent(run.agentsKey));
        if (route === routed) apply(run, detail);
      }));
      if (route !== routed) return;
      live(true);
    } catch (error) {
      if (route !== routed) return;
      live(false, error.message);
    }
    timer = setTimeout(() => pollRuns(route), POLL_MS);
  }

  function showRuns(ids, route) {
    $("#list").hidden = true;
    const area = $("#runs-shown");
    area.hidden = false;
    area.replaceChildren();
    for (const key of Object.keys(shown)) {
      for (const chart of Object.values(shown[key].charts)) chart.destroy();
      delete shown[key];
    }
    for (const id of ids) {
      const el = $("#run-template").content.firstElementChild.cloneNode(true);
      el.dataset.run = id;
      $(".run-id", el).textContent = id;
      area.appendChild(el);
      shown[id] = { rows: [], total: 0, generation: -1, headline: HEADLINES[0], el: el, charts: {}, agentsKey: "" };
    }
    pollRuns(route);
  }

  function route() {
    clearTimeout(timer);
    routed += 1;
    const ids = [...new Set(new URLSearchParams(location.hash.slice(1)).getAll("run"))].slice(0, 2);
    if (ids.length) showRuns(ids, routed); else showList(routed);
  }

  function turnPage(step) {
    page += step;
    clearTimeout(timer);
    routed += 1;
    showList(routed);
  }

  $("#prev").addEventListener("click", () => turnPage(-1));
  $("#next").addEventListener("click", () => turnPage(1));
  $("#compare").addEventListener("click", () => {
    location.hash = [...ticked].map((id) => "run=" + encodeURIComponent(id)).join("&");
  });
  $("#home").addEventListener("click", (event) => { event.preventDefault(); location.hash = ""; });
  window.addEventListener("hashchange", route);
  route();
})();
