// SplatPainter browser editor. The view is rendered in this browser with WebGL (viewport.js): the
// asset is loaded once, an edit brings only the changed colours, and orbiting asks the server
// nothing. Where WebGL or the library is missing, frames come from the server's renderer instead
// (JPEG while dragging, PNG when the view rests), and the status line says so. Either way, paint,
// mask and colour adjustments are layers over the server's lossless PNG of the view (fetched
// when editing starts); "Apply" sends their composite with the orbit parameters of that view, so
// the server fits the edit on exactly the pixels painted on. No network access but this server.
"use strict";

const $ = (id) => document.getElementById(id);
const SIZE = 512;
const IDLE_MS = 140;
const SHAPE_IDS = ["shape-cx", "shape-cy", "shape-cz", "shape-sx", "shape-sy", "shape-sz"];

const sp = {
  sid: null, info: null, cfg: null,
  view: { az: 30, el: 20, zoom: 1, pan_x: 0, pan_y: 0 },
  frame: null,        // the last frame shown (a JPEG while dragging, else the PNG)
  base: null,         // full-size ImageBitmap of `baseView` at `baseEpoch` (what edits paint on)
  baseBlob: null, baseView: null, baseEpoch: -1,
  epoch: 0,           // bumps whenever the asset changes (apply, undo, ...)
  edited: null,       // an uploaded edited image for this view
  hasPaint: false, hasMask: false,
  frames: 0, fullFrames: 0, dragFrames: 0, dragSize: null, fps: 0, applying: false,
  gl: null,           // the WebGL viewport (viewport.js), null: server frames
  glWhy: null,        // why there is no WebGL viewport
  glEpoch: -1,        // the epoch the viewport's asset shows
  glSyncing: false,
  selected: 0,        // how many Gaussians the server's selection holds
  selection: null,    // their indices (Uint32Array), for the highlight
  selSeq: 0,          // bumps when the selection shown changes
  lit: null,          // the last full server frame with the selection tinted: {view, epoch, seq}
};
window.sp = sp; // for tests and for poking at it from the console

const screen = $("screen");
const ctx = screen.getContext("2d");
const layer = () => { const c = document.createElement("canvas"); c.width = SIZE; c.height = SIZE; return c; };
const paintLayer = layer(), strokeLayer = layer(), maskLayer = layer(), tint = layer(), work = layer();

// ------------------------------------------------------------------ small helpers
function status(text, error = false) {
  const el = $("status");
  el.textContent = text;
  el.classList.toggle("error", error);
}

// A failed request throws an Error carrying the HTTP status and the JSON body (`error` says
// "stale", "busy" or "cancelled" for the 409s of a session's history).
async function api(path, opts = {}) {
  const r = await fetch(path, opts);
  if (!r.ok) {
    let body = {};
    try { body = await r.json(); } catch (e) { /* not JSON */ }
    const err = new Error(`${r.status}: ${body.detail || r.statusText}`);
    err.status = r.status;
    err.body = body;
    throw err;
  }
  return r.json();
}

// A change to the session's history: JSON, made on the revision this page shows (the server
// refuses it with 409 "stale" when another tab changed the session since).
function change(sid, action, body = {}) {
  return api(`/api/sessions/${sid}/${action}`, {
    method: "POST", headers: { "Content-Type": "application/json" },
    body: JSON.stringify({ ...body, revision: sp.info.revision }),
  });
}

const isStale = (e) => e.status === 409 && e.body && e.body.error === "stale";
const isBusy = (e) => e.status === 409 && e.body && e.body.error === "busy";

// A refused change to the session's history: stale (reload and say so), busy with an edit
// another tab started (show it running until it ends), or any other error (say it).
async function refused(sid, e, what = "") {
  if (isStale(e)) { await reloadStale(sid); return; }
  status(`${what}${e.message}`, true);
  if (!isBusy(e)) return;
  try {
    const info = await api(`/api/sessions/${sid}`);
    if (sid === sp.sid && info.busy) { sp.info = { ...sp.info, busy: info.busy }; watchBusy(info); }
  } catch (err) { /* the message above stands */ }
}

// Another tab or window changed this session: show its state as it is now and say so.
async function reloadStale(sid) {
  try {
    const info = await api(`/api/sessions/${sid}`);
    if (sid !== sp.sid) return;
    sp.edited = null; // an uploaded image was made for the old state
    showInfo(info);
    if (locked()) startEditing(); // the kept paint goes over the new state's frame
    watchBusy(info);
    status("this session was changed in another tab or window: its state was reloaded and "
      + "your request was not applied (unapplied paint is kept; apply it again)", true);
    sp.notice = "stale";
  } catch (e) {
    status(`this session changed elsewhere and could not be reloaded: ${e.message}`, true);
  }
}

// An edit this page did not start (another tab's, or ours from before a reload) is running:
// show it and poll until it ends, then show the result.
let busyTimer = null;
function watchBusy(info) {
  clearTimeout(busyTimer);
  sp.remoteBusy = !!info.busy && !sp.applying;
  showBusy();
  if (!sp.remoteBusy) return;
  const sid = info.id;
  busyTimer = setTimeout(async () => {
    try {
      const now = await api(`/api/sessions/${sid}`);
      if (sid !== sp.sid) return;
      if (!now.busy) {
        sp.remoteBusy = false;
        // paint restored by a reload during this page's own apply is what that apply applied
        // (compared with the revision at the reload: a poll during the edit's save already
        // sees the new revision while the session is still busy)
        const from = sp.draftBusyRevision;
        if (from !== null && now.revision !== from) clearEdits();
        sp.draftBusyRevision = null;
        showInfo(now);
        if (locked()) startEditing();
        showBusy(); showStatusLine();
        return;
      }
      watchBusy(now);
    } catch (e) { watchBusy(info); }
  }, 400);
}

function showBusy() {
  const running = sp.applying || sp.remoteBusy;
  $("progress").hidden = !running;
  $("cancel-apply").hidden = !running;
  if (sp.remoteBusy && sp.info && sp.info.busy) {
    $("progress-text").textContent = `${sp.info.busy.what}…`;
    status(`an edit is running in this session (${sp.info.busy.what}); it shows when done`);
  } else if (!running) {
    $("progress-text").textContent = "";
  }
  markReady();
}

