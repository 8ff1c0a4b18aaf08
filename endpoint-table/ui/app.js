// The xce web view. Plain JavaScript, no framework, no build step.
//
// Data: the services list (GET /v1/services), the hosts (GET /v1/hosts) and every endpoint
// entry the token may view, live, from one all-services stream (GET /v1/endpoints/stream).
// EventSource cannot send an Authorization header, so the stream is read with fetch and a
// streaming body reader, through the small SSE parser below.
//
// Everything that comes from the server enters the page through textContent: a service
// name or a meta value can never become markup (the Content-Security-Policy would also
// refuse to run anything inline).
"use strict";

const TOKEN_KEY = "xce.token";
const SELECTED_KEY = "xce.selected";
const STREAM = "/v1/endpoints/stream";
// Reconnect backoff: doubles from the first to the cap, with jitter so that many open tabs
// do not reconnect in step after an apiserver restart.
const BACKOFF_FIRST_MS = 500;
const BACKOFF_CAP_MS = 15000;
// The lists carry what the stream does not (replicas asked for, pending ones, rollout
// state, hosts); they are fetched again shortly after a stream change and, for changes no
// endpoint reflects (a host going down, a pending replica), every little while.
const LISTS_AFTER_CHANGE_MS = 300;
const LISTS_EVERY_MS = 10000;

const state = {
  token: "",
  services: [],      // from /v1/services
  hosts: [],         // from /v1/hosts
  entries: new Map(), // "project/service" -> entry, from the stream
  selected: "",      // "project/service"
  lastEventId: "",
  resets: 0,         // `event: reset`s this token's stream got (each a full resync)
  resetAt: null,     // when the last one came
  abort: null,       // AbortController of the running stream
  epoch: 0,          // bumps when the token changes: stale loops stop
  listsTimer: 0,
};

// === DOM helpers (text only) ===

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function clear(node) {
  while (node.firstChild) node.removeChild(node.firstChild);
}

function pill(kind, text) {
  return el("span", { class: "pill st-" + kind }, text);
}

function keyOf(project, service) {
  return (project || "default") + "/" + service;
}

// === connection status ===

function setConn(kind, text) {
  const c = $("conn");
  c.className = "conn conn-" + kind;
  c.dataset.state = kind;
  c.dataset.resets = String(state.resets);
  // After a gap (an apiserver that restarted and lost its journal, a page that was away
  // too long) what was shown was rebuilt from a snapshot: say so, and when.
  c.title = state.resets
    ? "rebuilt from a full snapshot " + state.resets + (state.resets === 1 ? " time" : " times") +
      ", last at " + state.resetAt.toLocaleTimeString()
    : "";
  $("conn-text").textContent = text;
}

function notice(text) {
  const n = $("notice");
  n.textContent = text || "";
  n.hidden = !text;
}

// === SSE parser (the WHATWG event-stream format) ===

