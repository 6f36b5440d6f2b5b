// ruled console: a small single-page app over /api/v1, with no
// dependencies and no build step. Pages are routed by the URL fragment
// (#/, #/rules, #/rules/<id>, #/executions, #/plan) so every view, filters
// included, can be bookmarked. The DOM is built with createElement, never
// from HTML strings, so no stored name can inject markup.
//
// The API token is kept in sessionStorage: it lives as long as the tab,
// is never sent by the browser on its own (no cookie, so no CSRF), and is
// sent only as a bearer header on the console's own requests.
"use strict";

(() => {
  const API = "/api/v1";
  const TOKEN_KEY = "ruled.token";
  const PAGE_SIZE = 50;
  /// Figures not carried by events (the overview's) refresh this often.
  const POLL_MS = 5000;
  /// Several events in a burst cause one reload.
  const DEBOUNCE_MS = 200;
  const STATUSES = ["requested", "scheduled", "running", "completed", "failed", "cancelled", "timed_out", "skipped"];
  const OPEN = new Set(["requested", "scheduled", "running"]);
  const RULE_STATES = ["ready", "waiting", "running", "inactive", "force_stopped", "held"];

  const main = document.getElementById("main");
  const notice = document.getElementById("notice");
  const mode = document.getElementById("mode");
  const live = document.getElementById("live");

  const state = {
    readOnly: null,
    page: null,
    reloadTimer: null,
    loading: false,
    reloadAgain: false,
    // The current page's setup: done, or under way in navigate().
    mounted: false,
    mounting: false,
    // Bumped by each navigation: a superseded one leaves the flags alone.
    navigation: 0,
    ruleNames: new Map(),
  };

  // ---- small helpers --------------------------------------------------------

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value === null || value === undefined || value === false) continue;
      if (key === "class") node.className = value;
      else if (key === "text") node.textContent = value;
      else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children.flat()) {
      if (child === null || child === undefined || child === false) continue;
      node.append(child instanceof Node ? child : document.createTextNode(String(child)));
    }
    return node;
  }

  /// Replaces a node's children, skipping the absent ones.
  function fill(node, ...children) {
    node.replaceChildren(...children.flat().filter((c) => c !== null && c !== undefined && c !== false));
  }

  function token() {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  }

  class ApiError extends Error {
    constructor(status, code, message) {
      super(message);
      this.status = status;
      this.code = code;
    }
  }

  async function api(path, options = {}) {
    const headers = { Accept: "application/json" };
    if (token()) headers.Authorization = "Bearer " + token();
    let body;
    if (options.body !== undefined) {
      headers["Content-Type"] = "application/json";
      body = JSON.stringify(options.body);
    }
    const response = await fetch(API + path, { method: options.method || "GET", headers, body, credentials: "omit" });
    const text = await response.text();
    let json = null;
    try { json = text ? JSON.parse(text) : null; } catch (_) { json = null; }
    if (!response.ok) {
      const error = (json && json.error) || {};
      throw new ApiError(response.status, error.code || "error", error.message || text || response.statusText);
    }
    return json;
  }

  /// An action failed: say what the server said, and for 401/403 what to do.
  function describeFailure(error) {
    if (!(error instanceof ApiError)) return "The request failed: " + error.message;
    if (error.status === 401) return "401 Unauthorized: the API token was refused. Check the token and enter it again. (" + error.message + ")";
    if (error.status === 403) return "403 Forbidden: this service or token may not make changes. (" + error.message + ")";
    return error.status + " " + error.code + ": " + error.message;
  }

  function show(message, kind) {
    notice.textContent = message;
    notice.className = "notice " + (kind || "");
    notice.hidden = false;
  }

  function clearNotice() {
    notice.hidden = true;
    notice.textContent = "";
  }

  const pad = (n) => String(n).padStart(2, "0");

  function utcText(iso) {
    if (!iso) return "—";
    const d = new Date(iso);
    if (isNaN(d)) return iso;
    return d.getUTCFullYear() + "-" + pad(d.getUTCMonth() + 1) + "-" + pad(d.getUTCDate()) + " " +
      pad(d.getUTCHours()) + ":" + pad(d.getUTCMinutes()) + ":" + pad(d.getUTCSeconds()) + " UTC";
  }

  const zoneFormats = new Map();
  function localText(iso, zone) {
    if (!iso || !zone) return null;
    try {
      if (!zoneFormats.has(zone)) {
        zoneFormats.set(zone, new Intl.DateTimeFormat("en-CA", {
          timeZone: zone, year: "numeric", month: "2-digit", day: "2-digit",
          hour: "2-digit", minute: "2-digit", hour12: false, timeZoneName: "short",
        }));
      }
      return zoneFormats.get(zone).format(new Date(iso)).replace(",", "") + " (" + zone + ")";
    } catch (_) {
      return null;
    }
  }

  /// A time cell: UTC, and under it the zone's wall clock when known.
  function timeCell(label, iso, zone, localOverride) {
    const local = localOverride ? localOverride + " (" + zone + ")" : localText(iso, zone);
    return el("td", { "data-label": label, class: "time" },
      el("span", { class: "utc", text: utcText(iso) }),
      local && iso ? el("span", { class: "local", text: local }) : null);
  }

  function duration(ms) {
    if (ms === null || ms === undefined || isNaN(ms)) return "—";
    if (ms < 1000) return ms + " ms";
    if (ms < 60000) return (ms / 1000).toFixed(ms < 10000 ? 2 : 1) + " s";
    const minutes = Math.floor(ms / 60000);
    return minutes + " min " + Math.round((ms % 60000) / 1000) + " s";
  }

  function badge(value, label) {
    return el("span", { class: "badge " + value, text: label || value.replace(/_/g, " ") });
  }

  function td(label, ...children) {
    return el("td", { "data-label": label }, ...children);
  }

  function table(headings, rows, emptyText) {
    if (!rows.length) return el("p", { class: "muted empty", text: emptyText });
    return el("div", { class: "table-wrap" }, el("table", { class: "data" },
      el("thead", {}, el("tr", {}, headings.map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, rows)));
  }

  function figure(label, value, field) {
    return el("div", {},
      el("span", { class: "label", text: label }),
      el("span", { class: "figure", "data-field": field, "data-value": String(value), text: String(value) }));
  }

  /// Rows per page: `limit` in the fragment, else PAGE_SIZE.
  function pageSize() {
    const limit = parseInt(params().query.get("limit") || "", 10);
    return limit >= 1 && limit <= 1000 ? limit : PAGE_SIZE;
  }

  function params() {
    const hash = location.hash.slice(1) || "/";
    const [path, query] = hash.split("?");
    return { path, query: new URLSearchParams(query || "") };
  }

  /// Filters live in the fragment: bookmarkable, and kept across reloads.
  function setQuery(path, query) {
    const text = query.toString();
    history.replaceState(null, "", "#" + path + (text ? "?" + text : ""));
  }

  // ---- token and mode ---------------------------------------------------------

  /// Why actions are off, or null when they are on.
  function actionsBlocked() {
    if (state.readOnly) return "Read-only: this service has no API_TOKEN, so it refuses every change.";
    if (!token()) return "Enter the API token above to run, stop or cancel.";
    return null;
  }

  function renderMode() {
    mode.classList.toggle("read-only", !!state.readOnly);
    if (state.readOnly === null) mode.textContent = "";
    else if (state.readOnly) mode.textContent = "Read-only console: the service has no API_TOKEN set, so actions are disabled.";
    else if (token()) mode.textContent = "Token entered for this tab; actions are enabled.";
    else mode.textContent = "Viewing without a token: enter the API token to act.";
    refreshWhyLines();
  }

  /// A button for a change; disabled with its reason when changes are off.
  function actionButton(label, onAction, extra = {}) {
    const why = actionsBlocked();
    const button = el("button", {
      type: "button", class: extra.class || "", disabled: !!why, title: why || extra.title || label,
      "aria-label": extra.ariaLabel || label, "data-action": extra.action || label.toLowerCase().replace(/\s+/g, "-"),
    }, label);
    button.addEventListener("click", async () => {
      if (actionsBlocked()) return;
      button.disabled = true;
      clearNotice();
      try {
        const message = await onAction();
        if (message) show(message, "ok");
      } catch (error) {
        show(describeFailure(error), "error");
      } finally {
        button.disabled = !!actionsBlocked();
        scheduleReload(0);
      }
    });
    return button;
  }

  /// Why actions are off, kept current by renderMode: a token entered
  /// later must not leave a page saying to enter one.
  function whyLine() {
    const why = actionsBlocked();
    return el("p", { class: "why", "data-why": "actions", hidden: !why, text: why || "" });
  }

  function refreshWhyLines() {
    const why = actionsBlocked();
    for (const line of document.querySelectorAll("[data-why='actions']")) {
      line.textContent = why || "";
      line.hidden = !why;
    }
  }

  document.getElementById("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    const input = document.getElementById("token-input");
    const value = input.value.trim();
    if (value) sessionStorage.setItem(TOKEN_KEY, value);
    input.value = "";
    renderMode();
    scheduleReload(0);
  });
  document.getElementById("token-forget").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    renderMode();
    scheduleReload(0);
  });

  // ---- names of rules ---------------------------------------------------------

  /// Names for branch rule ids (for pages of executions), asked once.
  async function ruleNames(ids) {
    const missing = [...new Set(ids)].filter((id) => !state.ruleNames.has(id));
    for (let i = 0; i < missing.length; i += 100) {
      const chunk = missing.slice(i, i + 100);
      const page = await api("/plan/workflows?limit=100&ids=" + chunk.join(","));
      for (const item of page.items) state.ruleNames.set(item.id, item);
      for (const id of chunk) if (!state.ruleNames.has(id)) state.ruleNames.set(id, null);
    }
    return state.ruleNames;
  }

  function ruleLink(id, summary) {
    const name = summary ? (summary.rule || "?") + " · " + (summary.branch || "?") : id;
    return el("a", { href: "#/rules/" + id, class: summary ? "" : "mono", text: name });
  }

  // ---- overview ---------------------------------------------------------------

  function lagChart(series) {
    const ns = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(ns, "svg");
    svg.setAttribute("class", "chart");
    svg.setAttribute("viewBox", "0 0 300 106");
    svg.setAttribute("preserveAspectRatio", "none");
    svg.setAttribute("role", "img");
    const points = series.minutes;
    const top = Math.max(1, ...points.map((p) => p.p99_ms || 0));
    const label = "Start lag per minute over the last 15 minutes; highest p99 " + top + " ms";
    svg.setAttribute("aria-label", label);
    const title = document.createElementNS(ns, "title");
    title.textContent = label;
    svg.append(title);
    const width = 300 / points.length;
    points.forEach((p, i) => {
      for (const [key, cls] of [["p99_ms", "p99"], ["p50_ms", "p50"]]) {
        const value = p[key];
        if (value === null || value === undefined) continue;
        const height = Math.max(1, (value / top) * 100);
        const rect = document.createElementNS(ns, "rect");
        rect.setAttribute("class", cls);
        rect.setAttribute("x", String(i * width + 1));
        rect.setAttribute("width", String(Math.max(1, width - 2)));
        rect.setAttribute("y", String(105 - height));
        rect.setAttribute("height", String(height));
        const tip = document.createElementNS(ns, "title");
        tip.textContent = utcText(p.minute) + ": " + p.starts + " start(s), p50 " + p.p50_ms + " ms, p99 " + p.p99_ms + " ms";
        rect.append(tip);
        svg.append(rect);
      }
    });
    const axis = document.createElementNS(ns, "line");
    axis.setAttribute("class", "axis");
    axis.setAttribute("x1", "0"); axis.setAttribute("x2", "300");
    axis.setAttribute("y1", "105"); axis.setAttribute("y2", "105");
    svg.append(axis);
    return svg;
  }

  function ratioLine(label, ratio, threshold, field) {
    if (ratio === null || ratio === undefined) {
      return el("div", {}, el("span", { class: "label", text: label + ": no reading yet" }));
    }
    const percent = (ratio * 100).toFixed(1);
    const bar = el("span", {});
    bar.style.width = Math.min(100, ratio * 100) + "%";
    return el("div", {},
      el("span", { class: "small" }, label + " ", el("strong", { "data-field": field, "data-value": String(ratio), text: percent + "%" }),
        el("span", { class: "muted", text: " (throttles at " + threshold + "%)" })),
      el("div", { class: "meter" + (ratio * 100 >= threshold ? " hot" : "") }, bar));
  }

  const overview = {
    title: "Overview",
    mount(root) {
      root.append(el("h1", { text: "Overview" }), el("div", { id: "region" }));
    },
    async load(region) {
      const [stats, cluster] = await Promise.all([api("/stats"), api("/instances")]);
      state.readOnly = stats.read_only;
      renderMode();
      const names = await ruleNames(stats.recent_errors.map((e) => e.branch_rule_id));
      const memory = stats.memory;
      const queue = stats.queue;
      const plan = stats.plan;
      const lag = stats.start_lag.window;
      const instances = cluster.instances.map((i) => el("tr", { "data-instance": i.id },
        td("Instance", el("strong", { text: i.id }), i.this_instance ? el("span", { class: "muted", text: " (this one)" }) : null),
        td("Host", i.hostname + " · pid " + i.pid),
        td("Live", badge(i.live ? "live" : "down", i.live ? "live" : "silent")),
        td("Partitions", i.partitions_held.length ? i.partitions_held.join(", ") : "—",
          i.partition ? el("span", { class: "muted", text: " (prefers " + i.partition + ")" }) : null),
        timeCell("Heartbeat", i.heartbeat_at),
        timeCell("Started", i.started_at)));
      const errors = stats.recent_errors.map((e) => el("tr", { "data-execution": e.id },
        timeCell("When", e.finished_at || e.requested_at),
        td("Rule", ruleLink(e.branch_rule_id, names.get(e.branch_rule_id))),
        td("Status", badge(e.status)),
        td("Attempt", String(e.attempt)),
        td("Error", el("span", { class: "small", text: e.error || "—" }))));
      fill(region, 
        el("div", { class: "grid" },
          el("section", { class: "card", "aria-labelledby": "h-engine" },
            el("h2", { id: "h-engine", text: "Engine" }),
            el("div", { class: "figures" },
              figure("Workers alive", queue.alive_workers, "queue.alive_workers"),
              figure("Workers total", queue.total_workers, "queue.total_workers"),
              figure("Queued", queue.queue_size, "queue.queue_size"),
              figure("Running", queue.active_jobs, "queue.active_jobs"))),
          el("section", { class: "card", "aria-labelledby": "h-plan" },
            el("h2", { id: "h-plan", text: "Plan" }),
            el("div", { class: "figures" },
              figure("Ready", stats.readiness.ready, "readiness.ready"),
              figure("Missed window", stats.readiness.missed_window, "readiness.missed_window"),
              figure("Workflows", plan.workflows, "plan.workflows"),
              figure("Held", plan.held, "plan.held"))),
          el("section", { class: "card", "aria-labelledby": "h-memory" },
            el("h2", { id: "h-memory", text: "Memory" }),
            el("p", {},
              memory.throttled
                ? badge("throttled", "THROTTLED: " + (memory.reason || "memory pressure"))
                : badge("ready", "not throttled"),
              el("span", { hidden: true, "data-field": "memory.throttled", "data-value": String(memory.throttled) })),
            ratioLine("RAM", memory.ram_ratio, memory.memory_throttle_threshold, "memory.ram_ratio"),
            ratioLine("Swap", memory.swap_ratio, memory.swap_throttle_threshold, "memory.swap_ratio"),
            memory.gpu_ratio === null
              ? el("p", { class: "small muted", text: "GPU: " + memory.gpu })
              : ratioLine("GPU", memory.gpu_ratio, memory.gpu_throttle_threshold, "memory.gpu_ratio"))),
        el("section", { class: "card", "aria-labelledby": "h-lag" },
          el("h2", { id: "h-lag", text: "Start lag, last 15 minutes" }),
          el("div", { class: "figures" },
            figure("Starts", lag.starts, "start_lag.window.starts"),
            figure("p50", lag.p50_ms === null ? "—" : lag.p50_ms + " ms", "start_lag.window.p50_ms"),
            figure("p99", lag.p99_ms === null ? "—" : lag.p99_ms + " ms", "start_lag.window.p99_ms")),
          lagChart(stats.start_lag),
          el("div", { class: "chart-axis", "aria-hidden": "true" }, el("span", { text: "15 min ago" }), el("span", { text: "now" })),
          el("div", { class: "legend" },
            el("span", {}, el("span", { class: "key p50" }), "p50 per minute"),
            el("span", {}, el("span", { class: "key p99" }), "p99 per minute"))),
        el("section", { class: "card", "aria-labelledby": "h-instances" },
          el("h2", { id: "h-instances", text: "Instances (" + cluster.instances.length + ", " + cluster.partition_count + " partitions)" }),
          table(["Instance", "Host", "Live", "Partitions", "Heartbeat", "Started"], instances, "No instance has registered.")),
        el("section", { class: "card", "aria-labelledby": "h-errors" },
          el("h2", { id: "h-errors", text: "Last errors" }),
          table(["When", "Rule", "Status", "Attempt", "Error"], errors, "No failed or timed-out runs.")),
        el("p", { class: "small muted", text: "Figures of " + stats.instance_id + " at " + utcText(stats.now) + "." }));
    },
  };

  // ---- rules ------------------------------------------------------------------

  /// A paged list: cursors of the pages before the current one, so Previous
  /// goes back exactly.
  function pager(history, nextCursor, onMove, count) {
    return el("nav", { class: "pager", "aria-label": "Pages" },
      el("button", { type: "button", "data-action": "previous-page", disabled: history.length === 0,
        onclick: () => { history.pop(); onMove(history[history.length - 1] || null); } }, "Previous"),
      el("button", { type: "button", "data-action": "next-page", disabled: !nextCursor,
        onclick: () => { history.push(nextCursor); onMove(nextCursor); } }, "Next"),
      el("span", { class: "muted small", text: count }));
  }

  async function options(path, label) {
    // Catalog listings answer a plain array (the cursor is in a header).
    const items = await api(path + "?limit=1000");
    return items.map((item) => ({ value: item.id, text: item[label] }));
  }

  function select(id, label, choices, value, onChange) {
    const node = el("select", { id, name: id }, choices.map((c) =>
      el("option", { value: c.value, selected: c.value === value }, c.text)));
    node.addEventListener("change", () => onChange(node.value));
    return el("label", { for: id }, label, node);
  }

  function workflowRows(items, withPlanColumns) {
    return items.map((w) => el("tr", { "data-rule": w.id, "data-state": w.state },
      td("Rule", el("a", { href: "#/rules/" + w.id, text: w.rule || "(missing rule)" })),
      td("Brand / branch", (w.brand || "?") + " / " + (w.branch || "?")),
      withPlanColumns ? null : td("Zone", w.zone),
      withPlanColumns ? null : td("Cron", el("code", { text: w.cron_expression || "—" })),
      withPlanColumns ? null : td("Window", w.window || "all day"),
      withPlanColumns ? null : td("Active", w.is_active ? "yes" : "no", w.is_force_stopped ? el("span", { class: "badge force_stopped", text: "force-stopped" }) : null),
      withPlanColumns ? null : td("Running", w.is_running ? badge("running") : "no"),
      withPlanColumns ? null : timeCell("Last run", w.last_run_time, w.zone),
      el("td", { "data-label": "Next run", class: "time", "data-next-utc": w.next_run_time || "", "data-next-local": w.next_run_local || "" },
        el("span", { class: "utc", text: utcText(w.next_run_time) }),
        w.next_run_local ? el("span", { class: "local", text: w.next_run_local + " (" + w.zone + ")" }) : null),
      withPlanColumns ? td("Partition", w.partition === null ? "—" : w.partition + (w.partition_owner ? " on " + w.partition_owner : " (no owner)")) : null,
      td("State", badge(w.state)),
      td("Why", el("span", { class: "verdict small", text: w.verdict }))));
  }

  function ruleList(title, sortByNextRun) {
    const page = {
      title,
      history: [],
      async mount(root) {
        const { query } = params();
        const path = sortByNextRun ? "/plan" : "/rules";
        const [brands, branches] = await Promise.all([options("/brands", "name"), options("/branches", "name")]);
        const refilter = () => { page.history = []; scheduleReload(0); };
        const update = (key, value) => {
          const q = params().query;
          if (value) q.set(key, value); else q.delete(key);
          setQuery(path, q);
          refilter();
        };
        const search = el("input", { id: "filter-q", type: "search", value: query.get("q") || "", placeholder: "rule, branch or brand" });
        let typing = null;
        search.addEventListener("input", () => {
          clearTimeout(typing);
          typing = setTimeout(() => update("q", search.value.trim()), 250);
        });
        root.append(...[
          el("h1", { text: title }),
          sortByNextRun
            ? el("p", { class: "muted", text: "The decision log: every rule, soonest next run first, with what the engine decides for it at the next tick. The same verdicts as `ruled plan`." })
            : null,
          el("div", { class: "filters", role: "search" },
            select("filter-brand", "Brand", [{ value: "", text: "All brands" }, ...brands], query.get("brand_id") || "", (v) => update("brand_id", v)),
            select("filter-branch", "Branch", [{ value: "", text: "All branches" }, ...branches], query.get("branch_id") || "", (v) => update("branch_id", v)),
            el("label", { for: "filter-state" }, "State", el("select", { id: "filter-state", name: "state",
              onchange: (e) => update("state", e.target.value) }, el("option", { value: "", text: "All states" }))),
            el("label", { for: "filter-q" }, "Search by name", search)),
          el("div", { id: "region" })].filter(Boolean));
      },
      async load(region) {
        const { query } = params();
        const q = new URLSearchParams();
        for (const key of ["brand_id", "branch_id", "state", "q"]) if (query.get(key)) q.set(key, query.get(key));
        q.set("limit", String(pageSize()));
        if (sortByNextRun) q.set("sort", "next_run");
        const cursor = page.history[page.history.length - 1];
        if (cursor) q.set("cursor", cursor);
        const [result, stats] = await Promise.all([api("/plan/workflows?" + q), sortByNextRun ? api("/stats") : null]);
        // The state filter's options carry the counts.
        const stateSelect = document.getElementById("filter-state");
        if (stateSelect) {
          const chosen = query.get("state") || "";
          stateSelect.replaceChildren(el("option", { value: "", selected: chosen === "" }, "All states"),
            ...RULE_STATES.map((s) => el("option", { value: s, selected: s === chosen },
              s.replace("_", " ") + " (" + (result.states[s] || 0) + ")")));
        }
        const headings = sortByNextRun
          ? ["Rule", "Brand / branch", "Next run", "Partition", "State", "Why"]
          : ["Rule", "Brand / branch", "Zone", "Cron", "Window", "Active", "Running", "Last run", "Next run", "State", "Why"];
        const shown = page.history.length * pageSize();
        const count = result.matched === 0 ? "" :
          "Rules " + (shown + 1) + "–" + (shown + result.items.length) + " of " + result.matched;
        fill(region, 
          stats ? el("p", { "data-field": "plan.summary", text: stats.plan.workflows + " workflow(s), " + stats.readiness.ready + " ready at " + utcText(stats.now) }) : null,
          table(headings, workflowRows(result.items, sortByNextRun), "No rule matches these filters."),
          pager(page.history, result.next_cursor, () => scheduleReload(0), count));
      },
    };
    return page;
  }

  // ---- rule detail ------------------------------------------------------------

  function executionRows(items, names, withRule) {
    return items.map((e) => {
      const start = e.started_at ? Date.parse(e.started_at) : null;
      const end = e.finished_at ? Date.parse(e.finished_at) : null;
      const lasted = start !== null ? (end !== null ? end - start : Date.now() - start) : null;
      const cancel = OPEN.has(e.status)
        ? actionButton("Cancel", async () => {
          const reply = await api("/executions/" + e.id + "/cancel", { method: "POST" });
          return "Cancel sent for execution " + e.id + ": " + String(reply.outcome).replace(/_/g, " ") + ".";
        }, { class: "danger", action: "cancel", ariaLabel: "Cancel execution " + e.id })
        : null;
      const summary = names ? names.get(e.branch_rule_id) : null;
      return el("tr", { "data-execution": e.id, "data-status": e.status },
        withRule ? td("Rule", ruleLink(e.branch_rule_id, summary)) : null,
        el("td", { "data-label": "Status", title: "requested " + utcText(e.requested_at) }, badge(e.status)),
        timeCell("Scheduled for", e.scheduled_for, summary && summary.zone),
        td("States (UTC)", stateTimes(e)),
        td("Duration", duration(lasted)),
        td("Worker", el("span", { class: "small", text: e.owner })),
        td("Attempt", String(e.attempt)),
        td("Error", el("span", { class: "small error-text", text: e.error || "—" })),
        td("Actions", cancel || el("span", { class: "muted", text: "—" })));
    });
  }

  /// Each lifecycle state's time, one a line: requested, scheduled,
  /// running, and the end.
  function stateTimes(e) {
    const clock = (iso) => utcText(iso).slice(11, 19);
    const steps = [["requested", e.requested_at], ["scheduled", e.scheduled_at], ["running", e.started_at],
      [OPEN.has(e.status) ? null : e.status, e.finished_at]];
    return el("span", { class: "states small" }, steps
      .filter(([name, at]) => name && at)
      .map(([name, at]) => el("span", { class: "state-time", "data-state": name, title: utcText(at) },
        el("span", { class: "muted", text: name + " " }), clock(at))));
  }

  const ruleDetail = {
    title: "Rule",
    mount(root) {
      root.append(el("div", { id: "region" }));
    },
    async load(region) {
      const id = params().path.split("/")[2];
      const [summaries, row, preview, details, runs] = await Promise.all([
        api("/plan/workflows?ids=" + id),
        api("/branch-rules/" + id),
        api("/branch-rules/" + id + "/preview?count=10").catch((e) => ({ error: e })),
        api("/branch-rules/" + id + "/action-details?limit=100"),
        api("/executions?order=desc&limit=25&branch_rule_id=" + id),
      ]);
      const w = summaries.items[0];
      if (!w) {
        fill(region, el("h1", { text: "Rule " + id }), el("p", { text: "This branch rule is not in the plan (deleted, archived or not loaded yet)." }));
        return;
      }
      if (state.readOnly === null) {
        const stats = await api("/stats");
        state.readOnly = stats.read_only;
        renderMode();
      }
      const templates = new Map();
      for (const d of details) {
        if (!templates.has(d.action_template_id)) {
          templates.set(d.action_template_id, await api("/action-templates/" + d.action_template_id).catch(() => null));
        }
      }
      const names = new Map([[id, w]]);
      const previewBlock = preview.error
        ? el("p", { class: "why", text: describeFailure(preview.error) })
        : table(["#", "UTC", "Local (" + preview.timezone + ")", "Marks"], preview.runs.map((run, i) => {
          const local = run.local.replace("T", " ").slice(0, 16) + " " + run.local.slice(19);
          const previous = i > 0 ? preview.runs[i - 1].local.slice(19) : null;
          return el("tr", { "data-run": String(i + 1) },
            td("#", String(i + 1)),
            td("UTC", utcText(run.utc)),
            td("Local", local),
            td("Marks",
              run.dst ? badge("dst", "DST") : null,
              previous !== null && previous !== run.local.slice(19) ? badge("dst", "offset changes") : null,
              run.deferred_from ? badge("deferred", "window opens (due " + utcText(run.deferred_from) + ")") : null));
        }), "No run ahead.");
      const toggle = row.is_active
        ? actionButton("Deactivate", async () => { await api("/branch-rules/" + id + "/status", { method: "PUT", body: { is_active: false } }); return "Deactivated."; }, { action: "deactivate" })
        : actionButton("Activate", async () => { await api("/branch-rules/" + id + "/status", { method: "PUT", body: { is_active: true } }); return "Activated."; }, { action: "activate" });
      fill(region, 
        el("h1", {}, w.rule || "(missing rule)", el("span", { class: "muted", text: " · " + (w.branch || "?") + " · " + (w.brand || "?") })),
        el("div", { class: "actions" },
          actionButton("Run now", async () => { await api("/branch-rules/" + id + "/run", { method: "POST" }); return "Run requested: it is due now."; }, { class: "primary", action: "run-now" }),
          toggle,
          row.is_force_stopped
            ? actionButton("Resume", async () => {
              await api("/branch-rules/" + id, { method: "PUT", body: { is_force_stopped: false } });
              return "Resumed: no longer force-stopped.";
            }, { action: "resume" })
            : actionButton("Force stop", async () => {
              const reply = await api("/branch-rules/" + id + "/force-stop", { method: "POST" });
              return "Force-stopped; its run: " + String(reply.cancel).replace(/_/g, " ") + ".";
            }, { class: "danger", action: "force-stop" })),
        whyLine(),
        el("div", { class: "grid" },
          el("section", { class: "card", "aria-labelledby": "h-facts" },
            el("h2", { id: "h-facts", text: "Schedule" }),
            el("dl", { class: "facts" },
              el("dt", { text: "State" }), el("dd", {}, badge(w.state), " ", el("span", { class: "verdict", text: w.verdict })),
              el("dt", { text: "Cron" }), el("dd", {}, el("code", { text: w.cron_expression || "—" })),
              el("dt", { text: "Zone" }), el("dd", { text: w.zone }),
              el("dt", { text: "Window" }), el("dd", { text: w.window ? w.window + " (" + w.zone + ")" : "all day" }),
              el("dt", { text: "Active" }), el("dd", { "data-field": "is_active", text: row.is_active ? "yes" : "no" }),
              el("dt", { text: "Force-stopped" }), el("dd", { "data-field": "is_force_stopped", text: row.is_force_stopped ? "yes" : "no" }),
              el("dt", { text: "Next run" }), el("dd", {}, utcText(w.next_run_time), w.next_run_local ? el("span", { class: "muted", text: " · " + w.next_run_local + " (" + w.zone + ")" }) : null),
              el("dt", { text: "Last run" }), el("dd", { text: utcText(w.last_run_time) }),
              el("dt", { text: "Policy" }), el("dd", {}, el("code", { class: "small", text: JSON.stringify(row.effective_policy || row.policy || {}) })))),
          el("section", { class: "card", "aria-labelledby": "h-actions" },
            el("h2", { id: "h-actions", text: "Actions" }),
            table(["#", "Template", "Kind", "Params"], details.map((d) => {
              const template = templates.get(d.action_template_id);
              return el("tr", {},
                td("#", String(d.position)),
                td("Template", template ? template.name : d.action_template_id),
                td("Kind", template ? template.kind : "?"),
                td("Params", el("pre", { class: "mono", text: JSON.stringify(d.params) })));
            }), "No actions."))),
        el("section", { class: "card", "aria-labelledby": "h-preview" },
          el("h2", { id: "h-preview", text: "Next 10 runs" + (preview.operation_time_from ? " · window " + preview.operation_time_from + "–" + preview.operation_time_to + " " + preview.timezone : "") }),
          previewBlock),
        el("section", { class: "card", "aria-labelledby": "h-history" },
          el("h2", { id: "h-history", text: "Execution history" }),
          table(["Status", "Scheduled for", "States (UTC)", "Duration", "Worker", "Attempt", "Error", "Actions"],
            executionRows(runs.items, names, false), "No execution yet."),
          el("p", {}, el("a", { href: "#/executions?branch_rule_id=" + id, text: "All executions of this rule" }))));
      document.title = (w.rule || "Rule") + " · ruled console";
    },
  };

  // ---- executions -------------------------------------------------------------

  /// `datetime-local` values are read as UTC: the label says so.
  function isoFromInput(value) {
    return value ? value + ":00Z" : "";
  }

  const executions = {
    title: "Executions",
    history: [],
    async mount(root) {
      const { query } = params();
      if (state.readOnly === null) {
        state.readOnly = (await api("/stats")).read_only;
        renderMode();
      }
      const rules = await api("/plan/workflows?limit=1000");
      for (const item of rules.items) state.ruleNames.set(item.id, item);
      const update = (key, value) => {
        const q = params().query;
        if (value) q.set(key, value); else q.delete(key);
        setQuery("/executions", q);
        executions.history = [];
        scheduleReload(0);
      };
      const timeInput = (key, label) => {
        const value = (query.get(key) || "").replace(/:00Z$/, "").replace(/Z$/, "");
        const input = el("input", { id: "filter-" + key, type: "datetime-local", value });
        input.addEventListener("change", () => update(key, isoFromInput(input.value)));
        return el("label", { for: "filter-" + key }, label, input);
      };
      root.append(
        el("h1", { text: "Executions" }),
        el("div", { class: "filters", role: "search" },
          select("filter-status", "Status", [{ value: "", text: "All statuses" }, ...STATUSES.map((s) => ({ value: s, text: s.replace("_", " ") }))],
            query.get("status") || "", (v) => update("status", v)),
          select("filter-rule", "Rule", [{ value: "", text: "All rules" },
            ...rules.items.map((w) => ({ value: w.id, text: (w.rule || "?") + " · " + (w.branch || "?") }))],
          query.get("branch_rule_id") || "", (v) => update("branch_rule_id", v)),
          timeInput("from", "Requested from (UTC)"),
          timeInput("to", "Requested before (UTC)")),
        whyLine(), el("div", { id: "region" }));
    },
    async load(region) {
      const { query } = params();
      const q = new URLSearchParams({ order: "desc", limit: String(pageSize()) });
      for (const key of ["status", "branch_rule_id", "from", "to"]) if (query.get(key)) q.set(key, query.get(key));
      const cursor = executions.history[executions.history.length - 1];
      if (cursor) q.set("cursor", cursor);
      const page = await api("/executions?" + q);
      const names = await ruleNames(page.items.map((e) => e.branch_rule_id));
      const first = executions.history.length * pageSize();
      fill(region, 
        table(["Rule", "Status", "Scheduled for", "States (UTC)", "Duration", "Worker", "Attempt", "Error", "Actions"],
          executionRows(page.items, names, true), "No execution matches these filters."),
        pager(executions.history, page.next_cursor, () => scheduleReload(0),
          page.items.length ? "Newest first · rows " + (first + 1) + "–" + (first + page.items.length) : ""));
    },
  };

  // ---- routing and live updates -----------------------------------------------

  const rules = ruleList("Rules", false);
  const planPage = ruleList("Plan", true);

  function route() {
    const { path } = params();
    if (path.startsWith("/rules/")) return ["rules", ruleDetail];
    if (path === "/rules") return ["rules", rules];
    if (path === "/executions") return ["executions", executions];
    if (path === "/plan") return ["plan", planPage];
    return ["overview", overview];
  }

  async function reload() {
    if (!state.page || state.mounting) return;
    if (state.loading) { state.reloadAgain = true; return; }
    state.loading = true;
    const page = state.page;
    try {
      // A page whose setup failed (the database was away) is set up again
      // here, so it fills in once the service answers.
      if (!state.mounted) {
        main.replaceChildren();
        await page.mount(main);
        if (page !== state.page) return;
        state.mounted = true;
        clearNotice();
      }
      const region = document.getElementById("region");
      if (region) await page.load(region);
    } catch (error) {
      if (page === state.page) show(describeFailure(error), "error");
    } finally {
      state.loading = false;
      if (state.reloadAgain) { state.reloadAgain = false; scheduleReload(DEBOUNCE_MS); }
    }
  }

  function scheduleReload(delay) {
    clearTimeout(state.reloadTimer);
    state.reloadTimer = setTimeout(reload, delay === undefined ? DEBOUNCE_MS : delay);
  }

  async function navigate() {
    // Every navigation mounts its page afresh: the fragment may carry other
    // filters (a link, the back button). Filters the page sets itself use
    // replaceState, which navigates nowhere.
    const [name, page] = route();
    for (const link of document.querySelectorAll("nav a[data-page]")) {
      if (link.dataset.page === name) link.setAttribute("aria-current", "page");
      else link.removeAttribute("aria-current");
    }
    clearNotice();
    state.page = page;
    if (page.history) page.history = [];
    document.title = page.title + " · ruled console";
    main.replaceChildren();
    main.dataset.page = name;
    state.mounted = false;
    state.mounting = true;
    const navigation = ++state.navigation;
    try {
      await page.mount(main);
      if (navigation === state.navigation) state.mounted = true;
    } catch (error) {
      if (navigation === state.navigation) show(describeFailure(error), "error");
    } finally {
      if (navigation === state.navigation) state.mounting = false;
    }
    if (navigation !== state.navigation) return;
    await reload();
    main.dataset.loaded = "true";
  }

  function listen() {
    if (!window.EventSource) { live.textContent = "polling"; return; }
    const source = new EventSource(API + "/events");
    source.addEventListener("open", () => { live.textContent = "● live"; live.classList.add("on"); });
    source.addEventListener("error", () => { live.textContent = "reconnecting…"; live.classList.remove("on"); });
    source.addEventListener("execution", () => scheduleReload());
    source.addEventListener("throttle", () => scheduleReload());
  }

  // The skip link moves the focus without touching the fragment: the
  // fragment is the page's route and filters.
  for (const skip of document.querySelectorAll("a.skip")) {
    skip.addEventListener("click", (event) => {
      event.preventDefault();
      main.focus();
    });
  }

  window.addEventListener("hashchange", () => {
    if (!location.hash.startsWith("#/")) return;
    main.dataset.loaded = "false";
    navigate();
  });
  setInterval(() => { if (!document.hidden) scheduleReload(); }, POLL_MS);
  renderMode();
  listen();
  navigate();
  api("/stats").then((stats) => { state.readOnly = stats.read_only; renderMode(); }).catch(() => {});
})();