async function cancelApply() {
  const sid = sp.sid;
  try {
    const r = await api(`/api/sessions/${sid}/cancel`, { method: "POST" });
    // (unless the edit's answer came first and said how it ended)
    if (sid === sp.sid && r.cancelled && (sp.applying || sp.remoteBusy)) status("cancelling the edit…");
  } catch (e) {
    status(`cancel failed: ${e.message}`, true);
  }
}

const sameView = (a, b) => !!a && !!b && ["az", "el", "zoom", "pan_x", "pan_y"].every((k) => a[k] === b[k]);
const viewQuery = (v, w, h) => new URLSearchParams({ ...v, w, h });
const brush = () => ({
  color: $("brush-color").value,
  size: +$("brush-size").value,
  opacity: +$("brush-opacity").value,
  hardness: +$("brush-hardness").value,
});
const tool = () => document.querySelector("input[name=tool]:checked").value;
const hsv = () => ({ h: +$("hsv-h").value, s: +$("hsv-s").value, v: +$("hsv-v").value, scope: $("hsv-scope").value });
const hsvActive = () => { const a = hsv(); return a.h !== 0 || a.s !== 1 || a.v !== 1; };
const hasEdits = () => sp.hasPaint || !!sp.edited || hsvActive();
// The kind an apply sends: the Kind menu's, except that under "auto" an edit of brush strokes
// alone (no colour adjustment, no uploaded image) is paint.  The page knows the tool; the model
// under "auto" reads a flat stroke across parts as a recolour and spreads it (6-9 dB below
// "paint" on evaluate's brush dabs, docs/splatpainter.md).  Choose a kind to override.
const applyKind = () => {
  const k = $("kind").value;
  return k === "auto" && sp.hasPaint && !sp.edited && !hsvActive() ? "paint" : k;
};
const locked = () => hasEdits() || sp.hasMask;

const baseCurrent = () => !!sp.base && sp.baseEpoch === sp.epoch && sameView(sp.baseView, sp.view);
// server frames: the full frame shown, with the selection tinted, is of this view and state
const litCurrent = () => !!sp.lit && sp.lit.epoch === sp.epoch && sameView(sp.lit.view, sp.view)
  && sp.lit.seq === sp.selSeq && highlightFrames();

// Ready: the view shows the session's current state, and an edit in progress has the server's
// frame of this view to be composed on.
function markReady() {
  const shown = sp.gl
    ? sp.gl.settled && sp.glEpoch === sp.epoch && !sp.glSyncing && (!locked() || baseCurrent())
    : baseCurrent() || (!locked() && litCurrent());
  const ready = shown && inflight === 0 && !pending && !sp.applying && !sp.remoteBusy;
  document.body.dataset.ready = ready ? "1" : "0";
  document.body.dataset.entry = sp.info ? String(sp.info.index) : "";
  $("apply").disabled = !ready;
}

// ------------------------------------------------------------------ frames
// Up to two requests in flight, so the server renders the next view while the last one travels;
// a frame older than the one on screen is dropped (newer views replace older ones).
const MAX_INFLIGHT = 2;
let inflight = 0, pending = null, idleTimer = null, viewSaveTimer = null;
let seq = 0, shownSeq = 0;
let fpsWindow = [];

function requestFrame(full) {
  if (sp.gl) { glFrame(); return; }
  pending = { full: full || (pending && pending.full), plain: !!(pending && pending.plain) };
  if (!full) {
    clearTimeout(idleTimer);
    idleTimer = setTimeout(() => requestFrame(true), IDLE_MS);
  }
  pump();
}

async function pump() {
  if (!pending || !sp.sid) { markReady(); return; }
  if (inflight >= MAX_INFLIGHT) return;
  const { full, plain } = pending;
  pending = null;
  inflight += 1;
  const mySeq = ++seq;
  markReady();
  const v = { ...sp.view }, epoch = sp.epoch, sid = sp.sid;
  const q = viewQuery(v, SIZE, SIZE);
  q.set("fmt", full ? "png" : "jpeg");
  // a frame that shows the selection tinted is one to look at, never one to paint an edit on
  const tinted = !plain && highlightFrames(), selSeq = sp.selSeq;
  if (tinted) q.set("highlight", "true");
  try {
    const r = await fetch(`/api/sessions/${sid}/render?${q}`);
    if (!r.ok) throw new Error(`${r.status}: ${(await r.json()).detail}`);
    const blob = await r.blob();
    const bmp = await createImageBitmap(blob);
    if (sid !== sp.sid || mySeq < shownSeq) return; // another session, or overtaken
    shownSeq = mySeq;
    sp.frame = bmp;
    sp.frames += 1;
    if (!full) {  // the frame rate while dragging: frames over the last second
      sp.dragFrames += 1;
      sp.dragSize = [bmp.width, bmp.height];
      const now = performance.now();
      fpsWindow = fpsWindow.filter((t) => now - t < 1000).concat([now]);
      sp.fps = fpsWindow.length > 1 ? (1000 * (fpsWindow.length - 1)) / (now - fpsWindow[0]) : 0;
    }
    if (full && tinted) {
      if (epoch === sp.epoch && sameView(v, sp.view)) sp.lit = { view: v, epoch, seq: selSeq };
      if (baseWaiters.length) pending = { full: true, plain: true };
    } else if (full) {
      if (epoch === sp.epoch && sameView(v, sp.view)) {
        sp.base = bmp; sp.baseBlob = blob; sp.baseView = v; sp.baseEpoch = epoch;
        sp.fullFrames += 1;
        $("download-view").href = URL.createObjectURL(blob);
        scheduleViewSave(true);
        for (const done of baseWaiters.splice(0)) done(true);
      } else {
        // stale: the view or the asset changed meanwhile
        pending = { full: true, plain: baseWaiters.length > 0 };
      }
    }
    redraw();
    showStatusLine();
  } catch (e) {
    status(`render failed: ${e.message}`, true);
    if (full) for (const done of baseWaiters.splice(0)) done(false);
  } finally {
    inflight -= 1;
    if (pending) pump(); else markReady();
  }
}

// The view reaches this browser's storage at once, so a reload comes back to it, and the server
// (saved with the session, for a server restart or another browser) after a pause; with the
// WebGL viewport only when the server is asked anyway (an edit starts) or the page is left, so
// that orbiting makes no request.
let viewDirty = false;
function scheduleViewSave(toServer = !sp.gl) {
  try { localStorage.setItem(viewKey(), JSON.stringify(sp.view)); } catch (e) { /* not kept */ }
  $("download-camera").href = `/api/sessions/${sp.sid}/camera?${viewQuery(sp.view, SIZE, SIZE)}`;
  viewDirty = true;
  if (!toServer) return;
  clearTimeout(viewSaveTimer);
  viewSaveTimer = setTimeout(() => putView(false), 400);
}

