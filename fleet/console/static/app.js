// edge-fleet console: a small single-page app over the fleet's JSON API.
// Every text from the fleet (device-supplied strings are hostile) goes into the page through
// text nodes, element.textContent or setAttribute on a fixed attribute name: never as HTML.
"use strict";

const HEALTH_OK_S = 120;      // last contact within 2 min, else amber (docs/console.md)
const HEALTH_STALE_S = 900;   // a fleet without device state: red past 15 min
const RANGES = [["1 h", 3600], ["6 h", 6 * 3600], ["24 h", 86400], ["7 d", 7 * 86400], ["28 d", 28 * 86400]];
const SVG = "http://www.w3.org/2000/svg";
let me = null;
// The one pending self-refresh of the page shown (devices, a live rollout); a new page or the
// login screen cancels it.
let pageTimer = null;

function canAct() {
  // operators and admins act; a viewer's console shows no action (the fleet would answer 403)
  return me !== null && me.role !== "viewer";
}

function refreshIn(ms, redraw) {
  // redraw the page after ms if it is still the one shown; after a failure other than 401/403
  // (the fleet restarting, a network error) it says so and tries again after ms
  clearTimeout(pageTimer);
  const here = location.hash;
  pageTimer = setTimeout(() => {
    if (location.hash !== here || me === null) return;
    redraw().catch((err) => {
      refused(err);
      if (err.status !== 401 && err.status !== 403 && location.hash === here) refreshIn(ms, redraw);
    });
  }, ms);
}

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "onclick" || k === "onchange" || k === "onsubmit") node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v === true ? "" : String(v));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  return node;
}

function csrfToken() {
  for (const part of document.cookie.split(";")) {
    const [k, ...v] = part.trim().split("=");
    if (k === "edge_fleet_csrf" || k === "__Host-edge_fleet_csrf") return v.join("=");
  }
  return "";
}

class ApiError extends Error {
  constructor(status, detail) {
    super(typeof detail === "string" ? detail : JSON.stringify(detail));
    this.status = status;
  }
}

async function api(method, path, body) {
  const headers = { "Accept": "application/json" };
  if (method !== "GET") headers["X-CSRF-Token"] = csrfToken();
  if (body !== undefined) headers["Content-Type"] = "application/json";
  const resp = await fetch(path, {
    method, headers, credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (resp.status === 204) return null;
  let doc = null;
  try { doc = await resp.json(); } catch (e) { doc = null; }
  if (resp.status === 401 && path !== "/v1/session") { showLogin("Your session has ended: log in again."); }
  if (!resp.ok) throw new ApiError(resp.status, doc && doc.detail ? doc.detail : resp.statusText);
  return doc;
}

function flash(text, ok, whileLive) {
  // whileLive: the message speaks of what the page shows while it refreshes; the page removes
  // it when it stops refreshing (unflashLive)
  const box = document.getElementById("flash");
  box.textContent = text;
  box.className = ok ? "ok" : "";
  box.dataset.whileLive = whileLive ? "1" : "";
  box.hidden = false;
}

function unflashLive() {
  const box = document.getElementById("flash");
  if (box.dataset.whileLive) { box.hidden = true; box.dataset.whileLive = ""; }
}

// A message for the page the console goes to next (the router clears the previous page's).
let nextFlash = null;

function flashNext(text, ok) {
  nextFlash = [text, ok];
}

function refused(err) {
  // 401: the login screen already replaced the page. 403: the page's data may be stale or not
  // the caller's to see: cleared, with what was refused and why.
  if (err.status === 401) return;
  if (err.status !== 403) { flash(`Error ${err.status || ""}: ${err.message}`); return; }
  clearTimeout(pageTimer);
  const who = me ? `${me.username} (${me.role})` : "this account";
  view(el("h1", {}, "Not allowed"),
    el("p", { id: "refused" }, `The fleet refused this to ${who}: ${err.message}`),
    el("p", { class: "muted" }, "An admin can give the account a role that may do it " +
      "(docs/console.md, Roles). Choose another page above."));
  flash(`Refused (403): ${err.message}`);
}

// A cell that never wraps inside (a timestamp, model@version): a span of class "nowrap".
function nowrap(text) { return el("span", { class: "nowrap" }, text); }
function whenCell(iso) { return nowrap(when(iso)); }

function notFound(parts, err) {
  // what the address names and the fleet does not have, in words
  if (parts[0] === "device") return `No device named ${parts[1]}.`;
  if (parts[0] === "rollout") return `No rollout ${parts[1]}.`;
  return `Not found: ${err.message}`;
}

function pageFailed(parts, err) {
  // a page that could not be drawn: the error replaces the previous page's content
  if (err.status === 401 || err.status === 403) { refused(err); return; }
  const missing = err.status === 404;
  view(el("h1", {}, missing ? "Not found" : "This page could not be loaded"),
    el("p", { id: "page-error", class: "error" }, missing ? notFound(parts, err)
      : `Error ${err.status || ""}: ${err.message}`),
    el("p", { class: "muted" }, missing ? "Choose a page above." : "Reload to try again, or choose a page above."));
}

function when(iso) { return iso ? iso.replace("T", " ").replace(/\.\d+/, "").replace("+00:00", "Z") : "never"; }
function fmtEpoch(s) { return new Date(s * 1000).toISOString().slice(0, 16).replace("T", " ") + "Z"; }

function lastContact(d) {
  // an upload (last_seen) or a health report, whichever is newer
  const times = [d.last_seen, d.health_received_at].filter(Boolean);
  return times.length ? times.reduce((a, b) => (Date.parse(a) >= Date.parse(b) ? a : b)) : null;
}

function health(d) {
  // [colour class, state text]; the rule is in docs/console.md ("Device state and health")
  const last = lastContact(d);
  const status = d.health ? d.health.status : null;
  const state = d.state || null;
  if (!last) return ["down", state || "never seen"];
  const age = (Date.now() - Date.parse(last)) / 1000;
  if (state === "offline" || status === "red" || (!state && age > HEALTH_STALE_S)) {
    return ["down", state || "silent"];
  }
  if (status === "yellow" || age > HEALTH_OK_S) return ["stale", state || "late"];
  return ["ok", state || "online"];
}

function stateCell(d) {
  const [cls, label] = health(d);
  return el("span", { class: "device-state" }, el("span", { class: `health health-${cls}`, title: label }), " ", label);
}

function healthReport(d) {
  // the agent's own summary: overall status and the reasons of its non-green components
  if (!d.health) return "no report";
  const reasons = d.health.reasons || [];
  return reasons.length ? `${d.health.status}: ${reasons.join("; ")}` : String(d.health.status);
}

function table(id, headers, rows, rowAttrs, emptyText) {
  // rowAttrs(i): attributes of row i (class, data-*); an empty table gets one row saying so
  // (emptyText, default "nothing yet")
  const body = rows.length ? rows.map((r, i) => el("tr", rowAttrs ? rowAttrs(i) : {}, r.map((c) => el("td", {}, c))))
    : [el("tr", { class: "empty" }, el("td", { colspan: headers.length, class: "muted" }, emptyText || "nothing yet"))];
  return el("table", { id },
    el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))), el("tbody", {}, body));
}

