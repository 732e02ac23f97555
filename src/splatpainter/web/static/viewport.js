// The client-side viewport: the session's asset rendered in this browser with WebGL, so that
// orbiting, panning and zooming make no server request.
//
// Library: the PlayCanvas engine (npm `playcanvas`, pinned in web/package-lock.json, installed
// by scripts/setup.sh with `npm ci` and served by this server at /vendor/playcanvas.mjs; nothing
// comes from a CDN). Chosen over Spark (`@sparkjsdev/spark` 2.2.0 on three.js 0.187) by a
// measurement in the headless Chromium (SwiftShader software GL) the tests use, on the 20,000-
// Gaussian demo asset at 512x512, 2 busy cores: PlayCanvas 2.23.3 drew 19.6 frames/s while
// orbiting, Spark 1.7-2.5 (its per-frame splat generation pass and a pixel read-back per frame
// cost ~0.5 s in software GL); PlayCanvas is one 2.5 MB module with no dependency, Spark needs
// 2.7 MB plus three.js (2.1 MB). Both load a .ply from bytes (PlayCanvas as an asset whose
// contents is a Response) and agree with the server's renderer above 30 dB PSNR (PlayCanvas
// 34.7 dB, Spark 47 dB: Spark is the closer twin, but not usable at 2 frames/s here). Colours
// update in place: PlayCanvas keeps the colour texture's data on the CPU, so a delta writes
// only the changed texels and re-uploads, and `workBufferUpdate = ONCE` re-renders its work
// buffer.
//
// The camera is the server's `orbit_camera` (views.py) computed here from the same orbit
// parameters, bounding sphere, field of view and margin, which asset.ply's X-Orbit header gives.
const SH_C0 = 0.28209479177387814;
// A selected Gaussian's colour is mixed half and half with this (selection.tinted, server side).
const HIGHLIGHT = [1.0, 0.8, 0.0];

export function webgl2Missing() {
  try {
    const gl = document.createElement("canvas").getContext("webgl2");
    return gl ? null : "this browser has no WebGL2";
  } catch (e) {
    return `WebGL2 failed: ${e.message}`;
  }
}

// Orbit parameters -> eye and target, exactly as views.orbit_camera computes them.
export function orbitEye(view, orbit, width, height) {
  const fovY = (orbit.fov_y_deg * Math.PI) / 180;
  const f = height / (2 * Math.tan(fovY / 2));
  const fovX = 2 * Math.atan(width / (2 * f));
  const radius = Math.max(orbit.radius, 1e-6);
  const dist = ((orbit.margin * radius) / Math.sin(Math.min(fovX, fovY) / 2)) * view.zoom;
  const az = (view.az * Math.PI) / 180, el = (view.el * Math.PI) / 180;
  const d = [Math.cos(el) * Math.cos(az), Math.cos(el) * Math.sin(az), Math.sin(el)];
  // right = normalize(up x d) with up = +Z; camUp = d x right
  let right = [-d[1], d[0], 0];
  const n = Math.hypot(right[0], right[1]);
  right = [right[0] / n, right[1] / n, 0];
  const camUp = [
    d[1] * right[2] - d[2] * right[1],
    d[2] * right[0] - d[0] * right[2],
    d[0] * right[1] - d[1] * right[0],
  ];
  const c = orbit.centre, r = orbit.radius;
  const target = [0, 1, 2].map((i) => c[i] + r * (view.pan_x * right[i] + view.pan_y * camUp[i]));
  const eye = [0, 1, 2].map((i) => target[i] + dist * d[i]);
  return { eye, target, dist };
}