function putView(keepalive) {
  if (!sp.sid || !viewDirty) return;
  viewDirty = false;
  fetch(`/api/sessions/${sp.sid}/view`, {
    method: "PUT", headers: { "Content-Type": "application/json" }, keepalive,
    body: JSON.stringify({ ...sp.view, width: SIZE, height: SIZE }),
  }).catch(() => {});
}
window.addEventListener("pagehide", () => putView(true));
document.addEventListener("visibilitychange", () => { if (document.hidden) putView(true); });

// ------------------------------------------------------------------ the WebGL viewport
// The view is drawn in this browser; the server is asked only for the asset's state after a
// change (a colour delta) and, when an edit starts, for its own frame of the view.
function glFrame() {
  sp.gl.setView(sp.view);
  if (shapeShown()) redraw(); // the box or sphere drawn over the view follows it
  scheduleViewSave(false);
  if (sp.glEpoch !== sp.epoch) glSync();
  markReady();
  showStatusLine();
}

// "Download view" gives the server's frame of the view (fetched on the first click).
$("download-view").addEventListener("click", (e) => {
  if (!sp.gl || baseCurrent()) return;
  e.preventDefault();
  ensureBase().then((ok) => { if (ok) $("download-view").click(); });
});

async function glSync() {
  if (sp.glSyncing) return; // the running sync looks again when it ends
  sp.glSyncing = true;
  const epoch = sp.epoch, sid = sp.sid;
  markReady();
  try {
    await sp.gl.sync(sid);
    if (sid === sp.sid) sp.glEpoch = epoch;
  } catch (e) {
    glFallback(`the WebGL viewport failed (${e.message})`);
    return;
  } finally {
    sp.glSyncing = false;
  }
  if (sp.gl && sp.glEpoch !== sp.epoch) glSync();
  markReady();
}

// No WebGL viewport (no WebGL2, the library is not installed, or it failed): server frames.
function glFallback(why) {
  sp.glWhy = why;
  sp.gl = null;
  sp.glSyncing = false;
  document.body.dataset.viewport = "server";
  $("gl").hidden = true;
  status(`${why}: showing frames rendered by the server instead`, true);
  requestFrame(true);
}

// The server's lossless frame of the current view, which an edit is composed on (one request
// when editing starts; never while orbiting).
let baseWaiters = [];
function ensureBase() {
  if (baseCurrent()) return Promise.resolve(true);
  return new Promise((resolve) => {
    baseWaiters.push(resolve);
    pending = { full: true, plain: true };
    pump();
  });
}

function showStatusLine() {
  // a running edit's progress, and a notice until the next action, stay in view
  if (!sp.info || sp.applying || sp.remoteBusy || sp.notice) return;
  const busy = locked() ? " · view locked while editing (apply or clear)" : "";
  const rate = sp.gl ? sp.gl.fps : sp.fps;
  const fps = drag && drag.mode !== "paint" && rate ? ` · ${rate.toFixed(1)} fps` : "";
  const where = sp.gl ? " · WebGL view" : sp.glWhy ? " · server frames (no WebGL viewport)" : "";
  status(`${sp.info.num_gaussians} Gaussians · entry ${sp.info.index}${fps}${where}${busy}`);
}

// ------------------------------------------------------------------ drawing
function applyHsv(image, weights) {
  // In place on ImageData: hue shift (degrees), saturation and value factors, blended by
  // weights (mask alpha, 0-255) when given.
  const { h, s, v } = hsv();
  const d = image.data;
  for (let i = 0; i < d.length; i += 4) {
    const w = weights ? weights[i + 3] / 255 : 1;
    if (w === 0) continue;
    const r = d[i] / 255, g = d[i + 1] / 255, b = d[i + 2] / 255;
    const mx = Math.max(r, g, b), mn = Math.min(r, g, b), c = mx - mn;
    let hue = 0;
    if (c > 0) {
      if (mx === r) hue = ((g - b) / c) % 6;
      else if (mx === g) hue = (b - r) / c + 2;
      else hue = (r - g) / c + 4;
      hue *= 60;
    }
    let sat = mx === 0 ? 0 : c / mx, val = mx;
    hue = (((hue + h) % 360) + 360) % 360;
    sat = Math.min(1, sat * s);
    val = Math.min(1, val * v);
    const cc = val * sat, x = cc * (1 - Math.abs(((hue / 60) % 2) - 1)), m = val - cc;
    let rr = 0, gg = 0, bb = 0;
    if (hue < 60) [rr, gg, bb] = [cc, x, 0];
    else if (hue < 120) [rr, gg, bb] = [x, cc, 0];
    else if (hue < 180) [rr, gg, bb] = [0, cc, x];
    else if (hue < 240) [rr, gg, bb] = [0, x, cc];
    else if (hue < 300) [rr, gg, bb] = [x, 0, cc];
    else [rr, gg, bb] = [cc, 0, x];
    d[i] = Math.round(((rr + m) * w + r * (1 - w)) * 255);
    d[i + 1] = Math.round(((gg + m) * w + g * (1 - w)) * 255);
    d[i + 2] = Math.round(((bb + m) * w + b * (1 - w)) * 255);
  }
}

// The edited view: base (or the uploaded image), colour adjustment, then the paint layer.
function compose(target, source) {
  const c = target.getContext("2d");
  c.globalAlpha = 1;
  c.globalCompositeOperation = "source-over";
  c.imageSmoothingEnabled = true;
  c.clearRect(0, 0, SIZE, SIZE);
  if (source) c.drawImage(source, 0, 0, SIZE, SIZE);
  if (hsvActive()) {
    const img = c.getImageData(0, 0, SIZE, SIZE);
    let weights = null;
    if (hsv().scope === "mask") weights = maskLayer.getContext("2d").getImageData(0, 0, SIZE, SIZE).data;
    applyHsv(img, weights);
    c.putImageData(img, 0, 0);
  }
  if (sp.hasPaint) c.drawImage(paintLayer, 0, 0); // (else empty: no blend per frame)
}

