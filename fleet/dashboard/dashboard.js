// edgefleet fleet dashboard: no build step, no dependencies.
// Data: GET /v1/devices once, then one server-sent event stream (/v1/events) with batched
// device changes and rollout progress. The table is virtualised: only the visible rows of
// a 1,000-device fleet are in the DOM. Auth: the operator key from #key=... or the form,
// sent as a bearer token (fetch streams the SSE so the key never goes in a URL).
"use strict";

const ROW_H = 30;
const COLUMNS = [
  ["device_id", "device"], ["group", "group"], ["online", "online"],
  ["deployment_id", "deployment"], ["model", "model"], ["fps", "fps"],
  ["latency_p95", "p95 ms"], ["gpu_util", "GPU %"], ["gpu_temp", "temp °C"],
  ["gpu_power", "power W"], ["outbox_depth", "outbox"], ["escalation_rate", "esc/min"],
  ["agreement", "agree"], ["last_seen", "last seen"],
];
const CHARTS = [
  ["fps", "fps"], ["latency_p95", "latency p95 (ms)"], ["gpu_util", "GPU util (%)"],
  ["gpu_temp", "GPU temp (°C)"], ["gpu_power", "GPU power (W)"], ["outbox_depth", "outbox depth"],
  ["escalation_rate", "escalations / min"], ["agreement", "edge-vs-cloud agreement"],
];

const state = {
  key: null, devices: new Map(), view: [], dirty: true, sortKey: "device_id", sortDir: 1,
  filter: "", group: "", selected: null, flashed: new Set(), deployments: [],
  renderQueued: false, detailTimer: null, blobUrls: [],
};
const $ = (id) => document.getElementById(id);