function view(...children) {
  // null children (a link that does not apply) are left out, not printed as "null"
  const main = document.getElementById("view");
  main.replaceChildren(...children.filter((c) => c !== null && c !== undefined));
}

// --- login ------------------------------------------------------------------------------------

function showLogin(message) {
  me = null;
  clearTimeout(pageTimer);
  document.getElementById("top").hidden = true;
  document.getElementById("whoami").textContent = "";
  document.getElementById("login").hidden = false;
  document.getElementById("login-error").textContent = message || "";
  document.getElementById("flash").hidden = true;
  view();
}

async function login(ev) {
  ev.preventDefault();
  const error = document.getElementById("login-error");
  error.textContent = "";
  try {
    await api("POST", "/v1/session", {
      username: document.getElementById("login-user").value,
      password: document.getElementById("login-password").value,
    });
    document.getElementById("login-password").value = "";
    await start();
  } catch (err) {
    error.textContent = err.status === 429 ? `Too many attempts: ${err.message}` : "Wrong username or password.";
  }
}

async function logout() {
  try { await api("DELETE", "/v1/session"); } catch (err) { /* already gone */ }
  showLogin();
}

// --- pages ------------------------------------------------------------------------------------

const DEVICES_POLL_MS = 15000;

async function devicesPage() {
  const [list, running] = await Promise.all([api("GET", "/v1/devices"), api("GET", "/v1/models/running")]);
  const perDevice = {};
  for (const r of running.running) {
    (perDevice[r.device_id] ||= []).push(nowrap(`${r.stream || "(all)"}: ${r.name}@${r.version}`));
  }
  const rows = list.devices.map((d) => [
    el("a", { href: `#/device/${encodeURIComponent(d.device_id)}`, class: "device-link" }, d.device_id),
    stateCell(d), healthReport(d), whenCell(lastContact(d)), d.agent_version || "-",
    (perDevice[d.device_id] || [nowrap(d.model_name ? `${d.model_name}@${d.model_version}` : "-")])
      .flatMap((m, i) => (i ? [", ", m] : [m])),
    `${d.backlog.alerts ?? "-"} / ${d.backlog.aggregates ?? "-"}`,
    d.tags.join(", ") || "-",
  ]);
  view(el("h1", {}, `Devices (${list.devices.length})`),
    el("p", { class: "muted", id: "devices-refresh" }, `Refreshes every ${DEVICES_POLL_MS / 1000} s ` +
      `(last ${new Date().toISOString().slice(11, 19)} UTC).`),
    table("devices", ["Device", "State", "Health report", "Last contact (UTC)", "Agent",
      "Model per stream", "Backlog alerts / aggregates", "Tags"], rows));
  refreshIn(DEVICES_POLL_MS, devicesPage);
}

function niceStep(raw) {
  // the smallest 1, 2 or 5 x 10^k at least raw (raw > 0)
  const mag = 10 ** Math.floor(Math.log10(raw));
  for (const m of [1, 2, 5, 10]) if (m * mag >= raw * (1 - 1e-9)) return m * mag;
  return 10 * mag;
}

function yScale(highest) {
  // [axis top, tick step]: about 4 steps of 1, 2 or 5 x 10^k covering highest x 1.1
  const want = highest > 0 && Number.isFinite(highest) ? highest * 1.1 : 1;
  const step = niceStep(want / 4);
  return [Math.ceil(want / step - 1e-9) * step, step];
}

function tickLabel(v, step) {
  const digits = Math.max(0, -Math.floor(Math.log10(step)));
  return v.toFixed(Math.min(digits, 12));
}