function redraw() {
  // with the WebGL viewport the screen is a transparent layer over it, opaque only while an
  // edit shows the server's frame it is composed on
  const source = sp.edited || (locked() && baseCurrent() ? sp.base : sp.gl ? null : sp.frame);
  compose(screen, source);
  const b = brush();
  if (tool() === "brush" && !$("mask-layer").checked) {
    ctx.globalAlpha = b.opacity;
    ctx.drawImage(strokeLayer, 0, 0);
    ctx.globalAlpha = 1;
  }
  if (sp.hasMask || $("mask-layer").checked) {
    const t = tint.getContext("2d");
    t.globalCompositeOperation = "source-over";
    t.clearRect(0, 0, SIZE, SIZE);
    t.drawImage(maskLayer, 0, 0);
    if (tool() === "brush" && $("mask-layer").checked) t.drawImage(strokeLayer, 0, 0);
    t.globalCompositeOperation = "source-in";
    t.fillStyle = "#ff3030";
    t.fillRect(0, 0, SIZE, SIZE);
    ctx.globalAlpha = 0.4;
    ctx.drawImage(tint, 0, 0);
    ctx.globalAlpha = 1;
  }
  if (shapeShown()) drawShape(ctx);
}

function stamp(c, x, y, b, color) {
  const r = Math.max(0.5, b.size / 2);
  const g = c.createRadialGradient(x, y, 0, x, y, r);
  const hard = Math.min(0.999, b.hardness);
  g.addColorStop(0, color);
  g.addColorStop(hard, color);
  g.addColorStop(1, color.replace(/,\s*[\d.]+\)$/, ", 0)"));
  c.fillStyle = g;
  c.beginPath();
  c.arc(x, y, r, 0, 2 * Math.PI);
  c.fill();
}

function rgba(hex, a) {
  const n = parseInt(hex.slice(1), 16);
  return `rgba(${(n >> 16) & 255}, ${(n >> 8) & 255}, ${n & 255}, ${a})`;
}

function strokeTo(state, x, y) {
  const b = brush();
  const erasing = tool() === "eraser";
  const target = erasing ? ($("mask-layer").checked ? maskLayer : paintLayer) : strokeLayer;
  const c = target.getContext("2d");
  c.globalCompositeOperation = erasing ? "destination-out" : "source-over";
  const color = erasing ? `rgba(0, 0, 0, ${b.opacity})`
    : rgba($("mask-layer").checked ? "#ffffff" : b.color, 1);
  const step = Math.max(1, b.size * 0.2);
  const dx = x - state.x, dy = y - state.y, dist = Math.hypot(dx, dy);
  const n = state.first ? 1 : Math.max(1, Math.ceil(dist / step));
  for (let i = 1; i <= n; i += 1) {
    const t = state.first ? 1 : i / n;
    stamp(c, state.x + dx * t, state.y + dy * t, b, color);
  }
  c.globalCompositeOperation = "source-over";
  state.x = x; state.y = y; state.first = false;
}

function endStroke() {
  if (tool() === "brush") {
    const onMask = $("mask-layer").checked;
    const c = (onMask ? maskLayer : paintLayer).getContext("2d");
    c.globalAlpha = onMask ? 1 : brush().opacity;
    c.drawImage(strokeLayer, 0, 0);
    c.globalAlpha = 1;
    strokeLayer.getContext("2d").clearRect(0, 0, SIZE, SIZE);
    if (onMask) sp.hasMask = true; else sp.hasPaint = true;
  }
  redraw();
  showStatusLine();
  markReady();
  saveDraft();
}

function clearEdits() {
  for (const l of [paintLayer, strokeLayer, maskLayer]) l.getContext("2d").clearRect(0, 0, SIZE, SIZE);
  sp.hasPaint = false; sp.hasMask = false; sp.edited = null;
  $("hsv-h").value = 0; $("hsv-s").value = 1; $("hsv-v").value = 1;
  for (const id of ["hsv-h", "hsv-s", "hsv-v"]) $(`${id}-out`).textContent = $(id).value;
  redraw();
  saveDraft();
}

// ------------------------------------------------------------------ tool settings survive a reload
// The brush, the tool and the method are the user's, not the session's: one set per browser.
const SETTINGS_KEY = "splatpainter-settings";
const SETTINGS = ["brush-color", "brush-size", "brush-opacity", "brush-hardness", "method", "kind"];
const TOOLS = ["orbit", "brush", "eraser"];

function saveSettings() {
  const s = { tool: tool() };
  for (const id of SETTINGS) s[id] = $(id).value;
  try { localStorage.setItem(SETTINGS_KEY, JSON.stringify(s)); } catch (e) { /* not kept */ }
}

function loadSettings() {
  let s = null;
  try { s = JSON.parse(localStorage.getItem(SETTINGS_KEY) || "null"); } catch (e) { /* none */ }
  if (!s || typeof s !== "object") return;
  for (const id of SETTINGS) {
    const el = $(id), v = s[id];
    if (typeof v !== "string") continue;
    // a select keeps its value only if this server offers it; range and colour inputs clamp
    if (el.tagName === "SELECT" && ![...el.options].some((o) => o.value === v)) continue;
    el.value = v;
    if ($(`${id}-out`)) $(`${id}-out`).textContent = el.value;
  }
  if (TOOLS.includes(s.tool)) {
    document.querySelector(`input[name=tool][value=${s.tool}]`).checked = true;
    showTool();
  }
}

function showTool() { screen.classList.toggle("painting", tool() !== "orbit"); }

// ------------------------------------------------------------------ unapplied paint survives a reload
// The server keeps the applied history and the view; paint and mask not yet applied stay in this
// browser (localStorage, per session), tied to the view and history entry they were painted on.
const draftKey = () => `splatpainter-draft-${sp.sid}`;
const viewKey = () => `splatpainter-view-${sp.sid}`;

function loadLocalView() {
  try {
    const v = JSON.parse(localStorage.getItem(viewKey()) || "null");
    const ok = v && [v.az, v.el, v.zoom, v.pan_x, v.pan_y].every(Number.isFinite)
      && Math.abs(v.el) <= 89 && v.zoom >= 0.05 && v.zoom <= 20
      && Math.abs(v.pan_x) <= 10 && Math.abs(v.pan_y) <= 10;
    return ok ? { az: v.az, el: v.el, zoom: v.zoom, pan_x: v.pan_x, pan_y: v.pan_y } : null;
  } catch (e) { return null; }
}

function saveDraft() {
  if (!sp.sid) return;
  try {
    if (!sp.hasPaint && !sp.hasMask) { localStorage.removeItem(draftKey()); return; }
    localStorage.setItem(draftKey(), JSON.stringify({
      view: sp.view, index: sp.info ? sp.info.index : null,
      paint: sp.hasPaint ? paintLayer.toDataURL("image/png") : null,
      mask: sp.hasMask ? maskLayer.toDataURL("image/png") : null,
    }));
  } catch (e) { /* storage full or disabled: the draft is simply not kept */ }
}

