// FastSwap Cam panel: plain JS, no build step. State arrives pushed (/api/events, read as a stream);
// every API request carries the run's token in X-Vcam-Token, which only this script adds: a printed
// link holds a one-time code after '#' (never the token), traded once at /api/once; the token is kept
// in this tab's sessionStorage (kept apart by origin, port included), never in a cookie, and the page
// loads again without the code (no history entry holds it). After a daemon restart the page proves the pairing key it holds
// in memory to the server, after the server proved it first, and gets the new run's token.
"use strict";

const $ = (id) => document.getElementById(id);
const STALE_MS = 1900; // no pushed state for this long (one comes every second): the daemon is not answering
const panel = { verified: true, state: null, stream: null, lastReply: null, previewOn: false, previewGen: 0, confirming: null, live: false, key: null, thumbs: {} };
window.vcamPanel = panel; // read by the browser tests

function takeToken() {
  // A printed link carries a one-time code (#once=...), an older run's URL the token (#token=...):
  // either leaves the URL at once, and the page loads again at "/" (location.replace: no entry of
  // the tab's history, its typed URL included, holds it; replaceState would leave it there).
  const h = new URLSearchParams(location.hash.slice(1));
  if (h.get("once") || h.get("token")) {
    if (h.get("once")) sessionStorage.setItem("vcam-once", h.get("once"));
    else sessionStorage.setItem("vcam-token", h.get("token"));
    location.replace(location.pathname);
    panel.leaving = true;
    return null;
  }
  return sessionStorage.getItem("vcam-token");
}
panel.token = takeToken();
window.addEventListener("hashchange", takeToken); // the URL opened in a tab already on the panel