function readKey() {
  const m = /(?:^|[#&])key=([^&]+)/.exec(location.hash);
  if (m) {
    sessionStorage.setItem("ef-key", decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  }
  return sessionStorage.getItem("ef-key");
}

async function api(path) {
  const resp = await fetch(path, { headers: { Authorization: "Bearer " + state.key } });
  if (resp.status === 401 || resp.status === 403) {
    sessionStorage.removeItem("ef-key");
    throw new Error("the API key was refused");
  }
  if (!resp.ok) throw new Error(path + ": HTTP " + resp.status);
  return resp.json();
}

// --- formatting ------------------------------------------------------------------------

function num(v, digits) {
  return v === null || v === undefined ? "–" : Number(v).toFixed(digits);
}
function span_of(s) {
  s = Math.max(0, s);
  if (s < 60) return Math.round(s) + " s";
  if (s < 3600) return Math.round(s / 60) + " min";
  if (s < 86400) return Math.round(s / 3600) + " h";
  return Math.round(s / 86400) + " d";
}
function ago(iso) {
  if (!iso) return "never";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return Math.round(s) + " s ago";
  if (s < 3600) return Math.round(s / 60) + " min ago";
  if (s < 86400) return Math.round(s / 3600) + " h ago";
  return Math.round(s / 86400) + " d ago";
}
function el(tag, cls, text) {
  const node = document.createElement(tag);
  if (cls) node.className = cls;
  if (text !== undefined) node.textContent = text;
  return node;
}
function statusClass(status) {
  return { healthy: "ok", completed: "ok", applying: "warn", canary: "warn", rolling: "warn",
    sent: "warn", failed: "bad", halted: "bad", rolled_back: "bad" }[status] || "muted";
}

function cell(d, key) {
  const span = el("span");
  switch (key) {
    case "online": {
      const label = d.online ? "online"
        : d.offline_since ? "offline for " + span_of((Date.now() - d.offline_since) / 1000)
        : "offline";
      span.append(el("i", "dot" + (d.online ? " on" : "")), label);
      span.className = d.online ? "ok" : "muted";
      break;
    }
    case "deployment_id":
      span.textContent = d.deployment_id ? d.deployment_id + " · " + d.deployment_status : "–";
      span.className = statusClass(d.deployment_status);
      span.title = d.desired_deployment_id ? "desired: " + d.desired_deployment_id : "";
      break;
    case "fps": span.textContent = num(d.fps, 1); span.className = "num"; break;
    case "latency_p95": span.textContent = num(d.latency_p95, 0); span.className = "num"; break;
    case "gpu_util": span.textContent = num(d.gpu_util, 0); span.className = "num"; break;
    case "gpu_temp":
      span.textContent = num(d.gpu_temp, 0);
      span.className = "num " + (d.gpu_temp >= 85 ? "bad" : d.gpu_temp >= 75 ? "warn" : "");
      break;
    case "gpu_power": span.textContent = num(d.gpu_power, 1); span.className = "num"; break;
    case "outbox_depth":
      span.textContent = num(d.outbox_depth, 0);
      span.className = "num " + (d.outbox_depth >= 1000 ? "bad" : d.outbox_depth >= 100 ? "warn" : "");
      break;
    case "escalation_rate": span.textContent = num(d.escalation_rate, 1); span.className = "num"; break;
    case "agreement":
      span.textContent = d.agreement === null || d.agreement === undefined
        ? "–" : Math.round(d.agreement * 100) + "%";
      span.className = "num " + (d.agreement !== null && d.agreement < 0.8 ? "warn" : "");
      break;
    case "last_seen": span.textContent = ago(d.last_seen); span.title = d.last_seen || ""; break;
    default: span.textContent = d[key] === null || d[key] === undefined ? "–" : String(d[key]);
  }
  return span;
}

// --- the virtualised device table --------------------------------------------------------

function rebuildView() {
  const f = state.filter.toLowerCase();
  const list = [];
  for (const d of state.devices.values()) {
    if (state.group && d.group !== state.group) continue;
    if (f && !(d.device_id + " " + d.group + " " + (d.model || "") + " " + (d.deployment_id || ""))
      .toLowerCase().includes(f)) continue;
    list.push(d);
  }
  const k = state.sortKey, dir = state.sortDir;
  list.sort((a, b) => {
    const x = a[k], y = b[k];
    if (x === y) return a.device_id < b.device_id ? -1 : 1;
    if (x === null || x === undefined) return 1;
    if (y === null || y === undefined) return -1;
    return (x < y ? -1 : 1) * dir;
  });
  state.view = list;
  state.dirty = false;
}

function renderHead() {
  const head = $("thead");
  head.replaceChildren();
  for (const [key, label] of COLUMNS) {
    const span = el("span", state.sortKey === key ? "sorted" + (state.sortDir > 0 ? " asc" : "") : "", label);
    span.dataset.key = key;
    head.append(span);
  }
}

function renderRows() {
  if (state.dirty) rebuildView();
  const vp = $("viewport");
  $("spacer").style.height = state.view.length * ROW_H + "px";
  const first = Math.max(0, Math.floor(vp.scrollTop / ROW_H) - 5);
  const count = Math.ceil(vp.clientHeight / ROW_H) + 10;
  const rows = $("rows");
  rows.style.transform = "translateY(" + first * ROW_H + "px)";
  const frag = document.createDocumentFragment();
  for (const d of state.view.slice(first, first + count)) {
    const row = el("div", "row" + (d.device_id === state.selected ? " selected" : ""));
    if (state.flashed.has(d.device_id)) row.classList.add("flash");
    row.dataset.device = d.device_id;
    for (const [key] of COLUMNS) row.append(cell(d, key));
    frag.append(row);
  }
  rows.replaceChildren(frag);
  state.flashed.clear();
  let online = 0;
  for (const d of state.devices.values()) if (d.online) online += 1;
  $("stat-devices").textContent = state.devices.size + " devices";
  $("stat-online").textContent = online + " online";
}

function scheduleRender() {
  if (state.renderQueued) return;
  state.renderQueued = true;
  requestAnimationFrame(() => { state.renderQueued = false; renderRows(); });
}

function applyDevices(list, flash) {
  const groups = new Set();
  for (const d of list) {
    // the server says how long it has been offline; the page counts on from there
    if (!d.online && d.offline_for_s !== null && d.offline_for_s !== undefined) {
      d.offline_since = Date.now() - d.offline_for_s * 1000;
    }
    state.devices.set(d.device_id, d);
    if (flash) state.flashed.add(d.device_id);
    groups.add(d.group);
  }
  const select = $("group");
  const known = new Set(Array.from(select.options).map((o) => o.value));
  for (const g of Array.from(groups).sort()) {
    if (!known.has(g)) select.append(new Option(g, g));
  }
  state.dirty = true;
  scheduleRender();
  if (state.selected && list.some((d) => d.device_id === state.selected)) scheduleDetail();
}

// --- rollouts ----------------------------------------------------------------------------

function renderRollouts(deployments) {
  state.deployments = deployments;
  const box = $("rollouts");
  box.replaceChildren();
  const active = deployments.filter((d) => d.status === "canary" || d.status === "rolling").length;
  $("stat-rollouts").textContent = active + " active rollout" + (active === 1 ? "" : "s");
  if (!deployments.length) { box.append(el("p", "empty", "No deployments yet.")); return; }
  for (const dep of deployments) {
    const row = el("div", "rollout");
    row.dataset.deployment = dep.id;
    row.append(el("b", "", dep.id), el("span", statusClass(dep.status), dep.status));
    const bar = el("div", "progress");
    const total = dep.targets.length || 1;
    for (const s of ["healthy", "applying", "sent", "failed", "rolled_back"]) {
      const n = dep.counts[s] || 0;
      if (n) { const i = el("i", s); i.style.width = (100 * n) / total + "%"; i.title = n + " " + s; bar.append(i); }
    }
    row.append(bar, el("span", "muted", (dep.counts.healthy || 0) + "/" + dep.targets.length + " healthy"));
    const canaryTargets = dep.targets.filter((t) => t.role === "canary");
    let canaries = canaryTargets.slice(0, 6).map((t) => t.device_id + " (" + t.state + ")").join(", ");
    if (canaryTargets.length > 6) canaries += " +" + (canaryTargets.length - 6) + " more";
    const models = dep.models.map((m) => m.name + "@" + m.version).join(", ");
    row.append(el("div", "detail", "group " + dep.group + " · " + dep.image + " · " + (models || "no models")
      + " · canary: " + (canaries || "–") + (dep.error ? " · " + dep.error : "")));
    box.append(row);
  }
}

// --- device detail and charts --------------------------------------------------------------

function chart(points, key, label) {
  const wrap = el("div", "chart");
  wrap.append(el("h3", "", label));
  const values = points.map((p) => p[key]).filter((v) => v !== null && v !== undefined);
  const ns = "http://www.w3.org/2000/svg";
  const svg = document.createElementNS(ns, "svg");
  svg.setAttribute("viewBox", "0 0 300 90");
  svg.setAttribute("preserveAspectRatio", "none");
  if (values.length) {
    const t0 = Date.parse(points[0].ts), t1 = Date.parse(points[points.length - 1].ts);
    const lo = Math.min(...values), hi = Math.max(...values);
    const span = hi - lo || 1, tspan = t1 - t0 || 1;
    const coords = points.filter((p) => p[key] !== null && p[key] !== undefined).map((p) => {
      const x = 30 + (270 * (Date.parse(p.ts) - t0)) / tspan;
      const y = hi === lo ? 45 : 80 - (70 * (p[key] - lo)) / span;
      return x.toFixed(1) + "," + y.toFixed(1);
    });
    const line = document.createElementNS(ns, "polyline");
    line.setAttribute("points", coords.length === 1 ? coords[0] + " 300," + coords[0].split(",")[1] : coords.join(" "));
    svg.append(line);
    for (const [v, y] of [[hi, 12], [lo, 82]]) {
      const t = document.createElementNS(ns, "text");
      t.setAttribute("x", "0"); t.setAttribute("y", String(y));
      t.textContent = Number(v).toFixed(v >= 100 ? 0 : 1);
      svg.append(t);
    }
  } else {
    const t = document.createElementNS(ns, "text");
    t.setAttribute("x", "110"); t.setAttribute("y", "50"); t.textContent = "no data";
    svg.append(t);
  }
  wrap.append(svg);
  return wrap;
}

async function showDetail(id) {
  state.selected = id;
  $("detail-section").hidden = false;
  $("detail-id").textContent = id;
  scheduleRender();
  try {
    const [dev, hist] = await Promise.all([
      api("/v1/devices/" + encodeURIComponent(id)),
      api("/v1/devices/" + encodeURIComponent(id) + "/history?hours=6"),
    ]);
    if (state.selected !== id) return;
    const meta = $("detail-meta");
    meta.replaceChildren();
    const facts = [
      ["group", dev.group], ["agent", dev.agent_version || "–"], ["model", dev.model || "–"],
      ["deployment", dev.deployment_id ? dev.deployment_id + " (" + dev.deployment_status + ")" : "–"],
      ["desired", dev.desired_deployment_id || "–"], ["image", dev.running_image || "–"],
      ["CPU", num(dev.cpu_pct, 0) + "%"],
      ["last seen", ago(dev.last_seen)],
      ...(dev.drift || []).map((d) => ["drift " + d.model, "KS " + num(d.ks, 2) + " (n=" + d.current_n + ")"]),
    ];
    for (const [k, v] of facts) { const s = el("span", "", k + " "); s.append(el("b", "", v)); meta.append(s); }
    const charts = $("charts");
    charts.replaceChildren(...CHARTS.map(([key, label]) => chart(hist.points, key, label)));
  } catch (err) {
    $("detail-meta").textContent = String(err.message || err);
  }
}

function scheduleDetail() {
  if (state.detailTimer) return;
  state.detailTimer = setTimeout(() => { state.detailTimer = null; if (state.selected) showDetail(state.selected); }, 2000);
}

// --- escalated cases -------------------------------------------------------------------------

async function loadCases() {
  let data;
  try { data = await api("/v1/fleet/cases?limit=24"); } catch (err) { return; }
  const box = $("cases");
  for (const url of state.blobUrls) URL.revokeObjectURL(url);
  state.blobUrls = [];
  box.replaceChildren();
  if (!data.cases.length) { box.append(el("p", "empty", "No cases yet.")); return; }
  for (const c of data.cases) {
    const card = el("div", "case");
    const img = el("img", "thumb");
    img.alt = "case " + c.case_id;
    const src = c.thumbnail_url || c.image_url;
    if (src && src.startsWith("/")) {
      fetch(src, { headers: { Authorization: "Bearer " + state.key } })
        .then((r) => (r.ok ? r.blob() : null))
        .then((b) => { if (b) { const u = URL.createObjectURL(b); state.blobUrls.push(u); img.src = u; } })
        .catch(() => {});
    } else if (src && src.startsWith("data:")) {
      img.src = src;
    }
    card.append(img);
    let verdict = c.verdict;
    if (verdict && typeof verdict === "object") {
      // an answer that read nothing says so; the route is where it went, not what it read
      const read = (verdict.result || []).map((r) => r.text || r.label).filter(Boolean).join(" ");
      verdict = read || "nothing read" + (verdict.route ? " (route " + verdict.route + ")" : "");
    }
    card.append(el("div", "verdict", verdict || "pending"));
    card.append(el("div", "muted", (c.device_id || "") + " · " + (c.reason || "") + " · " + ago(c.ts || c.created_at)));
    box.append(card);
  }
}

// --- fleet events (e.g. the faults `edgefleet demo --chaos` saw) ------------------------------

function addEvents(events) {
  const box = $("events");
  if (events.length) box.querySelector(".empty")?.remove();
  for (const e of events) {
    const item = el("li", e.healthy_after_s == null ? "event open" : "event", e.message);
    item.title = (e.source || "") + " · " + ago(e.created_at);
    box.prepend(item);
  }
  while (box.children.length > 50) box.lastChild.remove();
}

async function loadEvents() {
  try { addEvents((await api("/v1/fleet/events?limit=20")).events); } catch (err) { /* next event */ }
}

// --- the live stream ---------------------------------------------------------------------------

function setLive(on, text) {
  const badge = $("conn");
  badge.className = "badge " + (on ? "on" : "off");
  badge.textContent = text;
}

function dispatch(event, data) {
  if (event === "devices") applyDevices(JSON.parse(data), true);
  else if (event === "deployments") renderRollouts(JSON.parse(data));
  else if (event === "events") addEvents(JSON.parse(data));
  else if (event === "hello") setLive(true, "live");
}

async function stream() {
  for (;;) {
    try {
      const resp = await fetch("/v1/events", {
        headers: { Authorization: "Bearer " + state.key, Accept: "text/event-stream" },
      });
      if (!resp.ok || !resp.body) throw new Error("HTTP " + resp.status);
      const reader = resp.body.getReader();
      const decoder = new TextDecoder();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += decoder.decode(value, { stream: true }).replace(/\r\n/g, "\n");
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          let event = "message";
          const data = [];
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) event = line.slice(6).trim();
            else if (line.startsWith("data:")) data.push(line.slice(5).replace(/^ /, ""));
          }
          if (data.length) dispatch(event, data.join("\n"));
        }
      }
    } catch (err) {
      // falls through to the reconnect below
    }
    setLive(false, "reconnecting…");
    await new Promise((r) => setTimeout(r, 2000));
    try { applyDevices((await api("/v1/devices")).devices, false); } catch (err) { /* next round */ }
  }
}