export class Viewport {
  constructor(pc, canvas, size) {
    this.pc = pc;
    this.canvas = canvas;
    this.size = size;
    this.sid = null;
    this.token = null;       // the server's name for the asset this viewport holds
    this.orbit = null;       // centre, radius, fov_y_deg, margin, background
    this.entity = null;
    this.asset = null;
    this.view = null;
    this.frames = 0;         // frames drawn (the benchmark's counter)
    this.stamps = [];
    this.fps = 0;
    this.changeSeq = 0;      // bumps on every change of view or data
    this.settledSeq = -1;    // the change the last settled frame showed
    this.sortedSince = true;
    this.readySince = false;
    this.framesSince = 0;
    this.loads = 0;          // full asset loads (a delta after an edit must not need one)
    this.deltas = 0;         // colour deltas applied
    this.selection = null;   // indices of the selected Gaussians, tinted in the colour texture
    this.selMask = null;     // Uint8Array [numSplats]: which are tinted now
    this.highlighted = 0;    // how many are tinted now
    this.onSettled = null;

    const app = new pc.Application(canvas, {
      graphicsDeviceOptions: { antialias: false, alpha: false, preserveDrawingBuffer: true },
    });
    app.graphicsDevice.maxPixelRatio = 1;
    app.setCanvasFillMode(pc.FILLMODE_NONE);
    app.setCanvasResolution(pc.RESOLUTION_FIXED, size, size);
    app.autoRender = false; // drawn while something changes, then idle (no CPU while resting)
    this.app = app;
    const cam = new pc.Entity("camera");
    cam.addComponent("camera", { clearColor: new pc.Color(0, 0, 0, 1), fov: 40 });
    app.root.addChild(cam);
    this.camera = cam;
    // a frame is final once the splats were sorted for the camera it was drawn with
    app.scene.on("gsplat:sorted", () => { this.sortedSince = true; });
    app.systems.gsplat.on("frame:ready", (_cam, _layer, ready) => { if (ready) this.readySince = true; });
    app.on("update", () => {
      if (this.settledSeq === this.changeSeq) return;
      app.renderNextFrame = true;
    });
    app.on("frameend", () => {
      if (this.settledSeq === this.changeSeq || !this.entity) return;
      this.frames += 1;
      this.framesSince += 1;
      const now = performance.now(); // frames over the last second (the status line's fps)
      this.stamps = this.stamps.filter((t) => now - t < 1000).concat([now]);
      const n = this.stamps.length;
      this.fps = n > 1 ? (1000 * (n - 1)) / (now - this.stamps[0]) : 0;
      // settled: sorted and ready after the change and two more frames drawn, or a generous
      // number of frames when no sort was needed (the camera did not move enough to ask one)
      if ((this.sortedSince && this.readySince && this.framesSince >= 3) || this.framesSince >= 90) {
        this.settledSeq = this.changeSeq;
        if (this.onSettled) this.onSettled();
      }
    });
    app.start();
  }

  get settled() { return !!this.entity && this.settledSeq === this.changeSeq; }

  changed(needsSort) {
    this.changeSeq += 1;
    this.framesSince = 0;
    this.readySince = false;
    if (needsSort) this.sortedSince = false;
  }

  // The session's current asset, in full (once per session, or when a delta cannot apply).
  async load(sid) {
    const pc = this.pc;
    const r = await fetch(`/api/sessions/${sid}/asset.ply`);
    if (!r.ok) {
      let detail = r.statusText;
      try { detail = (await r.json()).detail; } catch (e) { /* not JSON */ }
      throw new Error(`asset: ${r.status}: ${detail}`);
    }
    const token = Number(r.headers.get("X-Asset-Token"));
    const orbit = JSON.parse(r.headers.get("X-Orbit"));
    // the engine reads the .ply from this Response; reorder: false keeps the server's order,
    // so that a delta's indices address the same Gaussians
    const asset = new pc.Asset(`asset-${sid}-${token}`, "gsplat",
      { url: `/api/sessions/${sid}/asset-${token}.ply`, filename: "asset.ply", contents: r },
      { reorder: false });
    this.app.assets.add(asset);
    await new Promise((resolve, reject) => {
      asset.once("load", resolve);
      asset.once("error", (err) => reject(new Error(`asset: ${err}`)));
      this.app.assets.load(asset);
    });
    if (this.entity) { this.entity.destroy(); this.app.assets.remove(this.asset); this.asset.unload(); }
    const e = new pc.Entity("splats");
    e.addComponent("gsplat", { asset });
    this.app.root.addChild(e);
    const bg = orbit.background;
    this.camera.camera.clearColor = new pc.Color(bg[0], bg[1], bg[2], 1);
    Object.assign(this, { sid, token, orbit, entity: e, asset });
    this.selMask = null; // the new texture holds the true colours
    this.highlighted = 0;
    this.paintSelection();
    this.loads += 1;
    if (this.view) this.setView(this.view, true);
    this.changed(true);
  }

  // Bring the asset up to the session's current state: a colour delta, or a full load when
  // the server has none for the asset held here (another session, or geometry changed).
  async sync(sid) {
    if (sid !== this.sid || this.token === null) return this.load(sid);
    const r = await fetch(`/api/sessions/${sid}/delta?since=${this.token}`);
    if (r.status === 409) return this.load(sid);
    if (!r.ok) throw new Error(`delta: ${r.status}: ${r.statusText}`);
    const buf = await r.arrayBuffer();
    this.applyDelta(buf);
    this.token = Number(r.headers.get("X-Asset-Token"));
    this.deltas += 1;
    return null;
  }