class SseParser {
  constructor(onEvent) {
    this.onEvent = onEvent;
    this.buf = "";
    this.reset();
  }
  reset() {
    this.event = "";
    this.data = [];
    this.id = null;
  }
  // Feeds decoded text; calls onEvent({event, data, id}) per complete event.
  push(text) {
    this.buf += text;
    for (;;) {
      const m = /\r\n|\r|\n/.exec(this.buf);
      if (!m) return;
      // A lone "\r" at the very end may be the first half of "\r\n": wait for more.
      if (m[0] === "\r" && m.index === this.buf.length - 1) return;
      const line = this.buf.slice(0, m.index);
      this.buf = this.buf.slice(m.index + m[0].length);
      this.line(line);
    }
  }
  line(line) {
    if (line === "") {
      // Our stream's `reset` may carry no data; it is still an event here.
      if (this.data.length || this.event) {
        this.onEvent({ event: this.event || "message", data: this.data.join("\n"), id: this.id });
      }
      this.reset();
      return;
    }
    if (line.startsWith(":")) return; // comment (keep-alive)
    const i = line.indexOf(":");
    const field = i < 0 ? line : line.slice(0, i);
    let value = i < 0 ? "" : line.slice(i + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") this.event = value;
    else if (field === "data") this.data.push(value);
    else if (field === "id" && !value.includes("\0")) this.id = value;
  }
}

// === the API ===

class Refused extends Error {}

async function api(path) {
  const r = await fetch(path, {
    headers: { Authorization: "Bearer " + state.token, Accept: "application/json" },
    cache: "no-store",
  });
  if (r.status === 401) throw new Refused("token refused");
  if (r.status === 403) throw new Forbidden(path);
  if (!r.ok) throw new Error(path + ": " + r.status);
  return r.json();
}

// A 403: the token lacks the permission (GET /v1/hosts needs host.view).
class Forbidden extends Error {}

// The hosts, or null when the token may not see them (host.view): the page shows the
// services all the same.
async function hostsOrNull() {
  try {
    return await api("/v1/hosts");
  } catch (e) {
    if (e instanceof Forbidden) return null;
    throw e;
  }
}

async function refreshLists(epoch) {
  try {
    const [s, h] = await Promise.all([api("/v1/services"), hostsOrNull()]);
    if (epoch !== state.epoch) return;
    state.services = Array.isArray(s.services) ? s.services : [];
    state.hostsHidden = h === null;
    state.hosts = h && Array.isArray(h.hosts) ? h.hosts : [];
    if (!state.selected && state.services.length) {
      state.selected = keyOf(state.services[0].project, state.services[0].name);
    }
    render();
  } catch (e) {
    if (epoch !== state.epoch) return;
    if (e instanceof Refused) refused();
  }
}

function listsSoon(epoch) {
  clearTimeout(state.listsTimer);
  state.listsTimer = setTimeout(() => refreshLists(epoch), LISTS_AFTER_CHANGE_MS);
}

// The stream: connect, read, and on any end or failure reconnect with Last-Event-ID after
// a growing, jittered delay; a 401 stops everything ("token refused").
async function streamLoop(epoch) {
  let backoff = BACKOFF_FIRST_MS;
  while (epoch === state.epoch) {
    const ctrl = new AbortController();
    state.abort = ctrl;
    const headers = { Authorization: "Bearer " + state.token, Accept: "text/event-stream" };
    if (state.lastEventId) headers["Last-Event-ID"] = state.lastEventId;
    setConn("connecting", state.lastEventId ? "reconnecting…" : "connecting…");
    try {
      const r = await fetch(STREAM, { headers, signal: ctrl.signal, cache: "no-store" });
      if (r.status === 401) {
        refused();
        return;
      }
      if (!r.ok || !r.body) throw new Error("HTTP " + r.status);
      setConn("live", "live");
      if (!state.lastEventId) state.entries.clear(); // a fresh snapshot follows
      const parser = new SseParser((ev) => {
        onStreamEvent(ev, epoch);
        backoff = BACKOFF_FIRST_MS; // events flow: the next failure starts over
      });
      const reader = r.body.getReader();
      const decoder = new TextDecoder();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        if (epoch !== state.epoch) return;
        parser.push(decoder.decode(value, { stream: true }));
      }
      throw new Error("the stream ended");
    } catch (e) {
      if (epoch !== state.epoch) return;
      const wait = Math.round(backoff * (0.5 + Math.random() * 0.5));
      const why = e && e.message && e.message.startsWith("HTTP ") ? " (" + e.message + ")" : "";
      setConn("down", "disconnected" + why + ", retrying in " + Math.max(1, Math.round(wait / 1000)) + " s");
      await new Promise((done) => setTimeout(done, wait));
      backoff = Math.min(backoff * 2, BACKOFF_CAP_MS);
    }
  }
}

function onStreamEvent(ev, epoch) {
  if (epoch !== state.epoch) return;
  if (ev.id !== null && ev.id !== "") state.lastEventId = ev.id;
  if (ev.event === "reset") {
    // A gap could not be ruled out: what we hold may be stale (a service deleted in the
    // gap would never get its deletion event); a full snapshot follows.
    state.entries.clear();
    state.resets++;
    state.resetAt = new Date();
    setConn("live", "live (resynced " + state.resetAt.toLocaleTimeString() + ")");
    render();
    return;
  }
  let entry;
  try {
    entry = JSON.parse(ev.data);
  } catch (_) {
    return; // not ours (the stream only sends JSON entries)
  }
  if (!entry || typeof entry.service !== "string") return;
  const key = keyOf(entry.project, entry.service);
  if (entry.deleted) state.entries.delete(key);
  else state.entries.set(key, entry);
  render(key);
  listsSoon(epoch);
}

// === token ===