function plot(series) {
  const W = 860, H = 260, L = 50, R = 10, T = 10, B = 30;
  const scores = series.points.filter((p) => p[1] !== null);
  const thr = series.thresholds.map((t) => t[1]);
  if (series.last_threshold !== null) thr.push(series.last_threshold);
  const [top, step] = yScale(Math.max(...scores.map((p) => p[1]), ...thr));
  const x = (t) => L + ((t - series.since) / (series.until - series.since)) * (W - L - R);
  const y = (v) => T + (1 - v / top) * (H - T - B);
  const root = svg("svg", { class: "plot", id: "score-plot", width: W, height: H,
    viewBox: `0 0 ${W} ${H}`, "data-points": scores.length, role: "img" });
  root.append(svg("line", { class: "axis", x1: L, y1: H - B, x2: W - R, y2: H - B }));
  root.append(svg("line", { class: "axis", x1: L, y1: T, x2: L, y2: H - B }));
  for (let i = 0; i <= 4; i++) {
    const t = series.since + (i / 4) * (series.until - series.since);
    const label = svg("text", { x: x(t), y: H - 10, "text-anchor": i === 0 ? "start" : i === 4 ? "end" : "middle" });
    label.textContent = fmtEpoch(t);
    root.append(label);
  }
  for (let k = 0; k * step <= top * (1 + 1e-9); k++) {
    const yl = svg("text", { x: 2, y: y(k * step) + 4, class: "y-tick" });
    yl.textContent = tickLabel(k * step, step);
    root.append(yl);
  }
  const line = svg("polyline", { class: "score",
    points: scores.map((p) => `${x(p[0]).toFixed(1)},${y(p[1]).toFixed(1)}`).join(" ") });
  root.append(line);
  if (scores.length < 60) {
    for (const p of scores) root.append(svg("circle", { class: "dot", cx: x(p[0]), cy: y(p[1]), r: 2 }));
  }
  if (thr.length) {
    const steps = [];
    let current = series.thresholds.length ? series.thresholds[0][1] : series.last_threshold;
    steps.push(`${x(series.since)},${y(current)}`);
    for (const [t, v] of series.thresholds) {
      steps.push(`${x(t)},${y(current)}`, `${x(t)},${y(v)}`);
      current = v;
    }
    steps.push(`${x(series.until)},${y(current)}`);
    root.append(svg("polyline", { class: "threshold", points: steps.join(" ") }));
  }
  return root;
}

// The stream's model state: the running model's, and a newer report (a candidate on its way,
// rejected or rolled back) as a note of its own, e.g. "rejected skab-wstat@3: <reason>".
function modelStateCell(s) {
  const u = s.update;
  const note = u ? el("div", { class: "model-update muted" }, nowrap(`${u.state} ${u.name}@${u.version}`),
    u.reason ? `: ${u.reason}` : "") : null;
  return el("span", {}, s.model_state || "-", note);
}

async function devicePage(id) {
  const enc = encodeURIComponent(id);
  const [listed, streams, alerts, models] = await Promise.all([
    api("GET", `/v1/devices?device=${enc}`),
    api("GET", `/v1/devices/${enc}/streams`),
    api("GET", `/v1/alerts?device=${enc}&limit=50`),
    api("GET", `/v1/devices/${enc}/models?limit=50`),
  ]);
  const device = listed.devices.length ? listed.devices[0] : null;
  const sources = {};
  for (const s of (device && device.health && device.health.streams) || []) sources[s.stream] = s;
  const plotBox = el("div", { id: "plot-box" });
  const rangeBar = el("div", { class: "controls", id: "ranges" });
  let stream = streams.length ? streams[0].stream : null;
  let range = null;  // seconds before the newest score, or null: all the stream's data
  async function draw() {
    if (stream === null) { plotBox.replaceChildren(el("p", { class: "muted" }, "No aggregates yet.")); return; }
    const base = `/v1/devices/${enc}/series?stream=${encodeURIComponent(stream)}`;
    // every answer carries the data's extent: a small one first, then the range drawn ends at
    // the newest score (all data, or the zoom before it), so no range is empty of scores
    const probe = await api("GET", `${base}&points=10`);
    if (probe.first_at === null) {
      plotBox.replaceChildren(el("p", { class: "muted", id: "plot-empty" }, `No aggregates of ${stream} yet.`));
      return;
    }
    const until = probe.last_at + 1;  // until is exclusive: the newest interval is inside
    const since = range === null ? probe.first_at : until - range;
    const s = await api("GET", `${base}&since=${since}&until=${until}`);
    const now = Date.now() / 1000;
    const caption = el("p", {}, `Max score per interval of ${stream}, ${fmtEpoch(s.since)} to ` +
      `${fmtEpoch(s.until)}` + (s.bucket_s ? ` (buckets of ${Math.round(s.bucket_s)} s)` : "") +
      "; dashed: threshold" + (s.current_threshold !== null
        ? ` (now ${s.current_threshold.toPrecision(4)}, from the newest alert)` : ""));
    const note = s.last_at > now ? el("p", { class: "muted", id: "plot-ahead" },
      `The newest score (${fmtEpoch(s.last_at)}) is later than now: the device clock is ahead or a ` +
      "simulator runs faster than real time. The range ends at the newest score.") : null;
    const drawn = s.points.some((p) => p[1] !== null) ? plot(s)
      : el("p", { class: "muted", id: "plot-empty" }, "no scores in this range");
    plotBox.replaceChildren(...[caption, drawn, note].filter(Boolean));
  }
  for (const [label, secs] of [["All data", null], ...RANGES]) {
    rangeBar.append(el("button", { type: "button", "data-range": secs ?? "all", class: secs === range ? "active" : null,
      onclick: async (ev) => {
        range = secs;
        for (const b of rangeBar.children) b.className = b === ev.target ? "active" : "";
        await draw();
      } }, label));
  }
  const streamRows = streams.map((s) => [
    el("a", { href: "#", onclick: async (ev) => { ev.preventDefault(); stream = s.stream; await draw(); } }, s.stream),
    nowrap(s.model_name ? `${s.model_name}@${s.model_version}` : "-"), modelStateCell(s),
    sources[s.stream] ? sources[s.stream].state + (sources[s.stream].reason ? `: ${sources[s.stream].reason}` : "") : "-",
  ]);
  view(el("h1", {}, `Device ${id}`), el("h2", {}, "State and health"), deviceHealth(device),
    el("h2", {}, "Streams"), table("streams", ["Stream", "Model", "Model state", "Source (health report)"], streamRows),
    el("h2", {}, "Score and threshold"), rangeBar, plotBox,
    el("h2", {}, "Recent alerts"), alertTable(alerts.items, () => devicePage(id)),
    el("h2", {}, "Camera snapshots"), snapshotGallery(alerts.items),
    el("h2", {}, "Model history"),
    table("model-history", ["Received (UTC)", "Stream", "Model", "State", "Reason", "Rollout"],
      models.reports.map((r) => [whenCell(r.received_at), r.stream || "(all)", nowrap(`${r.name}@${r.version}`),
        r.state, r.reason || "", r.rollout_id ?? "-"])));
  await draw();
}