function loadDraft() {
  try { return JSON.parse(localStorage.getItem(draftKey()) || "null"); } catch (e) { return null; }
}

function restoreDraft(draft, info) {
  if (!draft || draft.index !== info.index || !sameView(draft.view, sp.view)) return;
  for (const [url, l, flag] of [[draft.paint, paintLayer, "hasPaint"], [draft.mask, maskLayer, "hasMask"]]) {
    if (!url) continue;
    const img = new Image();
    img.onload = () => {
      // (loaded late: the session moved on meanwhile, e.g. the edit running at a reload ended)
      if (sp.sid !== info.id || !sp.info || sp.info.index !== draft.index) return;
      l.getContext("2d").drawImage(img, 0, 0);
      sp[flag] = true;
      startEditing(); // the paint goes over the server's frame of this view
      redraw(); showStatusLine(); markReady(); saveDraft();
    };
    img.src = url;
  }
}

// ------------------------------------------------------------------ pointer: orbit or paint
function canvasXY(e) {
  const r = screen.getBoundingClientRect();
  return [((e.clientX - r.left) * SIZE) / r.width, ((e.clientY - r.top) * SIZE) / r.height];
}

let drag = null;
screen.addEventListener("contextmenu", (e) => e.preventDefault());
screen.addEventListener("pointerdown", (e) => {
  screen.setPointerCapture(e.pointerId);
  const [x, y] = canvasXY(e);
  const painting = tool() !== "orbit" && e.button === 0 && !e.shiftKey;
  if (painting) {
    if (sp.gl) {
      if (!sp.gl.settled || sp.glEpoch !== sp.epoch) {
        status("wait for the view to finish drawing before painting", true);
        return;
      }
      startEditing();
    } else if (!baseCurrent()) {
      ensureBase().then(() => { redraw(); markReady(); }); // (a tinted frame is not one)
      status("wait for the view to finish rendering before painting", true);
      return;
    }
    drag = { mode: "paint", x, y, first: true };
    strokeTo(drag, x, y);
    redraw();
    return;
  }
  if (locked()) {
    status("the view is locked while you edit: apply the edit or clear it first", true);
    return;
  }
  drag = { mode: e.button === 2 || e.shiftKey ? "pan" : "orbit", x, y };
});
screen.addEventListener("pointermove", (e) => {
  if (!drag) return;
  const [x, y] = canvasXY(e);
  if (drag.mode === "paint") {
    strokeTo(drag, x, y);
    redraw();
    return;
  }
  const dx = x - drag.x, dy = y - drag.y;
  drag.x = x; drag.y = y;
  const v = sp.view;
  if (drag.mode === "pan") {
    v.pan_x = Math.max(-10, Math.min(10, v.pan_x - (dx / SIZE) * 2 * v.zoom));
    v.pan_y = Math.max(-10, Math.min(10, v.pan_y + (dy / SIZE) * 2 * v.zoom));
  } else {
    v.az = (((v.az - dx * 0.4) % 360) + 360) % 360;
    v.el = Math.max(-89, Math.min(89, v.el + dy * 0.3));
  }
  requestFrame(false);
});
const endDrag = () => {
  if (drag && drag.mode === "paint") endStroke();
  else if (drag) requestFrame(true);
  drag = null;
};
screen.addEventListener("pointerup", endDrag);
screen.addEventListener("pointercancel", endDrag);
screen.addEventListener("wheel", (e) => {
  e.preventDefault();
  if (locked()) return;
  sp.view.zoom = Math.max(0.05, Math.min(20, sp.view.zoom * Math.exp(e.deltaY * 0.001)));
  requestFrame(false);
}, { passive: false });

// ------------------------------------------------------------------ session and history
function showInfo(info) {
  const changed = !sp.info || sp.info.id !== info.id || sp.info.index !== info.index
    || sp.info.history.length !== info.history.length || sp.info.revision !== info.revision;
  sp.info = info;
  if (changed) { sp.epoch += 1; requestFrame(true); }
  $("asset-name").textContent = `${info.name} · ${info.num_gaussians} Gaussians`;
  if (typeof info.selected === "number") showSelected(info.selected);
  $("undo").disabled = !info.can_undo;
  $("redo").disabled = !info.can_redo;
  showExportLinks();
  const hidden = info.hidden || 0;
  $("hidden-count").textContent = `${hidden} hidden`;
  $("unhide-all").disabled = !hidden;
  const list = $("history");
  list.replaceChildren();
  for (const e of info.history) {
    const li = document.createElement("li");
    const secs = e.seconds ? ` · ${e.seconds.toFixed(2)} s` : "";
    const n = e.index ? ` · ${e.changed_gaussians} changed` : "";
    li.textContent = `${e.label}${n}${secs}`;
    li.classList.toggle("current", e.index === info.index);
    li.classList.toggle("undone", e.index > info.index);
    li.addEventListener("click", () => historyAction(`goto/${e.index}`));
    list.appendChild(li);
  }
  markReady();
}

function setSession(info) {
  sp.sid = info.id;
  history_replace(info.id);
  const draft = loadDraft();
  const { az, el, zoom, pan_x, pan_y } = info.view;
  // The view this browser saw last (the server's copy may be older: its save waits for a
  // pause); unapplied paint brings back the view it was painted on.
  sp.view = loadLocalView() || { az, el, zoom, pan_x, pan_y };
  const resume = draft && draft.index === info.index && draft.view;
  if (resume) sp.view = { ...draft.view };
  sp.base = null; sp.frame = null;
  clearEdits();
  sp.info = null;
  sp.applying = false; // an apply of the session left behind no longer concerns this page
  sp.notice = null;
  showInfo(info);
  watchBusy(info);
  if (resume) scheduleViewSave();
  sp.draftBusyRevision = info.busy && resume ? info.revision : null;
  restoreDraft(draft, info);
  sp.selection = null;
  if (sp.gl) sp.gl.setSelection(null);
  refreshSelection(); // kept by the server: a reload or a restart shows it again
  refreshSessions();
}

function history_replace(id) {
  window.history.replaceState(null, "", `#s=${id}`);
}