function refused() {
  state.epoch++;
  if (state.abort) state.abort.abort();
  state.services = [];
  state.hosts = [];
  state.entries.clear();
  render();
  // Not kept for a reload either: the next one is typed in.
  sessionStorage.removeItem(TOKEN_KEY);
  $("token").placeholder = "bearer token";
  setConn("refused", "token refused");
  notice("The server refused this token (401). Type another one above.");
}

function useToken(token) {
  state.epoch++;
  if (state.abort) state.abort.abort();
  clearInterval(state.listsInterval);
  if (token !== state.token && token !== sessionStorage.getItem(TOKEN_KEY)) {
    // Another token: what the last one looked at is none of its business.
    state.selected = "";
    sessionStorage.removeItem(SELECTED_KEY);
  }
  state.token = token;
  state.services = [];
  state.hosts = [];
  state.entries.clear();
  state.lastEventId = "";
  state.resets = 0;
  state.resetAt = null;
  notice("");
  if (!token) {
    sessionStorage.removeItem(TOKEN_KEY);
    $("token").placeholder = "bearer token";
    setConn("idle", "no token");
    render();
    return;
  }
  sessionStorage.setItem(TOKEN_KEY, token);
  $("token").placeholder = "token in use (type to switch)";
  const epoch = state.epoch;
  refreshLists(epoch);
  state.listsInterval = setInterval(() => refreshLists(epoch), LISTS_EVERY_MS);
  streamLoop(epoch);
}

// === rendering ===

function serviceStatus(s) {
  if (s.state === "stopping") return ["draining", "stopping"];
  if (s.rollout === "failed" || s.rollout === "reverted") return ["failed", s.rollout];
  if (s.ready >= s.replicas && s.pending === 0) return ["ready", "ready"];
  return ["starting", s.pending ? "pending" : "starting"];
}

function renderServices() {
  const body = $("services").tBodies[0];
  clear(body);
  for (const s of state.services) {
    const key = keyOf(s.project, s.name);
    const entry = state.entries.get(key);
    // The stream is the fresher source of how many are ready.
    const ready = entry ? entry.endpoints.length : s.ready;
    const [kind, text] = serviceStatus({ ...s, ready });
    const tr = el("tr", { tabindex: "0", "data-key": key },
      el("td", {}, el("strong", {}, s.name)),
      el("td", {}, s.project),
      el("td", { class: "num" }, ready + "/" + s.replicas),
      el("td", {}, pill(kind, text)),
      el("td", {}, s.rollout || ""),
      el("td", { class: "num" }, s.generation ?? ""));
    if (s.pending_reason) tr.title = s.pending_reason;
    if (key === state.selected) tr.className = "selected";
    const pick = () => {
      state.selected = key;
      sessionStorage.setItem(SELECTED_KEY, key);
      render();
    };
    tr.addEventListener("click", pick);
    tr.addEventListener("keydown", (e) => {
      if (e.key === "Enter" || e.key === " ") {
        e.preventDefault();
        pick();
      }
    });
    body.append(tr);
  }
  $("services-count").textContent = state.token ? "(" + state.services.length + ")" : "";
  $("services-empty").hidden = !state.token || state.services.length > 0;
}