// Camera snapshots: the newest SNAPSHOTS_SHOWN alerts that have images, each its frame (JPEG)
// and heatmap (PNG) side by side. The <img> loads with the session cookie (same origin).
const SNAPSHOTS_SHOWN = 6;
const SNAPSHOT_KINDS = [["snapshot", "Camera frame"], ["heatmap", "Anomaly heatmap"]];

function snapshotUrl(a, kind) {
  return `/v1/devices/${encodeURIComponent(a.device_id)}/alerts/${encodeURIComponent(a.id)}/${kind}`;
}

function enlarge(src, label) {
  const box = document.getElementById("enlarged");
  const img = document.getElementById("enlarged-img");
  img.src = src;
  img.alt = label;
  document.getElementById("enlarged-caption").textContent = label;
  box.showModal();
}

function snapshotThumb(a, kind, what) {
  const label = `${what} of alert ${a.id} (${a.stream}, ${when(a.window_start)}, ` +
    `score ${a.score.toPrecision(4)})`;
  const src = snapshotUrl(a, kind);
  const img = el("img", { src, alt: label, class: "thumb-img", "data-kind": kind });
  const button = el("button", { type: "button", class: "thumb", title: `${what}: click to enlarge`,
    onclick: () => enlarge(src, label) }, img);
  img.addEventListener("error", () => button.replaceWith(
    el("span", { class: "thumb thumb-missing muted" }, `${what}: not available`)));
  return el("div", { class: "thumb-box" }, button, el("span", { class: "muted" }, what));
}

function snapshotGallery(items) {
  const found = items.filter((a) => (a.snapshots || []).length);
  if (!found.length) {
    return el("p", { id: "snapshots", class: "muted" }, "No camera snapshots among the recent alerts.");
  }
  const shown = found.slice(0, SNAPSHOTS_SHOWN);
  const figures = shown.map((a) => el("figure", { class: "snapshot", "data-alert": a.id },
    el("div", { class: "snapshot-pair" }, SNAPSHOT_KINDS.filter(([kind]) => a.snapshots.includes(kind))
      .map(([kind, what]) => snapshotThumb(a, kind, what))),
    el("figcaption", {}, el("strong", {}, `${a.stream} · ${a.event}`), ` ${when(a.window_start)} · score `,
      `${a.score.toPrecision(4)} (threshold ${a.threshold.toPrecision(4)})`, el("br"),
      el("span", { class: "muted episode" }, a.id))));
  const more = found.length > shown.length ? el("p", { class: "muted" },
    `The newest ${shown.length} of ${found.length} recent alerts with snapshots.`) : null;
  return el("div", { id: "snapshots" }, el("div", { class: "snapshot-grid" }, figures), more);
}

function deviceHealth(d) {
  if (d === null) return el("p", { id: "device-health", class: "muted" }, "Not an active device.");
  const h = d.health;
  const disk = h && h.disk ? `${(h.disk.used_bytes / 1048576).toFixed(1)} MiB` +
    (h.disk.budget_bytes ? ` of ${(h.disk.budget_bytes / 1048576).toFixed(1)} MiB` : "") : "-";
  return table("device-health", ["State", "Health report", "Last contact (UTC)", "Report received (UTC)",
    "Agent", "Backlog alerts / aggregates", "Store disk"], [[stateCell(d), healthReport(d),
    whenCell(lastContact(d)), whenCell(d.health_received_at), d.agent_version || "-",
    `${d.backlog.alerts ?? "-"} / ${d.backlog.aggregates ?? "-"}`, disk]]);
}

function ackText(a) {
  return `${a.acked_by} at ${when(a.acked_at)}` + (a.ack_note ? `: ${a.ack_note}` : "");
}

function ackCell(a, raised, reload) {
  // an episode is acknowledged on its raised record; its updated/cleared rows show that state
  if (a.event !== "raised") {
    return raised && raised.acked_by ? `episode: ${ackText(raised)}` : el("span", { class: "muted" }, "on the raised row");
  }
  if (a.acked_by) return ackText(a);
  if (!canAct()) return el("span", { class: "muted" }, "not acknowledged");
  const note = el("input", { class: "ack-note", maxlength: 500, placeholder: "note (optional)",
    "aria-label": "acknowledgement note" });
  return el("span", { class: "ack-box" }, note, el("button", { type: "button", class: "ack", onclick: async () => {
    const text = note.value.trim();
    try {
      await api("POST", `/v1/alerts/${encodeURIComponent(a.id)}/ack`, text ? { note: text } : {});
      flash("Acknowledged.", true); await reload();
    } catch (err) { refused(err); }
  } }, "Acknowledge"));
}