// --- start -----------------------------------------------------------------------------------

async function start() {
  $("key-form").hidden = true;
  $("main").hidden = false;
  renderHead();
  try {
    const [devs, deps] = await Promise.all([api("/v1/devices"), api("/v1/deployments?limit=10")]);
    applyDevices(devs.devices, false);
    renderRollouts(deps.deployments);
  } catch (err) {
    setLive(false, String(err.message || err));
    $("main").hidden = true;
    $("key-form").hidden = false;
    return;
  }
  loadCases();
  loadEvents();
  setInterval(loadCases, 10000);
  setInterval(scheduleRender, 5000); // keeps "last seen" fresh
  stream();
}

function wire() {
  $("viewport").addEventListener("scroll", scheduleRender, { passive: true });
  $("thead").addEventListener("click", (e) => {
    const key = e.target.dataset && e.target.dataset.key;
    if (!key) return;
    state.sortDir = state.sortKey === key ? -state.sortDir : 1;
    state.sortKey = key;
    state.dirty = true;
    renderHead();
    scheduleRender();
  });
  $("rows").addEventListener("click", (e) => {
    const row = e.target.closest(".row");
    if (row) showDetail(row.dataset.device);
  });
  $("detail-close").addEventListener("click", () => {
    state.selected = null;
    $("detail-section").hidden = true;
    scheduleRender();
  });
  $("filter").addEventListener("input", (e) => { state.filter = e.target.value; state.dirty = true; scheduleRender(); });
  $("group").addEventListener("change", (e) => { state.group = e.target.value; state.dirty = true; scheduleRender(); });
  $("key-form").addEventListener("submit", (e) => {
    e.preventDefault();
    state.key = $("key-input").value.trim();
    sessionStorage.setItem("ef-key", state.key);
    start();
  });
}

wire();
state.key = readKey();
if (state.key) start(); else { $("key-form").hidden = false; setLive(false, "no key"); }
