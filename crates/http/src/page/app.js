"use strict";
// The status page: one page of tasks at a time, kept live by the event stream.
// Every URL is relative to where the page is mounted.
(function () {
  // "/ui" and "/" of the router, mounted anywhere: "/x/ui", "/x/", "/x" -> "/x/".
  let base = location.pathname;
  if (base.endsWith("/ui")) base = base.slice(0, -2);
  if (!base.endsWith("/")) base += "/";
  const PAGE = 100;
  const STAGES = ["", "New", "Running", "Pausing", "Paused", "Resuming", "Stopping", "Stopped", "Finished"];
  const state = { token: sessionStorage.getItem("taskstage-token") || "", scope: null, stage: "", q: "", task: "", offset: 0, rows: new Map(), pending: new Map(), errors: new Map(), rates: new Map(), last: 0, followed: null, stream: null };
  // The view is in the URL (#stage=Paused&q=orders), to share or reload; a token
  // there is taken into the session and removed from the address.
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get("token")) { state.token = hash.get("token"); sessionStorage.setItem("taskstage-token", state.token); }
  if (STAGES.includes(hash.get("stage") || "")) state.stage = hash.get("stage") || "";
  state.q = hash.get("q") || "";
  state.task = hash.get("task") || "";
  function keepView() {
    const h = new URLSearchParams();
    if (state.stage) h.set("stage", state.stage);
    if (state.q) h.set("q", state.q);
    if (state.task) h.set("task", state.task);
    const text = h.toString();
    history.replaceState(null, "", location.pathname + location.search + (text ? "#" + text : ""));
  }
  keepView();
  const $ = (id) => document.getElementById(id);

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    if (state.token) h["Authorization"] = "Bearer " + state.token;
    return h;
  }
  async function api(method, path, json) {
    const init = { method, headers: headers(json ? { "Content-Type": "application/json" } : {}) };
    if (json) init.body = JSON.stringify(json);
    const res = await fetch(base + path, init);
    let body = null;
    try { body = await res.json(); } catch (e) { body = null; }
    return { status: res.status, body };
  }
  function showError(msg) { $("error").textContent = msg ? visible(msg) : ""; }

  function fmtSince(ms) {
    if (ms == null) return "";
    const s = Math.max(0, Math.round((Date.now() - ms) / 1000));
    if (s < 60) return s + "s ago";
    if (s < 3600) return Math.round(s / 60) + "m ago";
    return Math.round(s / 3600) + "h ago";
  }

  // Characters that change how the text around them is shown, or are not shown at
  // all (direction overrides and isolates, zero-width marks, controls), written out
  // as \u{...}: a name with a right-to-left override would read as another name.
  const HIDDEN = /[\u0000-\u001f\u007f-\u009f\u061c\u200b-\u200f\u202a-\u202e\u2060-\u2069\ufeff]/g;
  function visible(text) {
    return String(text).replace(HIDDEN, (c) => "\\u{" + c.codePointAt(0).toString(16).toUpperCase() + "}");
  }

  // Which command makes sense in which stage: the others are shown disabled.
  const ALLOWED = {
    pause: ["Running", "Resuming"],
    resume: ["New", "Paused"],
    stop: ["New", "Running", "Pausing", "Paused", "Resuming"],
  };
  const fmtCount = (n) => Number(n).toLocaleString("en");

  // Progress as done / total (%), with the rate and the time left from the last
  // two readings of this task.
  function progressText(id, p) {
    const now = Date.now();
    const seen = state.rates.get(id);
    let rate = seen ? seen.rate : null;
    if (seen && p.done !== seen.done && now > seen.at) rate = (p.done - seen.done) / ((now - seen.at) / 1000);
    if (!seen || p.done !== seen.done) state.rates.set(id, { done: p.done, at: now, rate });
    let text = fmtCount(p.done);
    if (p.total) text += " / " + fmtCount(p.total) + " (" + (100 * p.done / p.total).toFixed(1) + "%)";
    if (rate && rate > 0) {
      text += ", " + fmtCount(Math.round(rate)) + "/s";
      if (p.total && p.total > p.done) {
        const left = Math.round((p.total - p.done) / rate);
        text += ", " + (left < 60 ? left + "s" : left < 3600 ? Math.round(left / 60) + "m" : Math.round(left / 3600) + "h") + " left";
      }
    }
    return text;
  }

  // What the auto-resume policy makes of a task, when one watches it: a retry
  // when, at which attempt, or blocked until a person acts. An operator's pause is
  // told by "by an operator".
  function standingText(p) {
    if (!p) return "";
    if (p.standing === "backing_off") {
      const attempt = "attempt " + (p.step + 1);
      if (p.due == null) return "retrying, " + attempt;
      return "retrying in " + Math.max(0, Math.round((p.due - Date.now()) / 1000)) + "s, " + attempt;
    }
    if (p.standing === "blocked") return "blocked: needs a person";
    return "";
  }

  function row(item) {
    const tr = document.createElement("tr");
    tr.dataset.id = item.id;
    const pending = state.pending.get(item.id);
    const stage = pending || item.stage || "";
    const outcome = item.outcome ? (item.outcome.kind + (item.outcome.error ? ": " + item.outcome.error : "")) : "";
    const cells = [item.id, null, item.desired || "", item.owner || "", fmtSince(item.since), null, null, outcome];
    cells.forEach((text, i) => {
      const td = document.createElement("td");
      if (i === 1) {
        td.className = "stage";
        const span = document.createElement("span");
        span.className = stage;
        span.textContent = stage || "–";
        td.appendChild(span);
        if (item.user_paused && (stage === "Paused" || stage === "New")) {
          const by = document.createElement("span");
          by.className = "by";
          by.textContent = "by an operator";
          td.appendChild(by);
        }
        const standing = stage === "Paused" ? standingText(item.policy) : "";
        if (standing) {
          const why = document.createElement("span");
          why.className = "policy " + item.policy.standing;
          why.textContent = standing;
          td.appendChild(why);
        }
      } else if (i === 5) {
        td.className = "progress";
        if (item.progress) {
          if (item.progress.total) {
            const p = document.createElement("progress");
            p.max = item.progress.total; p.value = item.progress.done;
            td.appendChild(p);
          }
          td.append(" " + progressText(item.id, item.progress));
        }
      } else if (i === 6) {
        td.className = "cmds";
        for (const cmd of ["pause", "resume", "stop"]) {
          const b = document.createElement("button");
          b.type = "button";
          b.textContent = cmd;
          b.dataset.cmd = cmd;
          b.disabled = state.scope !== "admin" || !!pending || !ALLOWED[cmd].includes(stage);
          b.addEventListener("click", () => command(item.id, cmd));
          td.appendChild(b);
        }
        const err = state.errors.get(item.id);
        if (err) {
          const e = document.createElement("span");
          e.className = "rowerr";
          e.textContent = visible(err);
          td.appendChild(e);
        }
      } else if (i === 0) {
        // The task's own view: its detail and its recent events.
        const a = document.createElement("a");
        a.className = "open";
        a.href = "#";
        a.textContent = visible(text);
        a.addEventListener("click", (e) => { e.preventDefault(); openTask(item.id); });
        td.appendChild(a);
      } else {
        if (i === 7) { td.className = "outcome"; td.title = visible(text); }
        td.textContent = visible(text);
      }
      tr.appendChild(td);
    });
    return tr;
  }

  // Whether an item belongs in the view shown (its stage and name filter).
  function inView(item) {
    const stage = state.pending.get(item.id) || item.stage || "";
    return (!state.stage || stage === state.stage) && (!state.q || item.id.toLowerCase().includes(state.q.toLowerCase()));
  }

  function showCounts(counts) {
    let all = 0;
    for (const a of nav.children) {
      const s = a.dataset.stage;
      if (s) all += counts[s] || 0;
    }
    all += counts.none || 0;
    for (const a of nav.children) {
      const s = a.dataset.stage;
      const n = s ? (counts[s] || 0) : all;
      let c = a.querySelector(".count");
      if (!c) { c = document.createElement("span"); c.className = "count"; a.appendChild(c); }
      c.textContent = "(" + fmtCount(n) + ")";
    }
  }

  function render() {
    const body = $("rows");
    body.replaceChildren(...Array.from(state.rows.values()).map(row));
  }

  function filterQuery() {
    return (state.stage ? "&stage=" + state.stage : "") + (state.q ? "&q=" + encodeURIComponent(state.q) : "");
  }

  async function load() {
    const q = "v1/tasks?offset=" + state.offset + "&limit=" + PAGE + filterQuery();
    const { status, body } = await api("GET", q);
    if (status !== 200) { showError(status === 401 ? "enter a token: this server needs one" : (body ? body.error_msg : "HTTP " + status)); return false; }
    showError("");
    if (body.counts) showCounts(body.counts);
    state.rows = new Map(body.items.map((i) => [i.id, i]));
    const last = Math.min(body.offset + body.items.length, body.total);
    $("pageinfo").textContent = body.total ? (body.offset + 1) + "–" + last + " of " + body.total : "no tasks";
    $("prev").disabled = state.offset === 0;
    $("next").disabled = last >= body.total;
    render();
    // The list is at least as new as its `seq`: the stream goes on from there.
    state.last = Math.max(state.last, body.seq);
    if (state.followed !== null && streamQuery() !== state.followed) follow();
    return body.seq;
  }

  // The stream carries only the tasks shown (and the one opened): a tab of 100 rows
  // of 10,000 busy tasks is sent their changes, not every task's. Another view
  // opens another stream, from the last event read.
  function streamQuery() {
    const ids = new Set(state.rows.keys());
    if (state.task) ids.add(state.task);
    return Array.from(ids).map((id) => "task=" + encodeURIComponent(id)).join("&");
  }

  async function command(id, cmd) {
    const settling = { pause: "Pausing", resume: "Resuming", stop: "Stopping" }[cmd];
    state.pending.set(id, settling);
    render();
    const { status, body } = await api("POST", "v1/tasks/" + encodeURIComponent(id) + "/" + cmd + "?wait=30s");
    state.pending.delete(id);
    state.errors.delete(id);
    if (status === 200 && body) {
      const item = state.rows.get(id);
      if (item) { item.stage = body.stage; state.rows.set(id, Object.assign(item, { outcome: body.outcome, desired: body.desired, user_paused: body.user_paused })); }
    } else if (status === 202) {
      // Accepted, still settling: the stream tells the truth when it arrives.
      state.pending.set(id, body && body.stage ? body.stage : settling);
    } else {
      // On the task's own row, not at the top of the page.
      state.errors.set(id, body ? body.error_msg : "HTTP " + status);
    }
    render();
  }

  // One command to every task of the view (its stage and name filter), under one
  // deadline; the answer names what reached the stage, what is still settling and
  // what refused.
  async function bulk(cmd) {
    if (!state.stage && !state.q && !confirm(cmd + " every task?")) return;
    const selection = state.stage || state.q ? filterQuery().slice(1) : "all=true";
    $("bulk-report").textContent = cmd + "…";
    const { status, body } = await api("POST", "v1/bulk/" + cmd + "?wait=5s&" + selection);
    if ((status !== 200 && status !== 202) || !body) { $("bulk-report").textContent = cmd + ": " + (body ? body.error_msg : "HTTP " + status); return; }
    const names = (list) => list.map((e) => visible(e.id)).join(", ");
    let text = cmd + ": " + body.reached.length + " of " + body.selected + " reached";
    if (body.settling.length) text += "; still settling: " + names(body.settling);
    if (body.refused.length) text += "; refused: " + names(body.refused);
    $("bulk-report").textContent = text;
    for (const e of body.settling) state.pending.set(e.id, e.stage);
    for (const e of body.refused) state.errors.set(e.id, e.error_msg);
    await load();
  }

  // One task's view: every field of its detail, the last run's full error, the
  // policy's standing, and its recent events, oldest first.
  async function showTask() {
    const panel = $("task");
    if (!state.task) { panel.hidden = true; return; }
    const { status, body } = await api("GET", "v1/tasks/" + encodeURIComponent(state.task));
    panel.hidden = false;
    $("task-name").textContent = visible(state.task);
    const fields = $("task-fields");
    fields.replaceChildren();
    const add = (name, value) => {
      if (value == null || value === "") return;
      const dt = document.createElement("dt"); dt.textContent = name;
      const dd = document.createElement("dd"); dd.textContent = visible(value); dd.dataset.field = name;
      fields.append(dt, dd);
    };
    const events = $("task-events");
    events.replaceChildren();
    if (status !== 200 || !body) { add("error", body ? body.error_msg : "HTTP " + status); return; }
    add("stage", body.stage + (body.user_paused && (body.stage === "Paused" || body.stage === "New") ? " (by an operator)" : ""));
    add("desired", body.desired);
    add("owner", body.owner);
    add("generation", body.generation);
    add("fence token", body.token);
    if (body.unit) add("unit", (body.unit.index + 1) + " of " + body.units + ": " + body.unit.name);
    if (body.progress) add("progress", progressText(body.id, body.progress));
    add("since", fmtSince(body.since));
    if (body.outcome) add("last run", body.outcome.kind + (body.outcome.error ? ": " + body.outcome.error : ""));
    if (body.policy) add("policy", body.policy.standing + (standingText(body.policy) ? " (" + standingText(body.policy) + ")" : "") + ", " + body.policy.auto_resumes + " auto-resumes");
    for (const e of body.events || []) {
      const tr = document.createElement("tr");
      const d = e.data || {};
      const to = d.item ? d.item.stage : "";
      const cells = [e.seq, e.event === "gap" ? "missed " + (d.missed || "some") + " changes" : (d.from ? d.from + " → " : "") + (to || ""), d.cause || "", d.generation == null ? "" : d.generation];
      for (const c of cells) { const td = document.createElement("td"); td.textContent = visible(c); tr.appendChild(td); }
      events.appendChild(tr);
    }
  }
  function openTask(id) { state.task = id; keepView(); showTask(); if (state.followed !== null && streamQuery() !== state.followed) follow(); }

  // The list is read again soon after changes: the auto-resume policy's standing
  // follows a change, it is not in the change's own event.
  let reloadSoon = null;
  function reloadAfterChange() {
    if (reloadSoon) return;
    reloadSoon = setTimeout(() => { reloadSoon = null; load(); if (state.task) showTask(); }, 700);
  }

  function applyChange(data) {
    const item = state.rows.get(data.task);
    if (!data.item) return;
    if (item || data.task === state.task) reloadAfterChange();
    if (item) {
      const next = Object.assign({}, item, data.item, { progress: data.item.progress || item.progress });
      state.pending.delete(data.task);
      // A task that left the view's filter leaves the page shown.
      if (inView(next)) state.rows.set(data.task, next); else state.rows.delete(data.task);
      render();
    }
  }

  async function follow() {
    if (state.stream) state.stream.abort();
    const ctl = new AbortController();
    state.stream = ctl;
    const query = streamQuery();
    state.followed = query;
    if (!query) { $("live").className = ""; $("live").textContent = "live (nothing shown)"; return; }
    for (let attempt = 0; !ctl.signal.aborted; attempt++) {
      try {
        const res = await fetch(base + "v1/events?" + query, { headers: headers({ "Last-Event-ID": String(state.last) }), signal: ctl.signal });
        if (res.status !== 200) { $("live").className = "off"; $("live").textContent = "stream: HTTP " + res.status; return; }
        $("live").className = ""; $("live").textContent = "live";
        const reader = res.body.getReader();
        const decoder = new TextDecoder();
        let buf = "";
        for (;;) {
          const { value, done } = await reader.read();
          if (done) break;
          buf += decoder.decode(value, { stream: true });
          let end;
          while ((end = buf.indexOf("\n\n")) >= 0) {
            const block = buf.slice(0, end); buf = buf.slice(end + 2);
            let event = "message", data = "", id = null;
            for (const line of block.split("\n")) {
              if (line.startsWith("event: ")) event = line.slice(7);
              else if (line.startsWith("data: ")) data += line.slice(6);
              else if (line.startsWith("id: ")) id = Number(line.slice(4));
            }
            if (id != null) state.last = id;
            if (!data) continue;
            const parsed = JSON.parse(data);
            if (event === "gap") { state.last = (parsed.next_seq || 1) - 1; await load(); }
            else if (event === "change") applyChange(parsed);
          }
        }
      } catch (e) {
        if (ctl.signal.aborted) return;
      }
      $("live").className = "off"; $("live").textContent = "reconnecting";
      await new Promise((r) => setTimeout(r, Math.min(10000, 500 * (attempt + 1))));
    }
  }

  async function start() {
    const who = await api("GET", "v1/auth");
    if (who.status !== 200) {
      state.scope = null;
      showError(who.status === 401 ? "enter a token: this server needs one" : (who.body ? who.body.error_msg : "HTTP " + who.status));
      $("scope").textContent = "";
      return;
    }
    state.scope = who.body.scope;
    for (const b of document.querySelectorAll("#tools button[data-bulk]")) b.disabled = state.scope !== "admin";
    $("scope").textContent = "scope: " + state.scope;
    $("source").textContent = who.body.source;
    const seq = await load();
    if (seq !== false) follow();
    showTask();
  }

  const nav = $("stages");
  for (const s of STAGES) {
    const a = document.createElement("a");
    a.textContent = s || "all";
    a.dataset.stage = s;
    a.className = s === state.stage ? "on" : "";
    a.addEventListener("click", () => { state.stage = s; state.offset = 0; for (const x of nav.children) x.className = x.dataset.stage === s ? "on" : ""; keepView(); load(); });
    nav.appendChild(a);
  }
  $("search").value = state.q;
  let searching = null;
  $("search").addEventListener("input", () => {
    clearTimeout(searching);
    searching = setTimeout(() => { state.q = $("search").value.trim(); state.offset = 0; keepView(); load(); }, 150);
  });
  for (const b of document.querySelectorAll("#tools button[data-bulk]")) b.addEventListener("click", () => bulk(b.dataset.bulk));
  $("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); load(); });
  $("next").addEventListener("click", () => { state.offset += PAGE; load(); });
  $("login").addEventListener("submit", (e) => { e.preventDefault(); state.token = $("token").value; sessionStorage.setItem("taskstage-token", state.token); boot(0); });
  // Progress is not an event: the shown page is read again every 5 s.
  setInterval(() => { if (state.scope) { load(); if (state.task) showTask(); } }, 5000);
  // A view pasted into the address bar of an open page.
  window.addEventListener("hashchange", () => {
    const h = new URLSearchParams(location.hash.slice(1));
    state.stage = STAGES.includes(h.get("stage") || "") ? h.get("stage") || "" : "";
    state.q = h.get("q") || "";
    state.task = h.get("task") || "";
    state.offset = 0;
    $("search").value = state.q;
    for (const x of nav.children) x.className = x.dataset.stage === state.stage ? "on" : "";
    if (state.scope) { load(); showTask(); }
  });
  $("task-close").addEventListener("click", () => { state.task = ""; keepView(); showTask(); });
  // A server that cannot be reached yet (starting, restarting) is tried again.
  function boot(attempt) {
    start().catch((e) => {
      showError("cannot reach the server (" + e + "); trying again");
      setTimeout(() => boot(attempt + 1), Math.min(10000, 300 * (attempt + 1)));
    });
  }
  boot(0);
})();