function alertTable(items, reload) {
  // one row per alert record, newest first; rows of one episode share a colour band
  const raisedOf = {};
  for (const a of items) if (a.event === "raised") raisedOf[a.episode_id] = a;
  const band = {};
  for (const a of items) if (!(a.episode_id in band)) band[a.episode_id] = Object.keys(band).length % 2;
  return table("alerts", ["Window start (UTC)", "Event", "Episode", "Device", "Stream", "Score", "Threshold",
    "Model", "Top channels", "Acknowledged"], items.map((a) => [
    whenCell(a.window_start), el("span", { class: `event event-${a.event}` }, a.event),
    el("span", { class: "episode", title: a.episode_id }, a.episode_id),
    a.device_id, a.stream, a.score.toPrecision(4), a.threshold.toPrecision(4),
    nowrap(`${a.model_name}@${a.model_version}`),
    (a.payload.top_channels || []).map((c) => c.channel).join(", "),
    ackCell(a, raisedOf[a.episode_id], reload),
  ]), (i) => ({ class: `band-${band[items[i].episode_id]}`, "data-event": items[i].event,
    "data-episode": items[i].episode_id }));
}

function timeline(items) {
  // one mark per alert record on a time axis (filled: its episode is not acknowledged), newest on the right
  const W = 860, H = 56, L = 10, R = 10;
  const times = items.map((a) => Date.parse(a.window_start) / 1000);
  const root = svg("svg", { class: "plot", id: "alert-timeline", width: W, height: H,
    viewBox: `0 0 ${W} ${H}`, "data-alerts": items.length, role: "img" });
  root.append(svg("line", { class: "axis", x1: L, y1: 24, x2: W - R, y2: 24 }));
  if (!items.length) return root;
  const lo = Math.min(...times), hi = Math.max(...times, lo + 60);
  const x = (t) => L + ((t - lo) / (hi - lo)) * (W - L - R);
  const ackedEpisodes = new Set(items.filter((a) => a.acked_by).map((a) => a.episode_id));
  items.forEach((a, i) => root.append(svg("circle", { class: ackedEpisodes.has(a.episode_id) ? "acked" : "alert-mark",
    cx: x(times[i]).toFixed(1), cy: 24, r: 4 })));
  for (const [t, anchor] of [[lo, "start"], [hi, "end"]]) {
    const label = svg("text", { x: x(t), y: 50, "text-anchor": anchor });
    label.textContent = fmtEpoch(t);
    root.append(label);
  }
  return root;
}

async function alertsPage(params) {
  const q = new URLSearchParams(params);
  const since = q.get("since_s");
  const query = new URLSearchParams();
  for (const k of ["device", "stream", "tag"]) if (q.get(k)) query.set(k, q.get(k));
  if (since) query.set("since", String(Date.now() / 1000 - Number(since)));
  if (q.get("acked")) query.set("acked", q.get("acked"));
  query.set("limit", "500");
  const found = await api("GET", `/v1/alerts?${query}`);
  const field = (name, label) => el("label", {}, label, el("input", { name, value: q.get(name) || "" }));
  const form = el("form", { class: "controls", id: "alert-filters", onsubmit: (ev) => {
    ev.preventDefault();
    const data = new URLSearchParams(new FormData(ev.target));
    for (const [k, v] of [...data]) if (!v) data.delete(k);
    location.hash = `#/alerts?${data}`;
  } }, field("device", "Device"), field("stream", "Stream"), field("tag", "Tag"),
  el("label", {}, "Since", el("select", { name: "since_s" }, el("option", { value: "" }, "any time"),
    RANGES.map(([label, s]) => el("option", { value: s, selected: String(s) === since }, `last ${label}`)))),
  el("label", {}, "State", el("select", { name: "acked" }, el("option", { value: "" }, "all"),
    el("option", { value: "false", selected: q.get("acked") === "false" }, "unacknowledged"),
    el("option", { value: "true", selected: q.get("acked") === "true" }, "acknowledged"))),
  el("button", { type: "submit" }, "Filter"));
  view(el("h1", {}, `Alerts (${found.items.length})`), form, timeline(found.items),
    alertTable(found.items, () => alertsPage(params)));
}