async function redeem() {
  // The one-time code traded once for the token; a used, expired or foreign one: the page says why.
  const code = sessionStorage.getItem("vcam-once");
  if (!code) return;
  sessionStorage.removeItem("vcam-once");
  let reply;
  try {
    const res = await fetch("/api/once", { method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify({ code }) });
    reply = await res.json();
  } catch (err) {
    reply = { error: "the daemon does not answer", hint: "is `vcam run` still running? Then `vcam panel` prints a fresh link" };
  }
  if (reply.token) {
    panel.token = reply.token;
    sessionStorage.setItem("vcam-token", reply.token);
  } else if (!panel.token) {
    panel.refused = reply.error.charAt(0).toUpperCase() + reply.error.slice(1) + ". To open the panel, " + reply.hint + ".";
  }
}
const auth = (extra = {}) => ({ "X-Vcam-Token": panel.token || "", ...extra });
panel.get = (url) => fetch(url, { headers: auth(), cache: "no-store" }); // for the tests too
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// -- a restarted daemon: proofs both ways before the new token is taken ------------------------------
const hex = (buf) => [...new Uint8Array(buf)].map((b) => b.toString(16).padStart(2, "0")).join("");
async function mac(text) {
  const k = await crypto.subtle.importKey("raw", new TextEncoder().encode(panel.key), { name: "HMAC", hash: "SHA-256" }, false, ["sign"]);
  return hex(await crypto.subtle.sign("HMAC", k, new TextEncoder().encode(text)));
}
async function learnKey() {
  try {
    const res = await panel.get("/api/session");
    if (!res.ok) return;
    const reply = await res.json();
    panel.key = reply.key;
    // [panel] keep_token: kept in this origin's storage too, so a page loaded again (a dock after OBS
    // restarts) proves it to the running vcam, whose answer it checks first; else none is kept.
    if (reply.remember) localStorage.setItem("vcam-pairing", reply.key);
    else localStorage.removeItem("vcam-pairing");
  } catch (err) { /* tried again after the next connect */ }
}
async function resume() {
  panel.why = null;
  if (!panel.key) return false;
  const mine = hex(crypto.getRandomValues(new Uint8Array(24)));
  const json = { "Content-Type": "application/json" };
  try {
    const hello = await (await fetch("/api/hello", { method: "POST", headers: json, body: JSON.stringify({ nonce: mine }) })).json();
    if (!hello.nonce || hello.proof !== (await mac(`vcam-server|${mine}|${hello.nonce}`))) {
      panel.why = "A server at this address did not prove it is this vcam: not reconnecting to it (if it is vcam, open a fresh link from `vcam panel`).";
      return false;
    }
    const proof = await mac(`vcam-page|${hello.nonce}|${mine}`);
    const res = await fetch("/api/resume", { method: "POST", headers: json, body: JSON.stringify({ nonce: hello.nonce, proof }) });
    const reply = await res.json();
    if (!reply.token) return false;
    panel.token = reply.token;
    sessionStorage.setItem("vcam-token", reply.token);
    panel.resumed = (panel.resumed || 0) + 1;
    learnKey(); // this run's word on keeping the key ([panel] keep_token may have changed)
    return true;
  } catch (err) {
    return false;
  }
}

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
  if (!panel.verified) {
    panel.lastReply = { ok: false, error: "the daemon does not answer", hint: "is `vcam run` still running?" };
    return panel.lastReply;
  }
  const opts = { method: "POST", headers: auth(headers), body };
  if (!(body instanceof Blob) && body !== undefined) {
    opts.headers["Content-Type"] = "application/json";
    opts.body = JSON.stringify(body);
  }
  let reply;
  try {
    const res = await fetch(url, opts);
    reply = await res.json().catch(() => ({ ok: false, error: `HTTP ${res.status}` }));
    if (res.status === 401 || res.status === 403) reply = { ok: false, error: "this page's pass is out of date", hint: "reconnecting; or open a fresh link from `vcam panel`" };
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
function thumb(name) {
  // fetched with the token (an <img src> could not carry it), kept as a blob URL per face
  const img = el("img", { alt: name });
  let got = panel.thumbs[name];
  if (!got && panel.verified) {
    got = panel.thumbs[name] = panel.get(`/api/faces/${encodeURIComponent(name)}/thumb`)
      .then((r) => (r.ok ? r.blob() : null)).then((b) => (b ? URL.createObjectURL(b) : null))
      .catch(() => null);
    got.then((u) => { if (!u) delete panel.thumbs[name]; });
  }
  if (got) got.then((u) => { if (u) img.src = u; });
  return img;
}

// Focus is kept across the tiles' rebuilds: on the same face's same button, else where an action
// said (panel.focusNext: {face, role} with role the button's class, or "choose"), else "choose…".
function focusFace(want) {
  if (want.face === undefined) { $(want.role).focus(); return true; }
  const tile = [...$("faces").children].find((t) => t.dataset.face === want.face);
  const target = tile && tile.querySelector("." + want.role);
  if (target) target.focus();
  return !!target;
}

function focusAfter(want) {
  // where focus goes after an action, once the page shows its outcome (within 10 s)
  panel.focusNext = { ...want, until: Date.now() + 10000 };
  const a = document.activeElement;
  if ((!a || a === document.body || $("faces-section").contains(a)) && focusFace(want)) panel.focusNext = null;
}

function renderFaces() {
  const st = current();
  const box = $("faces");
  const faces = panel.state.faces;
  for (const n of Object.keys(panel.thumbs)) if (!faces.some((f) => f.name === n)) delete panel.thumbs[n]; // re-added: fetched anew
  const key = JSON.stringify([faces, st.face, panel.confirming]);
  if (box.dataset.key === key) return;
  box.dataset.key = key;
  const a = document.activeElement;
  const had = a && box.contains(a) && a.closest(".face") ? { face: a.closest(".face").dataset.face, role: a.classList[0] } : null;
  buildFaces(box, faces, st);
  const a2 = document.activeElement;
  const free = !a2 || a2 === document.body || $("faces-section").contains(a2);
  let want = panel.focusNext && panel.focusNext.until > Date.now() && free ? panel.focusNext : null;
  if (want && focusFace(want)) panel.focusNext = null;
  else if (had && !focusFace(had) && !want) $("choose").focus(); // its face is gone
}

function buildFaces(box, faces, st) {
  box.replaceChildren();
  for (const f of faces) {
    const tile = el("div", { class: "face" + (f.name === st.face ? " active" : ""), "data-face": f.name });
    const pick = el(
      "button",
      { class: "pick", title: `switch to ${f.name}`, onclick: () => switchFace(f.name) },
      thumb(f.name),
      el("span", {}, f.name),
    );
    tile.append(pick);
    if (f.bank) {
      if (panel.confirming === f.name) {
        const no = () => { panel.confirming = null; focusAfter({ face: f.name, role: "remove" }); renderFaces(); };
        tile.append(
          el("div", { class: "confirm", role: "group", "aria-label": `remove ${f.name}?`, onkeydown: (e) => { if (e.key === "Escape") no(); } }, "remove?",
            el("button", { class: "yes", title: `remove ${f.name}`, onclick: () => removeFace(f.name) }, "yes"),
            el("button", { class: "no", title: `keep ${f.name}`, onclick: no }, "no")),
        );
      } else {
        const ask = () => { panel.confirming = f.name; focusAfter({ face: f.name, role: "no" }); renderFaces(); };
        tile.append(el("button", { class: "remove", title: `remove ${f.name}`, "aria-label": `remove ${f.name}`, onclick: ask }, "×"));
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
  const names = panel.state.faces.map((f) => f.name);
  const i = names.indexOf(name);
  const next = names[i + 1] || names[i - 1];
  panel.confirming = null;
  const reply = await post(`/api/faces/${encodeURIComponent(name)}/remove`);
  say("face-msg", reply, `removed ${name}`);
  // focus on the next face (the one before, the last gone), or on "choose…" when none is left
  focusAfter(!reply.ok ? { face: name, role: "remove" } : next ? { face: next, role: "pick" } : { role: "choose" });
  renderFaces();
}

async function upload(file, pick) {
  if (!file) return;
  closePicker();
  const name = $("face-name").value.trim();
  const q = new URLSearchParams({ filename: file.name || "photo.jpg" });
  if (name) q.set("name", name);
  if (pick) q.set("pick", String(pick));
  $("face-msg").className = "msg";
  $("face-msg").textContent = `adding ${file.name}…`;
  const reply = await post(`/api/faces?${q}`, file, { "Content-Type": file.type || "application/octet-stream" });
  say("face-msg", reply, `added face ${reply.face}`);
  if (reply.ok) {
    $("face-name").value = "";
    focusAfter({ face: reply.face, role: "pick" });
  } else if (Array.isArray(reply.faces) && reply.faces.length > 1) {
    $("face-msg").className = "msg"; // a question, not a failure
    showPicker(file, reply.faces);
  }
}

// -- a group photo: its faces shown, one chosen (click or keyboard) is added with pick=K -------------
function showPicker(file, faces) {
  // each face cut by the server from the photo as its detector saw it (a phone photo's rotation
  // flag, say, would otherwise put the boxes elsewhere)
  const buttons = faces.map((f, i) => {
    const k = i + 1;
    return el("button", { class: "pick-face", type: "button", "data-pick": k, title: `add face ${k} (from the left)`, onclick: () => upload(file, k) },
      f.crop ? el("img", { src: f.crop, alt: `face ${k}` }) : "", el("span", {}, `face ${k}`));
  });
  const cancel = el("button", { class: "small", type: "button", onclick: () => { closePicker(); $("choose").focus(); } }, "cancel");
  $("picker").replaceChildren(...buttons, cancel);
  $("picker").hidden = false;
  buttons[0].focus();
}

function closePicker() {
  const box = $("picker");
  const had = box.contains(document.activeElement);
  box.replaceChildren();
  box.hidden = true;
  if (had) $("choose").focus(); // not lost to the page: the added face takes it once shown
}

// -- people and mappings ----------------------------------------------------------------------
function faceSelect(selected, onchange, label) {
  const s = el("select", { "aria-label": label, onchange: (e) => onchange(e.target.value) });
  s.append(el("option", { value: "" }, "— face —"));
  for (const f of panel.state.faces) s.append(el("option", { value: f.name, selected: f.name === selected }, f.name));
  return s;
}

function keepFocus(rebuild) {
  // A rebuilt row keeps focus: on the same row's same control, else the row now at its place, else
  // the table's title (a row unmapped with the last mapping).
  const a = document.activeElement;
  const tr = a && a.closest("#people tr[data-track], #mappings tr[data-target]");
  const at = tr && { table: tr.closest("table").id, key: tr.dataset.track || tr.dataset.target, tag: a.tagName, index: [...tr.parentNode.children].indexOf(tr) };
  rebuild();
  if (!at) return;
  const rows = [...$(at.table).tBodies[0].querySelectorAll("tr[data-track], tr[data-target]")];
  const row = rows.find((r) => (r.dataset.track || r.dataset.target) === at.key) || rows[Math.min(at.index, rows.length - 1)];
  const target = row && (row.querySelector(at.tag) || row.querySelector("select, button"));
  (target || $(at.table === "people" ? "people-title" : "mappings-title")).focus();
}

function renderPeople() {
  const st = current();
  const body = $("people").tBodies[0];
  // rebuilt only when the people, their faces or the choices change (not as a person moves: an open
  // dropdown stays open, focus stays where it is)
  const people = st.people.map((p) => [p.track, p.target, p.source]);
  const key = JSON.stringify([people, st.mappings, st.mapping_on, panel.state.faces.map((f) => f.name)]);
  if (body.dataset.key === key) return;
  body.dataset.key = key;
  keepFocus(() => buildPeople(st, body));
}

function buildPeople(st, body) {
  body.replaceChildren();
  for (const p of st.people) {
    const who = p.target ? `${p.target}` : `person ${p.track}`;
    const sel = faceSelect(p.source, (v) => v && mapPerson(p.track, v), `face for ${who}`);
    sel.disabled = !st.mapping_on;
    body.append(el("tr", { "data-track": p.track }, el("td", {}, who), el("td", { class: "arrow" }, "→"), el("td", {}, sel)));
  }
  if (!st.people.length) body.append(el("tr", {}, el("td", { class: "note" }, "nobody in view")));
  $("people-note").textContent = st.mapping_on ? "" : "Per-person mapping is off in this run (no recogniser loaded): a mapping in config.toml ([[swap.map]]) or --map turns it on at the next `vcam run`.";
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
  // latency p50/p99 against the top's ms, fps out (dashed) against its own top
  const pts = history.slice(-60);
  const max = Math.max(1, ...pts.map((p) => p[1]));
  const fpsMax = Math.max(1, ...pts.map((p) => p[2] || 0));
  const line = (i, top) => pts.map((p, k) => `${((k / Math.max(1, pts.length - 1)) * 300).toFixed(1)},${(46 - ((p[i] || 0) / top) * 44).toFixed(1)}`).join(" ");
  $("spark-p50").setAttribute("points", line(0, max));
  $("spark-p99").setAttribute("points", line(1, max));
  $("spark-fps").setAttribute("points", line(2, fpsMax));
  $("spark-max").textContent = `max ${max.toFixed(1)} ms`;
  $("spark-fps-max").textContent = `max ${fpsMax.toFixed(1)}`;
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
      if (c.kind === "choice") {
        // the values the run lists (the cameras); the last entry lists them again
        return el("label", { class: "choice", title: c.help }, c.label + " ",
          el("select", { id: `set-${c.key}`,
            onchange: (e) => setting(c.key, e.target.value === "list" ? "list" : Number(e.target.value)) }));
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
    } else if (c.kind === "choice") {
      const listed = (st.choices || {})[c.key] || [];
      const key = JSON.stringify([listed, v]);
      if (e.dataset.key !== key) {
        e.dataset.key = key;
        e.replaceChildren(...listed.map(([value, label]) => el("option", { value: String(value) }, value < 0 ? label : `${value}: ${label}`)),
          el("option", { value: "list" }, "look again\u2026"));
        e.value = String(v);
      }
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
  if (st && reply.settings) { st.settings = reply.settings; st.choices = reply.choices || st.choices; }
  if (st) { const e = $(`set-${key}`); if (e && e.dataset) delete e.dataset.key; render(); } // a refused choice shows the one in use again
}

// -- the whole page ---------------------------------------------------------------------------
function swapLabel(st) {
  // "swap on" only while faces are being swapped
  if (!st.swap) return ["swap off", "off"];
  if (st.paused || st.status.paused) return ["paused", "warn"];
  if ((st.status.degraded || []).includes("swap")) return ["shed under overload", "warn"];
  if (!st.face && !Object.keys(st.mappings).length) return ["no face chosen", "warn"];
  return ["swap on", "on"];
}

function setLive(live, why) {
  if (panel.live && !live) panel.staleAt = Date.now();
  panel.live = live;
  $("conn").className = "dot " + (live ? "live" : "dead");
  document.body.classList.toggle("stale", !live && !!panel.state);
  const b = $("banner");
  b.hidden = live;
  if (!live) b.textContent = why || "The daemon is stopped or not answering: the figures and picture below are from before. Reconnecting…";
}

function render() {
  const s = panel.state;
  if (!panel.stream || !s.streams.some((x) => x.name === panel.stream)) panel.stream = s.streams[0].name;
  const sel = $("stream");
  sel.hidden = s.streams.length < 2;
  if (sel.options.length !== s.streams.length) sel.replaceChildren(...s.streams.map((x) => el("option", { value: x.name }, x.name)));
  sel.value = panel.stream;
  const st = current();
  const [label, kind] = swapLabel(st);
  $("swap").textContent = label;
  $("swap").classList.toggle("off", kind === "off");
  $("swap").classList.toggle("warn", kind === "warn");
  $("pause").textContent = st.paused ? "resume" : "pause";
  $("pause").classList.toggle("paused", st.paused);
  renderFaces();
  renderControls();
  renderPeople();
  renderHealth();
}

function setPreview(on) {
  panel.previewOn = on;
  panel.previewGen += 1;
  const img = $("preview");
  $("preview-toggle").textContent = on ? "hide" : "show";
  if (panel.ws) panel.ws.send(JSON.stringify({ preview: on ? panel.stream : null }));
  if (on) {
    img.hidden = false;
    previewLoop(panel.previewGen);
  } else {
    if (img.src) URL.revokeObjectURL(img.src);
    img.removeAttribute("src"); // the stream's reader is cancelled: the daemon stops making preview frames
    img.hidden = true;
  }
}

function showFrame(blob) {
  const img = $("preview");
  const old = img.src;
  img.src = URL.createObjectURL(blob);
  if (old) URL.revokeObjectURL(old);
  panel.previewFrames = (panel.previewFrames || 0) + 1;
}

function indexOf4(buf, from) {
  for (let i = from; i + 3 < buf.length; i++) if (buf[i] === 13 && buf[i + 1] === 10 && buf[i + 2] === 13 && buf[i + 3] === 10) return i;
  return -1;
}

async function previewLoop(gen) {
  // The preview as a multipart JPEG stream read with the token; reconnects (and so resumes after a
  // daemon restart) for as long as it is on.
  const img = $("preview");
  while (panel.previewOn && gen === panel.previewGen) {
    if (!panel.verified || !panel.live || panel.ws) { await sleep(200); continue; } // the WebSocket brings frames
    try {
      const res = await panel.get(`/api/preview?stream=${encodeURIComponent(panel.stream || "")}`);
      if (res.ok) {
        const reader = res.body.getReader();
        let buf = new Uint8Array(0);
        while (gen === panel.previewGen) {
          const { value, done } = await reader.read();
          if (done || gen !== panel.previewGen) break; // ended, or hidden meanwhile
          const joined = new Uint8Array(buf.length + value.length);
          joined.set(buf); joined.set(value, buf.length); buf = joined;
          for (;;) {
            const end = indexOf4(buf, 0);
            if (end < 0) break;
            const head = new TextDecoder().decode(buf.subarray(0, end));
            const m = /content-length:\s*(\d+)/i.exec(head);
            const len = m ? parseInt(m[1], 10) : -1;
            if (len < 0 || buf.length < end + 4 + len) break;
            showFrame(new Blob([buf.slice(end + 4, end + 4 + len)], { type: "image/jpeg" }));
            buf = buf.slice(end + 4 + len + 2);
          }
        }
        reader.cancel().catch(() => {});
      }
    } catch (err) { /* the daemon went away: try again below */ }
    if (gen === panel.previewGen) await sleep(500);
  }
}

function runWs() {
  // One WebSocket a page for the states and the preview (a browser allows six HTTP/1.1 connections
  // a host: two long streams a tab ran out at the fourth tab). Resolves "unauthorized" (the token is
  // not this run's), "closed" (it was open), or "failed" (it never opened).
  return new Promise((resolve) => {
    let ws;
    try {
      ws = new WebSocket(`${location.protocol === "https:" ? "wss:" : "ws:"}//${location.host}/api/ws`);
    } catch (err) {
      resolve("failed");
      return;
    }
    ws.binaryType = "blob";
    let opened = false;
    let timer = null;
    const quiet = () => { clearTimeout(timer); timer = setTimeout(() => ws.close(), STALE_MS); };
    ws.onopen = () => {
      opened = panel.everWs = true;
      ws.send(JSON.stringify({ token: panel.token }));
      panel.ws = ws;
      if (panel.previewOn) ws.send(JSON.stringify({ preview: panel.stream }));
      quiet();
    };
    ws.onmessage = (ev) => {
      quiet();
      if (typeof ev.data === "string") {
        panel.state = JSON.parse(ev.data);
        panel.updates = (panel.updates || 0) + 1;
        setLive(true);
        render();
        if (!panel.key) learnKey();
      } else if (panel.previewOn) {
        showFrame(ev.data);
      }
    };
    ws.onclose = (ev) => {
      clearTimeout(timer);
      panel.ws = null;
      resolve(ev.code === 4401 ? "unauthorized" : opened ? "closed" : "failed");
    };
  });
}

async function readEvents(res) {
  // Server-sent events over fetch (an EventSource cannot carry the token header).
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    let timer;
    const stale = new Promise((r) => { timer = setTimeout(() => r({ stale: true }), STALE_MS); });
    const got = await Promise.race([reader.read(), stale]);
    clearTimeout(timer);
    if (got.stale || got.done) { reader.cancel().catch(() => {}); return; }
    buf += dec.decode(got.value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const chunk = buf.slice(0, i);
      buf = buf.slice(i + 2);
      const data = chunk.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
      if (!data) continue;
      panel.state = JSON.parse(data);
      panel.updates = (panel.updates || 0) + 1;
      setLive(true);
      render();
    }
  }
}

async function connect() {
  await redeem();
  if (!panel.token && localStorage.getItem("vcam-pairing")) {
    panel.key = localStorage.getItem("vcam-pairing"); // kept ([panel] keep_token): proofs first, below
    panel.verified = false;
  }
  if (!panel.token && !panel.key) {
    setLive(false, panel.refused || "Open the panel with the link `vcam panel` prints (each link opens it once).");
    document.body.classList.add("stale"); // nothing below works without a pass: greyed
    return;
  }
  for (;;) {
    let why = null;
    try {
      // After a lost connection the token goes to no server before it proved the pairing key
      // (whoever holds the port while vcam is stopped would otherwise receive it).
      if (!panel.verified && panel.key) {
        if (!(await resume())) {
          setLive(false, panel.why);
          await sleep(500);
          continue;
        }
        panel.verified = true;
      }
      if (!panel.noWs) {
        const how = await runWs();
        if (how === "unauthorized") {
          why = "The daemon restarted: reconnecting…";
          if (await resume()) continue;
          why = panel.why || "This page's pass is from an earlier run of vcam: open a fresh link from `vcam panel`.";
        }
        if (how !== "failed" || panel.everWs) throw null; // lost: verify the server again, below
      }
      const res = await panel.get("/api/events"); // no WebSocket here (yet): the HTTP streams
      if (res.status === 401) {
        why = "The daemon restarted: reconnecting…";
        if (await resume()) continue;
        why = panel.why || "This page's pass is from an earlier run of vcam: open a fresh link from `vcam panel`.";
      } else if (res.ok) {
        panel.noWs = !panel.everWs; // the server answers, its WebSocket did not
        if (!panel.key) learnKey();
        await readEvents(res);
      }
    } catch (err) { /* not answering */ }
    panel.verified = false;
    setLive(false, why);
    await sleep(500);
  }
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
  $("choose").addEventListener("click", () => $("file").click()); // Enter or Space on it too
  const drop = $("drop");
  for (const t of ["dragenter", "dragover"]) drop.addEventListener(t, (e) => { e.preventDefault(); drop.classList.add("over"); });
  for (const t of ["dragleave", "drop"]) drop.addEventListener(t, () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => { e.preventDefault(); upload(e.dataTransfer.files[0]); });
  connect();
}

if (!panel.leaving) wire();
