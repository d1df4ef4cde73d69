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
  const state = { token: sessionStorage.getItem("taskstage-token") || "", scope: null, stage: "", offset: 0, rows: new Map(), pending: new Map(), seq: 0, stream: null };
  const hash = new URLSearchParams(location.hash.slice(1));
  if (hash.get("token")) { state.token = hash.get("token"); sessionStorage.setItem("taskstage-token", state.token); history.replaceState(null, "", location.pathname); }
  const $ = (id) => document.getElementById(id);

  function headers(extra) {
    const h = Object.assign({}, extra || {});
    if (state.token) h["Authorization"] = "Bearer " + state.token;
    return h;
  }
  async function api(method, path) {
    const res = await fetch(base + path, { method, headers: headers() });
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

  function row(item) {
    const tr = document.createElement("tr");
    tr.dataset.id = item.id;
    const pending = state.pending.get(item.id);
    const stage = pending || item.stage || "";
    const cells = [item.id, null, item.desired || "", item.owner || "", fmtSince(item.since), null, item.outcome ? (item.outcome.kind + (item.outcome.error ? ": " + item.outcome.error : "")) : "", null];
    cells.forEach((text, i) => {
      const td = document.createElement("td");
      if (i === 1) {
        td.className = "stage";
        const span = document.createElement("span");
        span.className = stage;
        span.textContent = stage || "–";
        td.appendChild(span);
      } else if (i === 5) {
        if (item.progress) {
          if (item.progress.total) {
            const p = document.createElement("progress");
            p.max = item.progress.total; p.value = item.progress.done;
            td.appendChild(p);
            td.append(" " + item.progress.done + "/" + item.progress.total);
          } else td.textContent = String(item.progress.done);
        }
      } else if (i === 7) {
        td.className = "cmds";
        for (const cmd of ["pause", "resume", "stop"]) {
          const b = document.createElement("button");
          b.type = "button";
          b.textContent = cmd;
          b.dataset.cmd = cmd;
          b.disabled = state.scope !== "admin" || !!pending;
          b.addEventListener("click", () => command(item.id, cmd));
          td.appendChild(b);
        }
      } else td.textContent = visible(text);
      tr.appendChild(td);
    });
    return tr;
  }

  function render() {
    const body = $("rows");
    body.replaceChildren(...Array.from(state.rows.values()).map(row));
  }

  async function load() {
    const q = "v1/tasks?offset=" + state.offset + "&limit=" + PAGE + (state.stage ? "&stage=" + state.stage : "");
    const { status, body } = await api("GET", q);
    if (status !== 200) { showError(body ? body.error_msg : "HTTP " + status); return false; }
    showError("");
    state.rows = new Map(body.items.map((i) => [i.id, i]));
    const last = Math.min(body.offset + body.items.length, body.total);
    $("pageinfo").textContent = body.total ? (body.offset + 1) + "–" + last + " of " + body.total : "no tasks";
    $("prev").disabled = state.offset === 0;
    $("next").disabled = last >= body.total;
    render();
    return body.seq;
  }

  async function command(id, cmd) {
    const settling = { pause: "Pausing", resume: "Resuming", stop: "Stopping" }[cmd];
    state.pending.set(id, settling);
    render();
    const { status, body } = await api("POST", "v1/tasks/" + encodeURIComponent(id) + "/" + cmd + "?wait=30s");
    state.pending.delete(id);
    if (status === 200 && body) {
      const item = state.rows.get(id);
      if (item) { item.stage = body.stage; state.rows.set(id, Object.assign(item, { outcome: body.outcome, desired: body.desired })); }
      showError("");
    } else if (status === 202) {
      // Accepted, still settling: the stream tells the truth when it arrives.
      state.pending.set(id, body && body.stage ? body.stage : settling);
    } else {
      showError(body ? body.error_msg : "HTTP " + status);
    }
    render();
  }

  function applyChange(data) {
    const item = state.rows.get(data.task);
    if (!data.item) return;
    if (item) {
      state.rows.set(data.task, Object.assign({}, item, data.item, { progress: data.item.progress || item.progress }));
      state.pending.delete(data.task);
      render();
    }
  }

  async function follow(seq) {
    if (state.stream) state.stream.abort();
    const ctl = new AbortController();
    state.stream = ctl;
    let last = seq;
    for (let attempt = 0; !ctl.signal.aborted; attempt++) {
      try {
        const res = await fetch(base + "v1/events", { headers: headers({ "Last-Event-ID": String(last) }), signal: ctl.signal });
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
            if (id != null) last = id;
            if (!data) continue;
            const parsed = JSON.parse(data);
            if (event === "gap") { last = (parsed.next_seq || 1) - 1; const s = await load(); if (s !== false && s > last) last = s; }
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
      showError(who.body ? who.body.error_msg : "HTTP " + who.status);
      $("scope").textContent = "";
      return;
    }
    state.scope = who.body.scope;
    $("scope").textContent = "scope: " + state.scope;
    $("source").textContent = who.body.source;
    const seq = await load();
    if (seq !== false) follow(seq);
  }

  const nav = $("stages");
  for (const s of STAGES) {
    const a = document.createElement("a");
    a.textContent = s || "all";
    a.dataset.stage = s;
    a.className = s === state.stage ? "on" : "";
    a.addEventListener("click", () => { state.stage = s; state.offset = 0; for (const x of nav.children) x.className = x.dataset.stage === s ? "on" : ""; load(); });
    nav.appendChild(a);
  }
  $("prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE); load(); });
  $("next").addEventListener("click", () => { state.offset += PAGE; load(); });
  $("login").addEventListener("submit", (e) => { e.preventDefault(); state.token = $("token").value; sessionStorage.setItem("taskstage-token", state.token); boot(0); });
  // Progress is not an event: the shown page is read again every 5 s.
  setInterval(() => { if (state.scope) load(); }, 5000);
  // A server that cannot be reached yet (starting, restarting) is tried again.
  function boot(attempt) {
    start().catch((e) => {
      showError("cannot reach the server (" + e + "); trying again");
      setTimeout(() => boot(attempt + 1), Math.min(10000, 300 * (attempt + 1)));
    });
  }
  boot(0);
})();