async function rolloutsPage() {
  const [list, models] = await Promise.all([api("GET", "/v1/rollouts"), api("GET", "/v1/models")]);
  const names = [...new Set(models.models.map((m) => m.name))];
  const form = el("form", { class: "controls", id: "rollout-form", onsubmit: async (ev) => {
    ev.preventDefault();
    const f = new FormData(ev.target);
    const body = { name: f.get("name"), version: Number(f.get("version")) };
    const target = String(f.get("target") || "").trim();
    if (f.get("target_kind") === "tag") body.tag = target;
    else body.devices = target.split(/[\s,]+/).filter(Boolean);
    if (f.get("canary")) body.canary_percent = Number(f.get("canary"));
    if (f.get("stream")) body.stream = f.get("stream");
    try {
      const r = await api("POST", "/v1/rollouts", body);
      flashNext(`Rollout ${r.id} created (${r.state}).`, true);  // shown on its page
      location.hash = `#/rollout/${r.id}`;
    } catch (err) { refused(err); }
  } },
  el("label", {}, "Model", el("select", { name: "name" }, names.map((n) => el("option", { value: n }, n)))),
  el("label", {}, "Version", el("input", { name: "version", type: "number", min: 1, required: true,
    list: "rollout-versions" })),
  el("datalist", { id: "rollout-versions" }, models.models.map((m) =>
    el("option", { value: String(m.version) }, `${m.name}@${m.version}`))),
  el("label", {}, "Target", el("select", { name: "target_kind" }, el("option", { value: "tag" }, "tag"),
    el("option", { value: "devices" }, "devices"))),
  el("label", {}, "Tag or device ids", el("input", { name: "target", required: true })),
  el("label", {}, "Canary %", el("input", { name: "canary", type: "number", min: 0.1, max: 100, step: "any" })),
  el("label", {}, "Stream (empty: all)", el("input", { name: "stream" })),
  el("button", { type: "submit", id: "rollout-create" }, "Create rollout"));
  const rows = list.rollouts.map((r) => [
    el("a", { href: `#/rollout/${r.id}` }, String(r.id)), nowrap(`${r.name}@${r.version}`),
    r.target_tag ? `tag ${r.target_tag}` : `${r.target_devices.length} device(s)`, r.stream || "(all)",
    r.superseded_by != null ? `${r.state}, superseded by ${r.superseded_by}` : r.state,
    Object.entries(r.counts).map(([k, v]) => `${k}: ${v}`).join(", "), r.reason || "", whenCell(r.updated_at)]);
  view(el("h1", {}, "Rollouts"), canAct() ? el("h2", {}, "New rollout") : null, canAct() ? form : null,
    table("rollouts", ["Id", "Model", "Target", "Stream", "State", "Devices", "Reason", "Updated (UTC)"], rows));
}

// Rollout page: redrawn every ROLLOUT_POLL_MS while the rollout is not finished.
const ROLLOUT_POLL_MS = 7000;
const ROLLOUT_LIVE = new Set(["canary", "promoted", "paused"]);

// Devices that made the rollout's version active (the ones an abort needs a rollback key for).
function activeOnIt(r) {
  return r.devices.filter((d) => d.state === "active" && d.version === r.version);
}

function abortQuestion(r) {
  const label = `${r.name}@${r.version}`;
  const active = activeOnIt(r).map((d) => d.device_id);
  const stopped = r.devices.length - active.length;
  let text = `Abort rollout ${r.id} (${label})? ` +
    `${stopped} device(s) not yet active on ${label} stop and stay on the version they run.`;
  if (active.length) {
    text += r.can_roll_back
      ? ` ${active.length} device(s) active on ${label} (${active.join(", ")}) are sent back to ` +
        "their previous version (signed rollback), where it is known and in the registry."
      : ` ${active.length} device(s) active on ${label} (${active.join(", ")}) KEEP it: this fleet ` +
        "has no rollback key (start edge-fleet serve with --rollback-key to send them back).";
  }
  return text;
}

// After an abort with a rollback key: the devices a signed rollback is taking back to their
// previous version, until each reports it (rolled_back) or refuses it.
function rollingBack(r) {
  if (r.state !== "aborted" || !r.can_roll_back) return [];
  return r.devices.filter((d) => d.previous_version != null &&
    ((d.state === "active" && d.version === r.version) ||
     (d.version === d.previous_version && !["rolled_back", "rejected", "active"].includes(d.state))));
}
// How long an aborted rollout's page keeps refreshing while rollbacks are on their way.
const ROLLBACK_WATCH_MS = 15 * 60 * 1000;

function abortOutcome(r) {
  const label = `${r.name}@${r.version}`;
  const keep = activeOnIt(r).filter((d) => !r.can_roll_back || d.previous_version == null);
  const back = rollingBack(r);
  if (!keep.length && back.length) {
    flash(`Rollout ${r.id} aborted: ${back.map((d) => `${d.device_id} goes back to ${r.name}@${d.previous_version}`).join(", ")} ` +
      "(signed rollback). This page refreshes until each device reports it (a minute or so).", true, true);
    return;
  }
  if (!keep.length) { flash(`Rollout ${r.id} aborted: no device keeps ${label}.`, true); return; }
  const why = r.can_roll_back
    ? "no previous version known for them (see the reason line)"
    : "this fleet has no rollback key: start edge-fleet serve with --rollback-key (docs/rollouts.md)";
  flash(`Warning: rollout ${r.id} aborted, but ${keep.map((d) => d.device_id).join(", ")} ` +
    `keep ${label}: ${why}.`, false);
}

// Why nothing more happens to a rollout by itself (its page stops refreshing), or null.
function rolloutFinal(r) {
  if (r.superseded_by != null) return `superseded by rollout ${r.superseded_by}`;
  if (r.state === "aborted" && !rollingBack(r).length) return "aborted";
  if (r.state === "promoted" && r.devices.length &&
      r.devices.every((d) => d.state === "active" && d.version === r.version)) {
    return "completed: every device is active on it";
  }
  return null;
}

function deviceState(d) {
  return d.state ? (d.version != null ? `${d.state} (@${d.version})` : d.state) : "none";
}

