// FastSwap Cam panel: plain JS, no build step. State arrives pushed (Server-Sent Events, /api/events);
// changes go out as POSTs carrying the run's token in X-Vcam-Token (the server refuses them otherwise).
"use strict";

const TOKEN = document.querySelector('meta[name="vcam-token"]').content;
const $ = (id) => document.getElementById(id);
const panel = { state: null, stream: null, lastReply: null, previewOn: false, confirming: null };
window.vcamPanel = panel; // read by the browser tests

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") e.className = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else if (v !== null && v !== undefined && v !== false) e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return e;
}

async function post(url, body, headers = {}) {
  const opts = { method: "POST", headers: { "X-Vcam-Token": TOKEN, ...headers }, body };
  if (!(body instanceof Blob) && body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  let reply;
  try {
    const res = await fetch(url, opts);
    reply = await res.json().catch(() => ({ ok: false, error: `HTTP ${res.status}` }));
  } catch (err) {
    reply = { ok: false, error: "the daemon does not answer", hint: "is `vcam run` still running?" };
  }
  panel.lastReply = reply;
  return reply;
}

function say(id, reply, okText) {
  const m = $(id);
  m.className = "msg " + (reply.ok ? "ok" : "bad");
  m.textContent = reply.ok ? okText || "" : reply.error + (reply.hint ? ` (${reply.hint})` : "");
}

function command(cmd) {
  if (panel.stream && panel.state && panel.state.streams.length > 1) cmd.stream = panel.stream;
  return post("/api/command", cmd);
}

function current() {
  const s = panel.state;
  if (!s) return null;
  return s.streams.find((x) => x.name === panel.stream) || s.streams[0];
}

// -- faces ------------------------------------------------------------------------------------
function renderFaces() {
  const st = current();
  const box = $("faces");
  const faces = panel.state.faces;
  const key = JSON.stringify([faces, st.face, panel.confirming]);
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  box.replaceChildren();
  for (const f of faces) {
    const tile = el("div", { class: "face" + (f.name === st.face ? " active" : ""), "data-face": f.name });
    const pick = el(
      "button",
      { class: "pick", title: `switch to ${f.name}`, onclick: () => switchFace(f.name) },
      el("img", { src: `/api/faces/${encodeURIComponent(f.name)}/thumb`, alt: f.name, loading: "lazy" }),
      el("span", {}, f.name),
    );
    tile.append(pick);
    if (f.bank) {
      if (panel.confirming === f.name) {
        tile.append(
          el("div", { class: "confirm" }, "remove?",
            el("button", { class: "yes", onclick: () => removeFace(f.name) }, "yes"),
            el("button", { class: "no", onclick: () => { panel.confirming = null; renderFaces(); } }, "no")),
        );
      } else {
        tile.append(el("button", { class: "remove", title: `remove ${f.name}`, onclick: () => { panel.confirming = f.name; renderFaces(); } }, "×"));
      }
    }
    box.append(tile);
  }
  if (!faces.length) box.append(el("p", { class: "note" }, "No faces yet: add a photo below."));
}

async function switchFace(name) {
  const reply = await command({ face: name });
  say("face-msg", reply, `face: ${reply.face}`);
  if (reply.ok && panel.state) { current().face = reply.face; renderFaces(); }
}

async function removeFace(name) {
  panel.confirming = null;
  const reply = await post(`/api/faces/${encodeURIComponent(name)}/remove`);
  say("face-msg", reply, `removed ${name}`);
}

async function upload(file) {
  if (!file) return;
  const name = $("face-name").value.trim();
  const q = new URLSearchParams({ filename: file.name || "photo.jpg" });
  if (name) q.set("name", name);
  $("face-msg").className = "msg";
  $("face-msg").textContent = `adding ${file.name}…`;
  const reply = await post(`/api/faces?${q}`, file, { "Content-Type": file.type || "application/octet-stream" });
  say("face-msg", reply, `added face ${reply.face}`);
  if (reply.ok) $("face-name").value = "";
}

// -- people and mappings ----------------------------------------------------------------------
function faceSelect(selected, onchange, label) {
  const s = el("select", { "aria-label": label, onchange: (e) => onchange(e.target.value) });
  s.append(el("option", { value: "" }, "— face —"));
  for (const f of panel.state.faces) s.append(el("option", { value: f.name, selected: f.name === selected }, f.name));
  return s;
}

function renderPeople() {
  const st = current();
  const body = $("people").tBodies[0];
  const key = JSON.stringify([st.people, st.mappings, st.mapping_on, panel.state.faces]);
  if (body.dataset.key === key) return;
  body.dataset.key = key;
  body.replaceChildren();
  for (const p of st.people) {
    const who = p.target ? `${p.target}` : `person ${p.track}`;
    const sel = faceSelect(p.source, (v) => v && mapPerson(p.track, v), `face for ${who}`);
    sel.disabled = !st.mapping_on;
    body.append(el("tr", { "data-track": p.track }, el("td", {}, who), el("td", { class: "arrow" }, "→"), el("td", {}, sel)));
  }
  if (!st.people.length) body.append(el("tr", {}, el("td", { class: "note" }, "nobody in view")));
  $("people-note").textContent = st.mapping_on ? "" : "Per-person mapping is off in this run: start `vcam run` with --map TARGET=SOURCE to turn it on.";
  const mb = $("mappings").tBodies[0];
  mb.replaceChildren();
  for (const [target, source] of Object.entries(st.mappings)) {
    mb.append(
      el("tr", { "data-target": target },
        el("td", {}, target), el("td", { class: "arrow" }, "→"),
        el("td", {}, faceSelect(source, (v) => v && mapTarget(target, v), `face for ${target}`)),
        el("td", {}, el("button", { class: "small unmap", onclick: () => unmap(target) }, "unmap"))),
    );
  }
  if (!Object.keys(st.mappings).length) mb.append(el("tr", {}, el("td", { class: "note" }, "no mappings: everyone gets the active face")));
}

async function mapPerson(track, source) {
  const body = { track, source };
  if (panel.stream) body.stream = panel.stream;
  say("map-msg", await post("/api/people", body), `person ${track} → ${source}`);
}
async function mapTarget(target, source) { say("map-msg", await command({ map: { target, source } }), `${target} → ${source}`); }
async function unmap(target) { say("map-msg", await command({ unmap: target }), `${target} unmapped`); }

// -- health -----------------------------------------------------------------------------------
const fmt = (x, d = 1) => (typeof x === "number" ? x.toFixed(d) : "–");

function spark(history) {
  const pts = history.slice(-60);
  const max = Math.max(1, ...pts.map((p) => p[1]));
  const line = (i) => pts.map((p, k) => `${((k / Math.max(1, pts.length - 1)) * 300).toFixed(1)},${(46 - (p[i] / max) * 44).toFixed(1)}`).join(" ");
  $("spark-p50").setAttribute("points", line(0));
  $("spark-p99").setAttribute("points", line(1));
  $("spark-max").textContent = `max ${max.toFixed(1)} ms`;
}

function renderHealth() {
  const st = current();
  const s = st.status;
  $("fps").textContent = `${fmt(s.fps_in)} / ${fmt(s.fps_out)}`;
  $("latency").textContent = `${fmt(s.latency_p50_ms)} / ${fmt(s.latency_p99_ms)}`;
  $("drops").textContent = `${s.dropped_capture} + ${s.dropped_latency}`;
  $("faces-in-view").textContent = s.faces;
  spark(st.history);
  const info = panel.state.info;
  const notes = [`device: ${info.device || "loading…"}`];
  if (s.over_budget) notes.push(["bad", "over the latency budget"]);
  for (const n of st.notes) notes.push([/overloaded|degraded|NaN|paused/.test(n) ? "warn" : "", n]);
  if (!Object.values(s.guarded || {}).some((v) => v)) notes.push("NaN guard: 0");
  notes.push(st.gpu ? [s.gpu.throttle && s.gpu.throttle.length ? "warn" : "", st.gpu] : "GPU telemetry: none");
  $("notes").replaceChildren(...notes.map((n) => (Array.isArray(n) ? el("li", { class: n[0] }, n[1]) : el("li", {}, n))));
  const mb = $("models").tBodies[0];
  mb.replaceChildren(...info.models.map((m) => el("tr", {}, el("td", {}, m.role), el("td", {}, m.model), el("td", {}, m.where))));
  const many = panel.state.streams.length > 1;
  $("streams").hidden = !many;
  if (many) {
    $("streams").tBodies[0].replaceChildren(
      ...panel.state.streams.map((x) =>
        el("tr", { class: x.name === st.name ? "active" : "" },
          el("td", {}, x.name), el("td", {}, x.face || "none"),
          el("td", {}, `${fmt(x.status.fps_in)}/${fmt(x.status.fps_out)}`),
          el("td", {}, `${fmt(x.status.latency_p50_ms)}/${fmt(x.status.latency_p99_ms)}`),
          el("td", {}, `${x.status.dropped_capture}+${x.status.dropped_latency}`))),
    );
  }
}

// -- the desk's settings (one table: vcam.control.commands.SETTINGS) -----------------------------
function renderControls() {
  const st = current();
  const offered = panel.state.controls.filter((c) => c.key in (st.settings || {}));
  $("controls-section").hidden = offered.length === 0;
  const key = JSON.stringify([offered.map((c) => c.key), st.name]);
  const box = $("controls");
  if (box.dataset.key !== key) {
    box.dataset.key = key;
    box.replaceChildren(...offered.map((c) => {
      if (c.kind === "switch") {
        return el("button", { id: `set-${c.key}`, class: "pill", title: c.help, onclick: () => setting(c.key, "toggle") }, c.label);
      }
      return el("label", { class: "amount", title: c.help }, c.label + " ",
        el("input", { id: `set-${c.key}`, type: "range", min: "0", max: "1", step: "0.05",
          onchange: (e) => setting(c.key, Number(e.target.value)) }),
        el("output", { id: `val-${c.key}` }, ""));
    }));
  }
  for (const c of offered) {
    const v = st.settings[c.key];
    const e = $(`set-${c.key}`);
    if (c.kind === "switch") {
      e.textContent = `${c.label} ${v ? "on" : "off"}`;
      e.classList.toggle("off", !v);
    } else if (document.activeElement !== e) {
      e.value = String(v);
      $(`val-${c.key}`).textContent = Number(v).toFixed(2);
    }
  }
}

async function setting(key, value) {
  const reply = await command({ [key]: value });
  say("controls-msg", reply);
  const st = current();
  if (reply.ok && st && reply.settings) { st.settings = reply.settings; render(); }
}

// -- the whole page ---------------------------------------------------------------------------
function render() {
  const s = panel.state;
  if (!panel.stream || !s.streams.some((x) => x.name === panel.stream)) panel.stream = s.streams[0].name;
  const sel = $("stream");
  sel.hidden = s.streams.length < 2;
  if (sel.options.length !== s.streams.length) sel.replaceChildren(...s.streams.map((x) => el("option", { value: x.name }, x.name)));
  sel.value = panel.stream;
  const st = current();
  $("swap").textContent = st.swap ? "swap on" : "swap off";
  $("swap").classList.toggle("off", !st.swap);
  $("pause").textContent = st.paused ? "resume" : "pause";
  $("pause").classList.toggle("paused", st.paused);
  renderFaces();
  renderControls();
  renderPeople();
  renderHealth();
}

function setPreview(on) {
  panel.previewOn = on;
  const img = $("preview");
  $("preview-toggle").textContent = on ? "hide" : "show";
  if (on) {
    img.src = `/api/preview?stream=${encodeURIComponent(panel.stream || "")}&t=${Date.now()}`;
    img.hidden = false;
  } else {
    img.removeAttribute("src"); // closes the stream: the daemon stops making preview frames
    img.hidden = true;
  }
}

function connect() {
  const es = new EventSource("/api/events");
  es.addEventListener("state", (ev) => {
    panel.state = JSON.parse(ev.data);
    panel.updates = (panel.updates || 0) + 1;
    $("conn").className = "dot live";
    render();
  });
  es.onerror = () => { $("conn").className = "dot dead"; };
}

function wire() {
  $("swap").addEventListener("click", () => command({ swap: "toggle" }));
  $("pause").addEventListener("click", async () => {
    const st = current();
    if (!st) return;
    const reply = await command({ pause: !st.paused });
    if (reply.ok) { st.paused = reply.paused; render(); }
  });
  $("stream").addEventListener("change", (e) => { panel.stream = e.target.value; render(); if (panel.previewOn) setPreview(true); });
  $("preview-toggle").addEventListener("click", () => setPreview(!panel.previewOn));
  $("file").addEventListener("change", (e) => { upload(e.target.files[0]); e.target.value = ""; });
  const drop = $("drop");
  for (const t of ["dragenter", "dragover"]) drop.addEventListener(t, (e) => { e.preventDefault(); drop.classList.add("over"); });
  for (const t of ["dragleave", "drop"]) drop.addEventListener(t, () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => { e.preventDefault(); upload(e.dataTransfer.files[0]); });
  connect();
}

wire();