  // viewport.colour_delta's bytes: the changed Gaussians' SH (all bands) and opacity.
  applyDelta(buf) {
    const pc = this.pc;
    const head = new DataView(buf, 0, 20);
    const magic = String.fromCharCode(...new Uint8Array(buf, 0, 4));
    const n = head.getUint32(4, true), count = head.getUint32(8, true), k = head.getUint32(12, true);
    if (magic !== "SPD1") throw new Error(`delta: bad magic ${magic}`);
    const resource = this.asset.resource;
    const data = resource.gsplatData;
    if (data.numSplats !== n) throw new Error(`delta: ${n} Gaussians, the viewport holds ${data.numSplats}`);
    if (count === 0) return;
    const idx = new Uint32Array(buf, 20, count);
    const sh = new Float32Array(buf, 20 + 4 * count, count * k * 3);
    const op = new Float32Array(buf, 20 + 4 * count * (1 + 3 * k), count);
    const dc = [0, 1, 2].map((c) => data.getProp(`f_dc_${c}`));
    const opacity = data.getProp("opacity");
    const rest = [];
    for (let j = 0; j < 3 * (k - 1); j += 1) rest.push(data.getProp(`f_rest_${j}`));
    const texture = resource.getTexture("splatColor");
    const texels = texture.lock();
    for (let m = 0; m < count; m += 1) {
      const i = idx[m], base = m * k * 3;
      for (let c = 0; c < 3; c += 1) dc[c][i] = sh[base + c];
      opacity[i] = op[m];
      // the .ply stores the higher bands channel-major: all R coefficients, then G, then B
      for (let c = 0; c < 3 && rest.length; c += 1) {
        for (let b = 1; b < k; b += 1) {
          const p = rest[c * (k - 1) + b - 1];
          if (p) p[i] = sh[base + b * 3 + c];
        }
      }
      this.writeTexel(texels, i, dc, opacity);
    }
    texture.unlock();
    if (k > 1 && resource.shBands > 0) resource.updateSHData(data);
    this.entity.gsplat.workBufferUpdate = pc.WORKBUFFER_UPDATE_ONCE;
    this.changed(false);
  }

  // One Gaussian's texel from its data: base colour (tinted when selected) and opacity.
  writeTexel(texels, i, dc, opacity) {
    const half = this.pc.FloatPacking.float2Half;
    const tint = this.selMask !== null && this.selMask[i] === 1;
    for (let c = 0; c < 3; c += 1) {
      const colour = dc[c][i] * SH_C0 + 0.5;
      texels[i * 4 + c] = half(tint ? 0.5 * colour + 0.5 * HIGHLIGHT[c] : colour);
    }
    texels[i * 4 + 3] = half(1 / (1 + Math.exp(-opacity[i])));
  }

  // Show the selection (indices; null or empty: none) tinted. Only the colour texture changes:
  // the data keeps the true colours, so a delta stays exact and clearing restores them.
  setSelection(indices) {
    this.selection = indices && indices.length ? indices : null;
    this.paintSelection();
  }

  paintSelection() {
    if (!this.asset) return;
    const resource = this.asset.resource;
    const data = resource.gsplatData;
    const n = data.numSplats;
    const want = new Uint8Array(n);
    if (this.selection) for (const i of this.selection) if (i < n) want[i] = 1;
    const had = this.selMask || new Uint8Array(n);
    const flip = [];
    for (let i = 0; i < n; i += 1) if (want[i] !== had[i]) flip.push(i);
    this.selMask = want;
    this.highlighted = want.reduce((a, b) => a + b, 0);
    if (!flip.length) return;
    const dc = [0, 1, 2].map((c) => data.getProp(`f_dc_${c}`));
    const opacity = data.getProp("opacity");
    const texture = resource.getTexture("splatColor");
    const texels = texture.lock();
    for (const i of flip) this.writeTexel(texels, i, dc, opacity);
    texture.unlock();
    this.entity.gsplat.workBufferUpdate = this.pc.WORKBUFFER_UPDATE_ONCE;
    this.changed(false);
  }

  setView(view, force = false) {
    const same = this.view && ["az", "el", "zoom", "pan_x", "pan_y"].every((k) => this.view[k] === view[k]);
    this.view = { ...view };
    if (!this.orbit || (same && !force)) return;
    const { eye, target, dist } = orbitEye(view, this.orbit, this.size, this.size);
    const cam = this.camera;
    cam.camera.nearClip = Math.max(1e-4, dist * 1e-3);
    cam.camera.farClip = dist * 1e3 + this.orbit.radius * 10;
    cam.setPosition(eye[0], eye[1], eye[2]);
    cam.lookAt(target[0], target[1], target[2], 0, 0, 1);
    this.changed(true);
  }

  snapshot() { return this.canvas.toDataURL("image/png"); }
}

export async function createViewport(canvas, size) {
  const missing = webgl2Missing();
  if (missing) throw new Error(missing);
  const pc = await import("/vendor/playcanvas.mjs");
  return new Viewport(pc, canvas, size);
}