async function rolloutPage(id) {
  clearTimeout(pageTimer);
  const r = await api("GET", `/v1/rollouts/${encodeURIComponent(id)}`);
  const back = rollingBack(r);
  const final = rolloutFinal(r);
  const live = final === null && (ROLLOUT_LIVE.has(r.state) ||
    (back.length > 0 && Date.now() - Date.parse(r.updated_at) < ROLLBACK_WATCH_MS));
  const act = (action) => el("button", { type: "button", id: `rollout-${action}`, onclick: async () => {
    try {
      // expected_state: refused (409) if another operator changed it since the operator looked
      let seen = r;
      if (action === "abort") {
        // the question counts devices: from the rollout as it is now, not as last drawn
        seen = await api("GET", `/v1/rollouts/${encodeURIComponent(r.id)}`);
        if (!window.confirm(abortQuestion(seen))) return;
      }
      const out = await api("POST", `/v1/rollouts/${r.id}/${action}?expected_state=${encodeURIComponent(seen.state)}`);
      if (action === "abort") abortOutcome(out); else flash(`Rollout ${r.id}: ${action} done.`, true);
      await rolloutPage(id);
    }
    catch (err) { refused(err); }
  } }, action[0].toUpperCase() + action.slice(1));
  view(el("h1", {}, `Rollout ${r.id}: ${r.name}@${r.version}`),
    el("p", {}, "State: ", el("strong", { id: "rollout-state" }, r.state),
      r.reason ? el("span", { id: "rollout-reason" }, ` (${r.reason})`) : "",
      ` · target ${r.target_tag ? "tag " + r.target_tag : "devices"} · stream ${r.stream || "(all)"}` +
      ` · canary ${r.canary_percent ?? 100} % · halts after ${r.halt_after_failures} failure(s) · `,
      el("span", { id: "rollout-refresh" }, live ? `refreshes every ${ROLLOUT_POLL_MS / 1000} s`
        : final ? `final (${final}): not refreshed` : "not refreshed (reload to see changes)")),
    r.superseded_by != null ? el("p", { id: "rollout-superseded" }, "Superseded by ",
      el("a", { href: `#/rollout/${r.superseded_by}` }, `rollout ${r.superseded_by}`),
      ": its devices follow that one now, so no action applies to this one.") : "",
    back.length ? el("p", { id: "rollout-rolling-back" }, `Rolling back: ` +
      back.map((d) => `${d.device_id} to ${r.name}@${d.previous_version} (${deviceState(d)})`).join(", ") +
      ". The agent verifies the signed rollback, runs it in shadow, then reports rolled_back.") : "",
    // only what the fleet accepts now (r.actions), and nothing for a viewer
    canAct() ? el("div", { class: "controls", id: "rollout-actions" }, r.actions.length ? r.actions.map(act)
      : el("span", { class: "muted" }, "No action applies now.")) : null,
    table("rollout-devices", ["Device", "Canary", "Assigned", "Previous version", "State (version)", "Reason", "Reported (UTC)"],
      r.devices.map((d) => [d.device_id, d.canary ? "yes" : "no", d.assigned ? "yes" : "no",
        d.previous_version ?? "-", deviceState(d), d.reason || "", whenCell(d.reported_at)])));
  if (!live) unflashLive();  // "this page refreshes until ..." is no longer true
  if (live) refreshIn(ROLLOUT_POLL_MS, () => rolloutPage(id));
}

async function registryPage() {
  const [models, running] = await Promise.all([api("GET", "/v1/models"), api("GET", "/v1/models/running")]);
  const where = {};
  for (const r of running.running) (where[`${r.name}@${r.version}`] ||= []).push(r.stream ? `${r.device_id}/${r.stream}` : r.device_id);
  const push = el("form", { class: "controls", id: "push-form", onsubmit: async (ev) => {
    ev.preventDefault();
    const file = ev.target.elements.archive.files[0];
    if (!file) return;
    try {
      const resp = await fetch("/v1/models", { method: "POST", credentials: "same-origin", body: file,
        headers: { "Content-Type": "application/gzip", "X-CSRF-Token": csrfToken() } });
      const doc = await resp.json();
      if (!resp.ok) throw new ApiError(resp.status, doc.detail);
      await registryPage();
      flash(`Pushed ${doc.name}@${doc.version} (signed by ${doc.key_id}).`, true);
    } catch (err) { refused(err); }
  } }, el("label", {}, "Signed package (.tar.gz: edge-fleet model sign, then model pack)",
    el("input", { type: "file", name: "archive", accept: ".tar.gz,.tgz,application/gzip", required: true })),
  el("button", { type: "submit", id: "push-submit" }, "Push"));
  view(el("h1", {}, "Model registry"), canAct() ? el("h2", {}, "Push a package") : null, canAct() ? push : null,
    table("models", ["Model", "Version", "Signer (key id)", "Size",
    "Uploaded (UTC)", "By", "Description", "Running on"], models.models.map((m) => [
    m.name, m.version, m.key_id, `${(m.size / 1024).toFixed(1)} KiB`, whenCell(m.uploaded_at), m.uploaded_by,
    m.description, (where[`${m.name}@${m.version}`] || []).join(", ") || "-"])));
}

const AUDIT_PAGE = 100;