async function historyAction(action) {
  if (sp.applying || sp.remoteBusy || !sp.info) return;
  const sid = sp.sid;
  sp.notice = null;
  try {
    const info = await change(sid, action);
    if (sid !== sp.sid) return; // another session was opened meanwhile
    showInfo(info);
    clearEdits();
  } catch (e) {
    if (sid !== sp.sid) return;
    await refused(sid, e);
  }
}

// Editing starts: fetch the server's frame of this view (and tell it the view), then show it.
function startEditing() {
  if (!sp.gl || baseCurrent()) return;
  putView(false);
  ensureBase().then((ok) => { if (ok) { redraw(); showStatusLine(); } markReady(); });
}

async function applyEdit() {
  if (sp.gl && !baseCurrent()) await ensureBase();
  if (!baseCurrent()) {
    status("wait for the view to finish rendering", true);
    return;
  }
  if (!hasEdits()) {
    status("paint, adjust colours or upload an edited image first", true);
    return;
  }
  compose(work, sp.edited || sp.base);
  const body = {
    view: { ...sp.baseView, width: SIZE, height: SIZE },
    image: work.toDataURL("image/png"),
    mask: null,
    method: $("method").value,
    kind: applyKind(),
  };
  if ($("limit-selection").checked) body.selection_only = true;
  if (sp.hasMask) {
    const c = work.getContext("2d");
    c.fillStyle = "#000";
    c.fillRect(0, 0, SIZE, SIZE);
    c.drawImage(maskLayer, 0, 0);
    body.mask = work.toDataURL("image/png");
  }
  const sid = sp.sid, mine = ++applySeq;
  sp.notice = null;
  sp.applying = true;
  showBusy();
  const t0 = performance.now();
  const tick = setInterval(() => {
    if (mine === applySeq && sid === sp.sid) {
      $("progress-text").textContent = `${body.method}: ${((performance.now() - t0) / 1000).toFixed(1)} s`;
    }
  }, 100);
  status(`applying with ${body.method}…`);
  // (not `change`: the request names the revision the painted-on frame was rendered at)
  body.revision = sp.info.revision;
  try {
    const info = await api(`/api/sessions/${sid}/apply`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    if (sid !== sp.sid) { // the user opened another session meanwhile: it stays as it is
      status(`the edit finished in the session left behind (${sid.slice(0, 8)}…)`);
      return;
    }
    clearEdits();
    sp.applying = false;
    showInfo(info);
    if (!info.changed) {
      status(`the edit changed no Gaussian (${body.method}); nothing was added to the history`);
    } else {
      const last = info.history[info.index];
      const as = body.method === "model" && body.kind !== $("kind").value ? ` as ${body.kind} (brush strokes)`
        : info.reading ? ` (read as ${info.reading.read_as}; choose a Kind to say otherwise)` : "";
      status(`applied with ${body.method}${as} in ${info.seconds.toFixed(2)} s: ${last.changed_gaussians} Gaussians changed`);
    }
  } catch (e) {
    if (sid !== sp.sid) return;
    if (e.status === 409 && e.body && e.body.error === "cancelled") {
      status("the edit was cancelled; nothing changed");
    } else {
      sp.applying = false;
      await refused(sid, e, "apply failed: ");
    }
  } finally {
    clearInterval(tick);
    if (mine === applySeq && sid === sp.sid) {
      sp.applying = false;
      showBusy();
    }
  }
}
let applySeq = 0;

async function openUpload(file) {
  status(`uploading ${file.name}…`);
  try {
    const info = await api(`/api/sessions?name=${encodeURIComponent(file.name)}`, {
      method: "POST", headers: { "Content-Type": "application/octet-stream" }, body: file,
    });
    setSession(info);
  } catch (e) {
    status(`could not open ${file.name}: ${e.message}`, true);
  }
}

async function uploadEdited(file) {
  try {
    let bmp = await createImageBitmap(file);
    if (bmp.width !== SIZE || bmp.height !== SIZE) {
      status(`the image is ${bmp.width}x${bmp.height}; scaled to the ${SIZE}x${SIZE} view`);
      bmp = await createImageBitmap(file, { resizeWidth: SIZE, resizeHeight: SIZE, resizeQuality: "high" });
    }
    if (sp.gl) await ensureBase();
    if (!baseCurrent()) throw new Error("wait for the view to finish rendering");
    sp.edited = bmp;
    redraw();
    showStatusLine();
    markReady();
  } catch (e) {
    status(`could not use that image: ${e.message}`, true);
  }
}

// ------------------------------------------------------------------ wiring
for (const id of ["brush-size", "brush-opacity", "brush-hardness", "hsv-h", "hsv-s", "hsv-v"]) {
  $(id).addEventListener("input", () => {
    $(`${id}-out`).textContent = $(id).value;
    if (id.startsWith("hsv")) { startEditing(); redraw(); showStatusLine(); markReady(); }
  });
}
for (const id of SETTINGS) for (const ev of ["input", "change"]) $(id).addEventListener(ev, saveSettings);
$("hsv-scope").addEventListener("change", redraw);
$("mask-layer").addEventListener("change", redraw);
for (const r of document.querySelectorAll("input[name=tool]")) {
  r.addEventListener("change", () => { showTool(); saveSettings(); if (!sp.gl) requestFrame(true); });
}
$("clear-paint").addEventListener("click", () => { clearEdits(); showStatusLine(); markReady(); });
$("apply").addEventListener("click", applyEdit);
$("undo").addEventListener("click", () => historyAction("undo"));
$("redo").addEventListener("click", () => historyAction("redo"));
$("reset").addEventListener("click", () => historyAction("reset"));
$("reset-memory").addEventListener("click", () => historyAction("reset_memory"));
$("open-file").addEventListener("change", (e) => { if (e.target.files[0]) openUpload(e.target.files[0]); e.target.value = ""; });
$("upload-edit").addEventListener("change", (e) => { if (e.target.files[0]) uploadEdited(e.target.files[0]); e.target.value = ""; });
$("new-session").addEventListener("click", async () => {
  try { setSession(await api("/api/sessions", { method: "POST" })); } catch (e) { status(e.message, true); }
});
$("cancel-apply").addEventListener("click", cancelApply);
$("refresh-sessions").addEventListener("click", refreshSessions);
$("select-mask").addEventListener("click", selectUnderMask);
$("select-invert").addEventListener("click", () => selectionRequest({ op: "invert" }));
$("select-none").addEventListener("click", () => selectionRequest({ op: "none" }));
$("adjust-selection").addEventListener("click", () => selectionEdit("adjust"));
$("delete-selection").addEventListener("click", () => selectionEdit("delete"));
$("hide-selection").addEventListener("click", () => selectionEdit("hide"));
$("unhide-all").addEventListener("click", () => selectionEdit("unhide"));
$("select-shape").addEventListener("click", selectShape);
$("shape-fit").addEventListener("click", fitShape);
$("shape-kind").addEventListener("change", () => { showShapeKind(); redraw(); });
for (const id of [...SHAPE_IDS, "shape-show"]) $(id).addEventListener("input", redraw);
$("show-selection").addEventListener("change", showHighlight);
$("export-hidden").addEventListener("change", showExportLinks);
showShapeKind();

// ------------------------------------------------------------------ 3D selection
// The server keeps the session's selection (Gaussians, not pixels): the mask layer painted
// on a view selects every Gaussian whose centre lies under it; delete and colour adjustment
// are history entries like any edit, and "Only the selection" limits an applied edit to it.
function showSelected(n) {
  sp.selected = n;
  $("selected-count").textContent = `${n} selected`;
  $("delete-selection").disabled = !n;
  $("adjust-selection").disabled = !n;
  $("hide-selection").disabled = !n;
}

async function selectionRequest(body) {
  const sid = sp.sid;
  try {
    const r = await api(`/api/sessions/${sid}/selection`, {
      method: "POST", headers: { "Content-Type": "application/json" }, body: JSON.stringify(body),
    });
    if (sid === sp.sid) { showSelected(r.selected); refreshSelection(); }
    return sid === sp.sid;
  } catch (e) {
    status(`selection failed: ${e.message}`, true);
    return false;
  }
}

async function selectUnderMask() {
  if (!sp.hasMask) {
    status("paint the mask layer over the Gaussians to select first", true);
    return;
  }
  const c = work.getContext("2d");
  c.globalCompositeOperation = "source-over";
  c.fillStyle = "#000";
  c.fillRect(0, 0, SIZE, SIZE);
  c.drawImage(maskLayer, 0, 0);
  const under = { view: { ...sp.view, width: SIZE, height: SIZE }, mask: work.toDataURL("image/png") };
  if (await selectionRequest({ brush: under, mode: $("sel-mode").value })) {
    maskLayer.getContext("2d").clearRect(0, 0, SIZE, SIZE);
    sp.hasMask = false;
    redraw(); saveDraft(); showStatusLine(); markReady();
  }
}

async function selectionEdit(what) {
  if (sp.applying || sp.remoteBusy || !sp.info) return;
  const sid = sp.sid;
  sp.notice = null;
  const body = what === "adjust"
    ? { hue: +$("hsv-h").value, saturation: +$("hsv-s").value, brightness: +$("hsv-v").value } : {};
  try {
    const info = await change(sid, what === "unhide" ? "unhide" : `selection/${what}`, body);
    if (sid !== sp.sid) return;
    clearEdits();
    showInfo(info);
    status(info.changed ? `${info.history[info.index].label}: done`
      : "that changed no Gaussian; nothing was added to the history");
  } catch (e) {
    if (sid !== sp.sid) return;
    await refused(sid, e);
  }
}

// The selection tinted in the view: the WebGL viewport tints its colour texture; server frames
// are asked for with the highlight while orbiting (frames to look at: the painting tools get
// the plain frame, the one an edit is composed on).
const highlightFrames = () => !sp.gl && $("show-selection").checked && sp.selected > 0
  && !locked() && tool() === "orbit";

async function refreshSelection() {
  const sid = sp.sid;
  try {
    const r = await api(`/api/sessions/${sid}/selection`);
    if (sid !== sp.sid) return;
    sp.selection = Uint32Array.from(r.indices);
    showSelected(r.selected);
    showHighlight();
  } catch (e) {
    status(`could not read the selection: ${e.message}`, true);
  }
}

function showHighlight() {
  sp.selSeq += 1; // (a tinted server frame shows the selection of its request)
  if (sp.gl) sp.gl.setSelection($("show-selection").checked ? sp.selection : null);
  else requestFrame(true);
}

function showExportLinks() {
  if (!sp.info) return;
  const hidden = $("export-hidden").value;
  for (const f of ["ply", "splat"]) {
    $(`export-${f}`).href = `/api/sessions/${sp.info.id}/export?format=${f}&hidden=${hidden}`;
  }
}

// ------------------------------------------------------------------ box and sphere selection
// Typed in world coordinates (Fit puts the shape where the view looks) and drawn over the view
// by projecting it with the view's own camera (views.orbit_camera, as viewport.js computes it).
function showShapeKind() {
  const box = $("shape-kind").value === "box";
  for (const el of document.querySelectorAll(".box-only")) el.hidden = !box;
  $("shape-size-label").textContent = box ? "Half size" : "Radius";
  $("select-shape").textContent = box ? "Select in box" : "Select in sphere";
}

// {kind, centre, half|radius}, or a string saying what is missing or wrong
function shapeSpec() {
  const kind = $("shape-kind").value;
  const ids = kind === "box" ? SHAPE_IDS : SHAPE_IDS.slice(0, 4);
  const v = ids.map((id) => $(id).value.trim());
  if (v.some((x) => x === "")) return `fill in the ${kind}'s centre and ${kind === "box" ? "half size" : "radius"} (or press Fit to view)`;
  const n = v.map(Number);
  if (!n.every(Number.isFinite)) return `the ${kind}'s fields must be numbers`;
  if (n.slice(3).some((x) => x < 0)) return `the ${kind}'s size must not be negative`;
  return kind === "box" ? { kind, centre: n.slice(0, 3), half: n.slice(3) }
    : { kind, centre: n.slice(0, 3), radius: n[3] };
}

const shapeShown = () => $("shape-show").checked && !!sp.info && !!sp.info.orbit && typeof shapeSpec() === "object";

function shapeBody(s) {
  if (s.kind === "sphere") return { sphere: { centre: s.centre, radius: s.radius } };
  return { box: { min: s.centre.map((c, i) => c - s.half[i]), max: s.centre.map((c, i) => c + s.half[i]) } };
}

async function selectShape() {
  const s = shapeSpec();
  if (typeof s === "string") { status(s, true); return; }
  if (await selectionRequest({ ...shapeBody(s), mode: $("sel-mode").value })) {
    status(`${sp.selected} selected`);
  }
}

// The view's camera: eye, and the right/down/forward axes (OpenCV, as camera.look_at).
function viewAxes() {
  const o = sp.info.orbit, v = sp.view;
  const fovY = (o.fov_y_deg * Math.PI) / 180;
  const f = SIZE / (2 * Math.tan(fovY / 2));
  const dist = ((o.margin * Math.max(o.radius, 1e-6)) / Math.sin(fovY / 2)) * v.zoom;
  const az = (v.az * Math.PI) / 180, el = (v.el * Math.PI) / 180;
  const d = [Math.cos(el) * Math.cos(az), Math.cos(el) * Math.sin(az), Math.sin(el)];
  const h = Math.hypot(d[0], d[1]);
  const right = [-d[1] / h, d[0] / h, 0]; // up x d, normalised
  const camUp = [d[1] * right[2] - d[2] * right[1], d[2] * right[0] - d[0] * right[2], d[0] * right[1] - d[1] * right[0]];
  const target = [0, 1, 2].map((i) => o.centre[i] + o.radius * (v.pan_x * right[i] + v.pan_y * camUp[i]));
  const eye = target.map((t, i) => t + dist * d[i]);
  const fwd = d.map((x) => -x);
  const down = camUp.map((x) => -x);
  return { eye, target, right, down, fwd, f };
}

function fitShape() {
  if (!sp.info || !sp.info.orbit) return;
  const { target } = viewAxes();
  const size = sp.info.orbit.radius * 0.25 * Math.min(1, sp.view.zoom);
  const values = [...target, size, size, size];
  SHAPE_IDS.forEach((id, i) => { $(id).value = String(Number(values[i].toPrecision(3))); });
  redraw();
}

function drawShape(c) {
  const s = shapeSpec();
  const { eye, right, down, fwd, f } = viewAxes();
  const project = (p) => {
    const q = [p[0] - eye[0], p[1] - eye[1], p[2] - eye[2]];
    const z = q[0] * fwd[0] + q[1] * fwd[1] + q[2] * fwd[2];
    if (z <= 1e-6) return null;
    const x = q[0] * right[0] + q[1] * right[1] + q[2] * right[2];
    const y = q[0] * down[0] + q[1] * down[1] + q[2] * down[2];
    return [SIZE / 2 + (f * x) / z, SIZE / 2 + (f * y) / z];
  };
  const lines = [];
  if (s.kind === "box") {
    const corner = (k) => s.centre.map((ci, i) => ci + ((k >> i) & 1 ? 1 : -1) * s.half[i]);
    for (let k = 0; k < 8; k += 1) {
      for (let i = 0; i < 3; i += 1) if (!((k >> i) & 1)) lines.push([corner(k), corner(k | (1 << i))]);
    }
  } else {
    const n = 48;
    for (const [a, b] of [[0, 1], [0, 2], [1, 2]]) {
      for (let k = 0; k < n; k += 1) {
        const seg = [k, k + 1].map((j) => {
          const t = (2 * Math.PI * j) / n, p = [...s.centre];
          p[a] += s.radius * Math.cos(t); p[b] += s.radius * Math.sin(t);
          return p;
        });
        lines.push(seg);
      }
    }
  }
  c.save();
  c.strokeStyle = "#ffcc00";
  c.lineWidth = 1.5;
  c.beginPath();
  for (const [p, q] of lines) {
    const a = project(p), b = project(q);
    if (!a || !b) continue;
    c.moveTo(a[0], a[1]);
    c.lineTo(b[0], b[1]);
  }
  c.stroke();
  c.restore();
}

document.addEventListener("keydown", (e) => {
  if (!(e.ctrlKey || e.metaKey)) return;
  if (e.target.matches && e.target.matches("input[type=number]")) return; // (its own undo)
  const key = e.key.toLowerCase(); // with Shift held, e.key is "Z"
  if (key === "z") { e.preventDefault(); historyAction(e.shiftKey ? "redo" : "undo"); }
  if (key === "y") { e.preventDefault(); historyAction("redo"); }
});

// ------------------------------------------------------------------ the session list
async function refreshSessions() {
  try {
    const { sessions } = await api("/api/sessions");
    const list = $("sessions");
    list.replaceChildren();
    for (const s of sessions) {
      const li = document.createElement("li");
      const when = new Date(s.used * 1000).toLocaleString();
      const n = s.entries ? ` · ${s.entries - 1} edit${s.entries === 2 ? "" : "s"}` : "";
      li.textContent = `${s.name}${n} · ${when}`;
      li.dataset.id = s.id;
      li.title = s.id;
      li.classList.toggle("current", s.id === sp.sid);
      li.addEventListener("click", () => openSession(s.id));
      list.appendChild(li);
    }
  } catch (e) {
    status(`could not list the sessions: ${e.message}`, true);
  }
}

async function openSession(id) {
  if (id === sp.sid) return;
  try { setSession(await api(`/api/sessions/${id}`)); } catch (e) {
    status(`could not open that session: ${e.message}`, true);
    refreshSessions();
  }
}

// The WebGL viewport, or the reason there is none (then frames come from the server).
async function startViewport() {
  const missing = sp.cfg.viewport_missing;
  try {
    if (missing) throw new Error(missing);
    const { createViewport } = await import("/static/viewport.js");
    sp.gl = await createViewport($("gl"), SIZE);
    sp.gl.onSettled = () => { markReady(); showStatusLine(); };
    document.body.dataset.viewport = "webgl";
  } catch (e) {
    sp.gl = null;
    sp.glWhy = `no WebGL viewport: ${e.message}`;
    document.body.dataset.viewport = "server";
    $("gl").hidden = true;
    console.warn(`${sp.glWhy}; frames come from the server`);
  }
}

async function start() {
  try {
    sp.cfg = await api("/api/config");
    await startViewport();
    for (const [sel, items, def] of [["method", sp.cfg.methods, sp.cfg.default_method], ["kind", sp.cfg.kinds, sp.cfg.default_kind]]) {
      for (const m of items) $(sel).add(new Option(m, m, m === def, m === def));
    }
    loadSettings();
    const m = location.hash.match(/s=([0-9a-f]{32})/);
    let info = null;
    if (m) {
      try { info = await api(`/api/sessions/${m[1]}`); } catch (e) {
        status(`session ${m[1].slice(0, 8)}… could not be opened (${e.message}); starting a new one`, true);
      }
    }
    if (!info) info = await api("/api/sessions", { method: "POST" });
    setSession(info);
  } catch (e) {
    status(`could not start: ${e.message}`, true);
  }
}
start();