function renderEndpoints(changed) {
  const section = $("endpoints-section");
  const key = state.selected;
  const svc = state.services.find((s) => keyOf(s.project, s.name) === key);
  const entry = state.entries.get(key);
  if (!state.token || (!svc && !entry)) {
    // Hidden and emptied: rows of a service that is gone (or of the last token) must not
    // linger in the page, not even out of sight.
    section.hidden = true;
    clear($("endpoints").tBodies[0]);
    clear($("ep-meta"));
    return;
  }
  section.hidden = false;
  $("ep-title").textContent = key;
  const eps = entry ? entry.endpoints : [];
  $("ep-count").textContent = "(" + eps.length + " ready)";
  $("ep-index").textContent = entry ? "index " + entry.index : "waiting for the stream…";

  const meta = $("ep-meta");
  clear(meta);
  for (const [k, v] of Object.entries((entry && entry.meta) || {})) {
    meta.append(el("li", {}, el("span", { class: "k" }, k + "="), String(v)));
  }

  // One column per port name, in the order the endpoints list them.
  const ports = [];
  for (const e of eps) for (const p of Object.keys(e.ports || {})) if (!ports.includes(p)) ports.push(p);
  const head = $("endpoints").tHead.rows[0];
  clear(head);
  for (const h of ["Replica", "State", "Host"]) head.append(el("th", {}, h));
  for (const p of ports) head.append(el("th", {}, p));
  head.append(el("th", {}, "Generation"));

  // An endpoint on a host that stopped reporting is kept until the host's grace period
  // ends (its replica may well still serve): flag it with the host's state.
  const hostState = new Map(state.hosts.map((h) => [h.id, h.state]));
  const body = $("endpoints").tBodies[0];
  clear(body);
  for (const e of eps) {
    const hs = hostState.get(e.host);
    const tr = el("tr", { "data-replica": String(e.replica) },
      el("td", { class: "num" }, e.replica),
      el("td", {}, e.ready === false ? pill(e.state === "draining" ? "draining" : "starting", e.state || "starting") : pill("ready", "ready")),
      hs && hs !== "ready"
        ? el("td", {}, e.host, " ", pill(hostKind(hs), "host " + hs))
        : el("td", {}, e.host));
    for (const p of ports) {
      const port = e.ports ? e.ports[p] : undefined;
      tr.append(el("td", { class: "mono" }, port === undefined ? "–" : hostPort(e.address, port)));
    }
    tr.append(el("td", { class: "num" }, e.generation ?? ""));
    if (changed === key) tr.classList.add("flash");
    body.append(tr);
  }
  $("ep-empty").hidden = !entry || eps.length > 0;
}

function hostPort(address, port) {
  return (String(address).includes(":") ? "[" + address + "]" : address) + ":" + port;
}

// Green ready, amber unreachable (its jobs are kept for the grace period), red lost.
function hostKind(state) {
  return state === "ready" ? "ready" : state === "unreachable" ? "starting" : "failed";
}

function renderHosts() {
  const body = $("hosts").tBodies[0];
  clear(body);
  for (const h of state.hosts) {
    const kind = hostKind(h.state);
    const addrs = el("td", { class: "addrs mono" });
    for (const a of h.addresses || []) {
      addrs.append(el("span", { title: a.interface || "" }, a.ip));
    }
    const pool = h.ports || {};
    const used = pool.used || 0;
    const cap = pool.capacity || 0;
    const fill = el("span", { class: "fill" });
    fill.style.width = (cap ? Math.min(100, (100 * used) / cap) : 0).toFixed(1) + "%";
    const poolCell = el("td", {},
      el("div", { class: "pool" },
        el("span", { class: "track" }, fill),
        el("span", { class: "num" }, used + " / " + cap + " used"),
        pool.unavailable ? el("span", { class: "muted" }, pool.unavailable + " unavailable") : null),
      el("div", { class: "muted mono" }, pool.range || ""));
    body.append(el("tr", {},
      el("td", {}, el("strong", {}, h.id)),
      el("td", {}, pill(kind, h.state)),
      el("td", { class: "mono" }, h.ip_addr || ""),
      addrs,
      el("td", { class: "num" }, h.jobs ?? ""),
      poolCell));
  }
  $("hosts-count").textContent = !state.token ? ""
    : state.hostsHidden ? "(this token lacks host.view)"
    : "(" + state.hosts.length + ")";
}

function render(changed) {
  renderServices();
  renderEndpoints(changed);
  renderHosts();
}

// === start ===

function start() {
  $("token-form").addEventListener("submit", (e) => {
    e.preventDefault();
    useToken($("token").value.trim());
    $("token").value = "";
  });
  $("forget").addEventListener("click", () => useToken(""));
  state.selected = sessionStorage.getItem(SELECTED_KEY) || "";

  const token = tokenFromHash();
  useToken(token !== null ? token : sessionStorage.getItem(TOKEN_KEY) || "");
  // A /ui#token=… link opened in a tab that shows the page already.
  window.addEventListener("hashchange", () => {
    const token = tokenFromHash();
    if (token !== null) useToken(token);
  });
}

// /ui#token=T: takes it and removes it from the address bar (and so from the history and
// from anything copied from there). Null when the fragment has no token.
function tokenFromHash() {
  const token = new URLSearchParams(location.hash.slice(1)).get("token");
  if (token === null) return null;
  history.replaceState(null, "", location.pathname + location.search);
  return token.trim();
}

document.addEventListener("DOMContentLoaded", start);