async function auditPage(params) {
  // filters actor/action and paging by entry id ("before"), as GET /v1/audit takes them
  const q = new URLSearchParams(params);
  const query = new URLSearchParams({ limit: String(AUDIT_PAGE) });
  for (const k of ["actor", "action", "before"]) if (q.get(k)) query.set(k, q.get(k));
  const page = await api("GET", `/v1/audit?${query}`);
  const last = page.entries.length ? page.entries[page.entries.length - 1].id : null;
  const field = (name, label) => el("label", {}, label, el("input", { name, value: q.get(name) || "", maxlength: 64 }));
  const form = el("form", { class: "controls", id: "audit-filters", onsubmit: (ev) => {
    ev.preventDefault();
    const data = new URLSearchParams(new FormData(ev.target));
    for (const [k, v] of [...data]) if (!v.trim()) data.delete(k);
    location.hash = `#/audit?${data}`;
  } }, field("actor", "Who"), field("action", "Action (e.g. alert.ack)"), el("button", { type: "submit" }, "Filter"));
  const older = new URLSearchParams(query);
  older.delete("limit");
  if (last !== null) older.set("before", String(last));
  const links = el("p", { class: "controls", id: "audit-paging" },
    q.get("before") ? el("a", { href: `#/audit?${new URLSearchParams([...older].filter(([k]) => k !== "before"))}` }, "Newest") : null,
    last !== null && page.entries.length === AUDIT_PAGE ? el("a", { href: `#/audit?${older}`, id: "audit-older" }, "Older entries") : null);
  const filtered = ["actor", "action", "before"].some((k) => q.get(k));
  view(el("h1", {}, "Audit log"), form, table("audit", ["When (UTC)", "Who", "Via", "Action", "Target", "From", "Detail"],
    page.entries.map((e) => [when(e.at), e.actor, e.via, e.action, e.target || "", e.address || "",
      el("span", { class: "detail", title: JSON.stringify(e.detail) }, JSON.stringify(e.detail))]),
    null, filtered ? "No entries match these filters." : "No entries yet."), links);
}

// Webhooks (admin only, as the API): the subscriptions and their deliveries, dead letters first.
const DELIVERY_STATES = [["dead", "dead letters"], ["pending", "pending"], ["delivered", "delivered"]];

async function webhooksPage(params) {
  const q = new URLSearchParams(params);
  const state = DELIVERY_STATES.some(([s]) => s === q.get("state")) ? q.get("state") : "dead";
  const [hooks, found] = await Promise.all([api("GET", "/v1/webhooks"),
    api("GET", `/v1/webhooks/deliveries?state=${state}&limit=100`)]);
  const urlOf = {};
  for (const w of hooks.webhooks) urlOf[w.id] = w.url;
  const tabs = el("p", { class: "controls", id: "delivery-states" }, DELIVERY_STATES.map(([s, label]) =>
    el("a", { href: `#/webhooks?state=${s}`, class: s === state ? "active-tab" : null }, label)));
  const redeliver = (d) => el("button", { type: "button", class: "redeliver", onclick: async () => {
    try {
      await api("POST", `/v1/webhooks/deliveries/${d.id}/redeliver`);
      flash(`Delivery ${d.id} queued again (attempts from 0).`, true);
      await webhooksPage(params);
    } catch (err) { refused(err); }
  } }, "Redeliver");
  const rows = found.deliveries.map((d) => [String(d.id), urlOf[d.webhook_id] || `webhook ${d.webhook_id}`,
    d.event, String(d.attempts), d.last_status ?? "-", d.last_error || "",
    when(d.created_at), d.state === "pending" ? `next ${when(d.next_attempt_at)}` : when(d.finished_at),
    el("span", { class: "detail", title: d.body }, d.body),
    d.state === "pending" ? "" : redeliver(d)]);
  view(el("h1", {}, "Webhooks"),
    table("webhooks", ["Id", "URL", "Events", "Added (UTC)"], hooks.webhooks.map((w) => [
      String(w.id), w.url, w.events.join(", "), when(w.created_at)])),
    el("h2", {}, state === "dead" ? `Dead letters (${found.deliveries.length})` :
      `Deliveries: ${state} (${found.deliveries.length})`), tabs,
    el("p", { class: "muted" }, "A delivery is dead after the fleet's last retry failed " +
      "(edge-fleet serve --webhook-max-attempts). Redeliver queues it again from attempt 0, " +
      "with the same body and delivery id. Newest first, at most 100."),
    table("deliveries", ["Id", "Webhook", "Event", "Attempts", "Last status", "Last error",
      "Queued (UTC)", "Finished (UTC)", "Body", ""], rows, (i) => ({ "data-state": found.deliveries[i].state,
      "data-delivery": found.deliveries[i].id })));
}

// --- router -----------------------------------------------------------------------------------

async function route() {
  if (me === null) return;
  clearTimeout(pageTimer);
  document.getElementById("flash").hidden = true;
  if (nextFlash !== null) { flash(...nextFlash); nextFlash = null; }
  const [path, query] = (location.hash.slice(1) || "/devices").split("?");
  const parts = path.split("/").filter(Boolean).map(decodeURIComponent);
  try {
    if (parts[0] === "device" && parts[1]) await devicePage(parts[1]);
    else if (parts[0] === "alerts") await alertsPage(query || "");
    else if (parts[0] === "rollouts") await rolloutsPage();
    else if (parts[0] === "rollout" && parts[1]) await rolloutPage(parts[1]);
    else if (parts[0] === "registry") await registryPage();
    else if (parts[0] === "audit") await auditPage(query || "");
    else if (parts[0] === "webhooks") await webhooksPage(query || "");
    else await devicesPage();
  } catch (err) {
    pageFailed(parts, err);
  }
  document.getElementById("view").dataset.route = location.hash;  // this page is drawn
}

async function start() {
  try {
    me = await api("GET", "/v1/session");
  } catch (err) {
    showLogin();
    return;
  }
  document.getElementById("login").hidden = true;
  document.getElementById("top").hidden = false;
  document.getElementById("whoami").textContent = `${me.username} (${me.role})`;
  document.getElementById("nav-webhooks").hidden = me.role !== "admin";  // the API is admin-only
  await route();
}

document.addEventListener("DOMContentLoaded", () => {
  const enlarged = document.getElementById("enlarged");
  enlarged.addEventListener("click", () => enlarged.close());  // anywhere, the image included
  document.getElementById("login-form").addEventListener("submit", login);
  document.getElementById("logout").addEventListener("click", logout);
  window.addEventListener("hashchange", route);
  start();
});
