// layerwise layer explorer. No framework, no build step, no CDN: plain DOM, SVG and canvas.
// User text only ever reaches the page through textContent / createTextNode / setAttribute:
// nothing here parses a string as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const state = {
  info: null, model: null, tokens: null, selected: null, attention: null, projection: null,
  timings: {}, requests: 0,
};
window.layerwiseExplorer = { state }; // read by the browser test

// ------------------------------------------------------------------------------------------ helpers
function el(tag, attrs = {}, ...children) {
  const svg = ["svg", "rect", "circle", "text", "g", "title", "line"].includes(tag);
  const node = svg ? document.createElementNS("http://www.w3.org/2000/svg", tag) : document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.setAttribute("class", v);
    else if (k === "style") Object.assign(node.style, v); // CSSOM, allowed by the page's CSP (style attributes are not)
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, String(v));
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.appendChild(typeof child === "string" || typeof child === "number" ? document.createTextNode(String(child)) : child);
  }
  return node;
}

function headers() {
  const h = { "Content-Type": "application/json" };
  const key = sessionStorage.getItem("layerwise-key");
  if (key) h.Authorization = "Bearer " + key;
  return h;
}

class ApiProblem extends Error {}

async function api(path, body) {
  state.requests += 1;
  let response;
  try {
    response = await fetch(path, body === undefined ? { headers: headers() } : { method: "POST", headers: headers(), body: JSON.stringify(body) });
  } catch (e) {
    throw new ApiProblem("cannot reach the server: " + e.message);
  }
  let data = null;
  try { data = await response.json(); } catch (e) { data = null; }
  if (!response.ok) {
    if (response.status === 401) $("key-label").hidden = false;
    const message = data && data.error ? data.error.message : (data && data.detail ? JSON.stringify(data.detail) : response.statusText);
    throw new ApiProblem(`${response.status}: ${message}`);
  }
  return data;
}

function showError(message) {
  const box = $("error");
  box.textContent = message;
  box.hidden = !message;
}

function pyString(s) { return JSON.stringify(s); } // a JSON string is a valid Python string literal

function fmt(v, digits = 2) { return v === null || v === undefined || Number.isNaN(v) ? "–" : v.toFixed(digits); }

// Viridis-like sequential colour scale, t in [0, 1].
const STOPS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
function colour(t) {
  if (t === null || Number.isNaN(t)) return "rgb(238,238,238)";
  t = Math.min(1, Math.max(0, t)) * (STOPS.length - 1);
  const i = Math.min(STOPS.length - 2, Math.floor(t)), f = t - i;
  const c = STOPS[i].map((a, k) => Math.round(a + f * (STOPS[i + 1][k] - a)));
  return `rgb(${c[0]},${c[1]},${c[2]})`;
}
function inkFor(t) { return t !== null && t < 0.55 ? "#fff" : "#111"; }

function mark(text, start, end) {
  // a sentence with [start, end) highlighted, as DOM nodes
  return el("span", {}, text.slice(0, start), el("mark", {}, text.slice(start, end)), text.slice(end));
}

function textBody() {
  const body = { model: state.model, text: $("text").value };
  const pair = $("text-pair").value;
  if (pair.trim()) body.text_pair = pair;
  return body;
}

function modelInfo() { return state.info.models.find((m) => m.id === state.model); }

function extractCall() {
  const pair = $("text-pair").value.trim();
  const enc = `enc = lw.Encoder(${pyString(state.model)})\n`;
  return pair
    ? enc + `stack = enc.extract([${pyString($("text").value)}], text_pairs=[${pyString($("text-pair").value)}], long_texts="window")[0]\n`
    : enc + `stack = enc.extract(${pyString($("text").value)}, long_texts="window")\n`;
}

// ------------------------------------------------------------------------------------------ grid
async function runText() {
  showError("");
  $("grid").removeAttribute("data-ms"); // set again when this text's grid is drawn
  const t0 = performance.now();
  const body = textBody();
  let data;
  try {
    data = await api("/v1/explore/tokens", body);
  } catch (e) {
    showError(e.message);
    return;
  }
  state.tokens = data;
  state.selected = null;
  renderGrid();
  const ms = performance.now() - t0;
  state.timings.grid = ms;
  $("grid").setAttribute("data-ms", ms.toFixed(1));
  $("grid-info").textContent = `${data.tokens.length} tokens × ${data.layers.length} layers` +
    (data.n_windows > 1 ? ` · ${data.n_windows} windows` : "") + ` · ${(ms / 1000).toFixed(2)} s`;
  runGridCode();
  const params = new URLSearchParams({ text: body.text, model: state.model });
  if (body.text_pair) params.set("pair", body.text_pair);
  history.replaceState(null, "", "?" + params.toString());
  clearNeighbours();
  loadAttention();
  loadLens();
}

function renderGrid() {
  const data = state.tokens;
  if (!data) return;
  const name = $("statistic").value;
  const values = data.statistics[name];
  const finite = values.flat().filter((v) => v !== null);
  const lo = Math.min(...finite), hi = Math.max(...finite);
  const scale = (v) => (v === null ? null : hi > lo ? (v - lo) / (hi - lo) : 0.5);
  const pair = data.text_pair !== null;
  const head = el("tr", {}, el("th", {}, "#"), el("th", {}, "token"), pair ? el("th", {}, "seg") : null,
    ...data.layers.map((l) => el("th", {}, "L" + l)));
  const rows = data.tokens.map((token, t) => {
    const cells = data.layers.map((layer, k) => {
      const v = values[k][t], s = scale(v);
      const label = `${token} · L${layer} · ${$("statistic").selectedOptions[0].textContent} = ${v === null ? "undefined (no previous layer)" : v.toPrecision(6)}`;
      return el("td", {
        class: "cell", "data-layer": layer, "data-token": t, "data-value": v === null ? "" : String(v), title: label,
        style: { background: colour(s), color: inkFor(s) },
        onmouseenter: () => { $("grid-readout").textContent = label; },
        onclick: () => selectToken(t),
      }, fmt(v, name === "norm" || name === "drift" ? 1 : 2));
    });
    return el("tr", { "data-token": t, class: t === state.selected ? "selected" : "" },
      el("td", { class: "idx" }, t),
      el("td", {}, el("button", { class: "tok", type: "button", "data-token": t, onclick: () => selectToken(t) }, token)),
      pair ? el("td", { class: "seg" }, data.segment_ids[t]) : null, ...cells);
  });
  $("grid").replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
}

// ------------------------------------------------------------------------------------------ neighbours
function clearNeighbours() {
  $("neighbours").replaceChildren();
  $("nb-token").textContent = "";
  $("nb-info").textContent = "Click a token in the grid.";
  $("nb-code").textContent = "";
}

async function selectToken(t) {
  state.selected = t;
  for (const row of $("grid").querySelectorAll("tbody tr")) row.classList.toggle("selected", Number(row.dataset.token) === t);
  $("nb-token").textContent = state.tokens.tokens[t];
  $("nb-info").textContent = "searching the reference set…";
  let data;
  try {
    data = await api("/v1/explore/neighbours", { ...textBody(), token: t, k: 5 });
  } catch (e) {
    $("nb-info").textContent = e.message;
    showError(e.message);
    return;
  }
  if (state.selected !== t) return; // a later click won
  $("nb-info").textContent = `5 nearest tokens per layer by cosine, among ${data.reference}`;
  const rows = [];
  data.layers.forEach((layer, k) => {
    data.neighbours[k].forEach((n, i) => {
      rows.push(el("tr", { "data-layer": layer },
        el("td", { class: "layer" }, i === 0 ? "L" + layer : ""),
        el("td", { class: "cos" }, n.cosine.toFixed(3)),
        el("td", { class: "sentence" }, mark(n.text, n.start, n.end))));
    });
  });
  $("neighbours").replaceChildren(el("tbody", {}, ...rows));
  $("nb-code").textContent = "import layerwise as lw\nfrom layerwise.explore import ReferenceSet\n\n" + extractCall() +
    "reference = ReferenceSet.sample(enc)  # or ReferenceSet.from_store(\"corpus.lw\")\n" +
    `rows = [stack.layers.index(l) for l in reference.layers]\nreference.neighbours(stack.hidden[rows, ${t}], k=5)  # ${JSON.stringify(data.token_text)}`;
}

// ------------------------------------------------------------------------------------------ attention
function fillAttentionControls() {
  const m = modelInfo();
  const layers = [];
  for (let l = 1; l < m.n_hidden_states; l++) layers.push(el("option", { value: l }, "L" + l));
  $("att-layer").replaceChildren(...layers);
  $("att-layer").value = String(m.n_hidden_states - 1);
  const heads = [el("option", { value: "mean" }, "average of heads")];
  for (let h = 0; h < m.n_heads; h++) heads.push(el("option", { value: h }, "head " + h));
  $("att-head").replaceChildren(...heads);
}

async function loadAttention() {
  if (!state.tokens) return;
  const layer = Number($("att-layer").value);
  $("att-info").textContent = "loading…";
  let data;
  try {
    data = await api("/v1/explore/attention", { ...textBody(), layer });
  } catch (e) {
    $("att-info").textContent = e.message;
    return;
  }
  const bytes = Uint8Array.from(atob(data.attention.data), (c) => c.charCodeAt(0));
  const [H, T] = data.attention.shape;
  state.attention = { layer: data.layer, tokens: data.tokens, heads: H, n: T, values: new Float32Array(bytes.buffer) };
  $("att-info").textContent = `${T} tokens · ${H} heads` + (data.truncated ? " · text truncated to the model maximum" : "");
  drawAttention();
}

function attentionMatrix() {
  const a = state.attention, head = $("att-head").value, n = a.n;
  const out = new Float32Array(n * n);
  if (head === "mean") {
    for (let h = 0; h < a.heads; h++) for (let i = 0; i < n * n; i++) out[i] += a.values[h * n * n + i] / a.heads;
  } else {
    out.set(a.values.subarray(Number(head) * n * n, (Number(head) + 1) * n * n));
  }
  return out;
}

function drawAttention() {
  const a = state.attention;
  if (!a) return;
  const m = attentionMatrix(), n = a.n;
  const cell = Math.max(8, Math.min(22, Math.floor(520 / n))); // >= 8 px: room for labels (the view scrolls)
  const ctx0 = document.createElement("canvas").getContext("2d");
  ctx0.font = "11px ui-monospace, monospace";
  const margin = Math.min(120, 8 + Math.max(...a.tokens.map((t) => ctx0.measureText(t).width)));
  const canvas = $("attention");
  canvas.width = margin + n * cell + 4;
  canvas.height = margin + n * cell + 4;
  const ctx = canvas.getContext("2d");
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, canvas.width, canvas.height);
  let max = 0;
  for (const v of m) max = Math.max(max, v);
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
    ctx.fillStyle = colour(max > 0 ? m[i * n + j] / max : 0);
    ctx.fillRect(margin + j * cell, margin + i * cell, cell, cell);
  }
  ctx.fillStyle = "#1f2328";
  ctx.font = "11px ui-monospace, monospace";
  {
    ctx.font = `${Math.min(11, cell)}px ui-monospace, monospace`;
    ctx.textAlign = "right";
    ctx.textBaseline = "middle";
    a.tokens.forEach((t, i) => ctx.fillText(t, margin - 4, margin + i * cell + cell / 2, margin - 6));
    ctx.save();
    ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "left";
    a.tokens.forEach((t, j) => ctx.fillText(t, -margin + 4, margin + j * cell + cell / 2, margin - 6));
    ctx.restore();
  }
  canvas.dataset.layer = String(a.layer);
  canvas.dataset.head = $("att-head").value;
  canvas.onmousemove = (ev) => {
    const r = canvas.getBoundingClientRect();
    const j = Math.floor((ev.clientX - r.left - margin) / cell), i = Math.floor((ev.clientY - r.top - margin) / cell);
    if (i >= 0 && j >= 0 && i < n && j < n)
      $("att-readout").textContent = `L${a.layer} ${$("att-head").selectedOptions[0].textContent}: ${a.tokens[i]} → ${a.tokens[j]} = ${m[i * n + j].toFixed(4)}`;
  };
  const head = $("att-head").value;
  $("att-code").textContent = "import layerwise as lw\n\n" + extractCall().replace('long_texts="window"', 'taps=["attention_probs"]') +
    `maps = stack.taps["attention_probs"]  # (layers 1..${modelInfo().n_hidden_states - 1}, heads, tokens, tokens); row = attending token\n` +
    (head === "mean" ? `maps[${a.layer - 1}].mean(axis=0)` : `maps[${a.layer - 1}][${head}]`);
}

// ------------------------------------------------------------------------------------------ logit lens
async function loadLens() {
  const m = modelInfo();
  const view = $("lens-view");
  view.hidden = !m.lens;
  if (!m.lens) return;
  $("lens-mask").textContent = m.decoder ? "the next token" : m.mask_token;
  if (!m.decoder && !$("text").value.includes(m.mask_token)) {
    $("lens").replaceChildren();
    $("lens-info").textContent = `Put ${m.mask_token} in the text to see what each layer predicts there, through the model's masked-LM head.`;
    return;
  }
  let data;
  try {
    data = await api("/v1/explore/lens", { model: state.model, text: $("text").value, k: 5 });
  } catch (e) {
    $("lens-info").textContent = e.message;
    return;
  }
  $("lens-info").textContent = m.decoder
    ? "Top 5 next tokens per layer through the model's final norm and lm_head (a logit lens): L0 = embeddings."
    : "Top 5 tokens per layer through the masked-LM head (a logit lens): L0 = embeddings.";
  const column = (mk) => m.decoder ? `next token after ${data.tokens[mk.position]}` : `${m.mask_token} at token ${mk.position}`;
  const head = el("tr", {}, el("th", {}, "layer"), ...data.masks.map((mk) => el("th", {}, column(mk))));
  const rows = data.layers.map((layer, k) => el("tr", { "data-layer": layer }, el("td", {}, "L" + layer),
    ...data.masks.map((mk) => el("td", {}, ...mk.predictions[k].map(([tok, p], i) =>
      el("span", {}, i ? " · " : "", tok, el("span", { class: "p" }, " " + p.toFixed(2))))))));
  $("lens").replaceChildren(el("thead", {}, head), el("tbody", {}, ...rows));
  $("lens-code").textContent = `import layerwise as lw\nfrom layerwise.explore import logit_lens\n\nlogit_lens(lw.Encoder(${pyString(state.model)}), ${pyString($("text").value)}, k=5)`;
}

// ------------------------------------------------------------------------------------------ projection
const PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"];

async function loadProjection() {
  const words = $("proj-words").value.split(",").map((w) => w.trim()).filter(Boolean);
  $("proj-info").textContent = "projecting…";
  let data;
  try {
    data = await api("/v1/explore/projection", { model: state.model, words, projection: $("proj-method").value });
  } catch (e) {
    $("proj-info").textContent = e.message;
    $("projection").replaceChildren();
    $("proj-legend").replaceChildren();
    $("proj-layer-label").textContent = "";
    state.projection = null;
    return;
  }
  state.projection = data;
  const slider = $("proj-layer");
  slider.max = String(data.layers.length - 1);
  if (Number(slider.value) > data.layers.length - 1 || !slider.dataset.touched) slider.value = String(data.layers.length - 1);
  $("proj-info").textContent = `${data.labels.length} occurrences in ${data.reference}` +
    (data.missing.length ? ` · not found: ${data.missing.join(", ")}` : "");
  $("proj-code").textContent = "import layerwise as lw\nfrom layerwise.explore import ReferenceSet, word_projection\n\n" +
    `reference = ReferenceSet.sample(lw.Encoder(${pyString(state.model)}))\n` +
    `word_projection(reference.stacks, ${JSON.stringify(words)}, ${pyString(data.projection)})["points"]  # (layers, points, 2)\n` +
    `# the same figure as a file: layerwise plot reference.txt --words ${words.join(",")} --projection ${data.projection}`;
  drawProjection();
}

function drawProjection() {
  const data = state.projection;
  if (!data) return;
  const k = Number($("proj-layer").value);
  $("proj-layer-label").textContent = "L" + data.layers[k];
  const svg = $("projection");
  svg.dataset.layer = String(data.layers[k]);
  const W = 560, Hh = 400, pad = 20;
  const pts = data.points[k];
  const xs = pts.map((p) => p[0]), ys = pts.map((p) => p[1]);
  const [x0, x1, y0, y1] = [Math.min(...xs), Math.max(...xs), Math.min(...ys), Math.max(...ys)];
  const sx = (x) => pad + ((x - x0) / (x1 - x0 || 1)) * (W - 2 * pad);
  const sy = (y) => Hh - pad - ((y - y0) / (y1 - y0 || 1)) * (Hh - 2 * pad);
  const words = [...new Set(data.labels)];
  const dots = pts.map((p, i) => {
    const site = data.sites[i], word = data.labels[i];
    return el("circle", {
      cx: sx(p[0]).toFixed(1), cy: sy(p[1]).toFixed(1), r: 5, fill: PALETTE[words.indexOf(word) % PALETTE.length],
      "fill-opacity": 0.75, stroke: "#fff", "data-word": word,
      onmouseenter: () => $("proj-readout").replaceChildren(el("b", {}, word + ": "), mark(site.text, site.start, site.end)),
    }, el("title", {}, `${word}: ${site.text}`));
  });
  svg.replaceChildren(el("rect", { x: 0, y: 0, width: W, height: Hh, fill: "#fbfbfb", stroke: "#d0d7de" }),
    el("text", { x: 8, y: 16, "font-size": 12, fill: "#636c76" }, `${data.projection.toUpperCase()} of layer ${data.layers[k]}`), ...dots);
  $("proj-legend").replaceChildren(...words.map((w, i) => el("div", {},
    el("span", { class: "swatch", style: { background: PALETTE[i % PALETTE.length] } }), w,
    ` (${data.labels.filter((l) => l === w).length})`)));
}

// ------------------------------------------------------------------------------------------ CKA
async function loadSimilarity() {
  $("cka-info").textContent = "computing over the reference set…";
  let data;
  try {
    data = await api("/v1/explore/similarity?model=" + encodeURIComponent(state.model));
  } catch (e) {
    $("cka-info").textContent = e.message;
    return;
  }
  $("cka-info").textContent = `linear CKA between hidden states, over the tokens of ${data.reference}`;
  const n = data.layers.length, margin = 34, cell = Math.floor((420 - margin) / n);
  const cells = [];
  for (let i = 0; i < n; i++) for (let j = 0; j < n; j++) {
    const v = data.cka[i][j];
    cells.push(el("rect", { x: margin + j * cell, y: margin + i * cell, width: cell - 1, height: cell - 1, fill: colour(v), "data-value": v },
      el("title", {}, `CKA(L${data.layers[i]}, L${data.layers[j]}) = ${v.toFixed(4)}`)));
    if (cell >= 26) cells.push(el("text", { x: margin + j * cell + cell / 2, y: margin + i * cell + cell / 2 + 4, "text-anchor": "middle", "font-size": 10, fill: inkFor(v) }, v.toFixed(2)));
  }
  const labels = data.layers.flatMap((l, i) => [
    el("text", { x: margin - 4, y: margin + i * cell + cell / 2 + 4, "text-anchor": "end", "font-size": 11 }, "L" + l),
    el("text", { x: margin + i * cell + cell / 2, y: margin - 6, "text-anchor": "middle", "font-size": 11 }, "L" + l)]);
  $("similarity").replaceChildren(...cells, ...labels);
  $("cka-code").textContent = "import layerwise as lw\nfrom layerwise.explore import ReferenceSet\n\n" +
    `reference = ReferenceSet.sample(lw.Encoder(${pyString(state.model)}))\n` +
    "reference.similarity  # = lw.analyze.layer_similarity(reference.stacks, \"cka\", max_rows=4000)";
}

// ------------------------------------------------------------------------------------------ media
// An image or a speech model: one file, its units coloured by a statistic at a layer. An image's
// patches lie over the image as the model read it; a clip's frames form one strip per layer under
// its waveform.
const TEXT_VIEWS = ["grid-view", "neighbours-view", "attention-view", "lens-view", "projection-view", "similarity-view"];
const MEDIA_SIZE = 448; // an image's side on the page, in CSS pixels
const STRIP = { wave: 90, row: 14, left: 44 }; // a clip's waveform height, a layer's strip height, the labels' width

function isMedia() { const m = modelInfo(); return Boolean(m && m.modality && m.modality !== "text"); }

function showViews() {
  const media = isMedia();
  $("text-form").hidden = media;
  for (const id of TEXT_VIEWS) $(id).hidden = media || (id === "lens-view" && !(modelInfo() || {}).lens);
  $("media-view").hidden = !media;
  if (!media) return;
  const image = modelInfo().modality === "image";
  $("media-title").textContent = image ? "Patches × layers" : "Frames × layers";
  $("media-file").setAttribute("accept", image ? "image/*" : "audio/*");
  $("media-hint").textContent = image
    ? "Each patch of the image as the model read it, coloured by the statistic at the chosen layer (scaled within the layer). Hover for values."
    : "The waveform at the model's rate, and under it one strip of frames per layer (L0 = the feature encoder's output), each scaled within its layer. Click a strip to choose its layer.";
}

function readFile(file) {
  return new Promise((resolve, reject) => {
    const reader = new FileReader();
    reader.onload = () => resolve(reader.result);
    reader.onerror = () => reject(reader.error);
    reader.readAsDataURL(file);
  });
}

async function runMedia() {
  showError("");
  const file = $("media-file").files[0];
  if (!file) return;
  const t0 = performance.now();
  let data;
  try {
    data = await api("/v1/explore/media", { model: state.model, input: await readFile(file) });
  } catch (e) {
    showError(e.message);
    return;
  }
  state.media = data;
  state.mediaFile = file.name;
  if (data.image) {
    const image = new Image();
    await new Promise((resolve) => { image.onload = resolve; image.onerror = resolve; image.src = data.image; });
    state.mediaImage = image;
  }
  const slider = $("media-layer");
  slider.max = String(data.layers.length - 1);
  if (!slider.dataset.touched || Number(slider.value) > data.layers.length - 1) slider.value = String(data.layers.length - 1);
  drawMedia();
  const ms = performance.now() - t0;
  state.timings.media = ms;
  $("media-canvas").setAttribute("data-ms", ms.toFixed(1));
  const content = data.kinds.filter((k) => k === "patch" || k === "frame").length;
  const what = data.modality === "image" ? `${content} patches (${data.grid_shape[0]} × ${data.grid_shape[1]})` : `${content} frames, ${data.waveform.seconds.toFixed(2)} s`;
  const others = data.units.filter((u, i) => data.kinds[i] !== "patch" && data.kinds[i] !== "frame");
  $("media-info").textContent = `${file.name}: ${what}${others.length ? " + " + others.join(" ") : ""} × ${data.layers.length} layers` +
    (data.n_windows > 1 ? ` · ${data.n_windows} windows` : "") + ` · ${(ms / 1000).toFixed(2)} s`;
  mediaCode();
}

function scaled(values, indices) {
  // values[i] for i in indices mapped to [0, 1] within them (null: no value)
  const seen = indices.map((i) => values[i]).filter((v) => v !== null);
  const lo = Math.min(...seen), hi = Math.max(...seen);
  return (v) => (v === null ? null : hi > lo ? (v - lo) / (hi - lo) : 0.5);
}

function drawMedia() {
  const data = state.media;
  if (!data) return;
  const row = Number($("media-layer").value);
  $("media-layer-label").textContent = `L${data.layers[row]}`;
  if (data.modality === "image") drawPatches(data, row);
  else drawFrames(data, row);
}

function drawPatches(data, row) {
  const canvas = $("media-canvas"), ctx = canvas.getContext("2d");
  const [rows, cols] = data.grid_shape;
  const image = state.mediaImage;
  const aspect = image && image.width ? image.height / image.width : rows / cols;
  canvas.width = MEDIA_SIZE;
  canvas.height = Math.round(MEDIA_SIZE * aspect);
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  if (image && image.width) ctx.drawImage(image, 0, 0, canvas.width, canvas.height);
  const values = data.statistics[$("media-statistic").value][row];
  const patches = data.kinds.map((k, i) => (k === "patch" ? i : -1)).filter((i) => i >= 0);
  const t = scaled(values, patches);
  const w = canvas.width / cols, h = canvas.height / rows;
  ctx.globalAlpha = 0.6;
  for (const i of patches) {
    const [r, c] = data.grid[i];
    ctx.fillStyle = colour(t(values[i]));
    ctx.fillRect(c * w, r * h, w, h);
  }
  ctx.globalAlpha = 1;
}

function drawFrames(data, row) {
  const canvas = $("media-canvas"), ctx = canvas.getContext("2d");
  const n = data.units.length, layers = data.layers.length;
  const width = Math.max(600, Math.min(1400, n * 3));
  canvas.width = STRIP.left + width;
  canvas.height = STRIP.wave + layers * STRIP.row + 4;
  ctx.clearRect(0, 0, canvas.width, canvas.height);
  const wave = data.waveform, mid = STRIP.wave / 2;
  const peak = Math.max(1e-6, ...wave.max.map(Math.abs), ...wave.min.map(Math.abs));
  ctx.strokeStyle = "#57606a";
  ctx.beginPath();
  for (let k = 0; k < wave.max.length; k++) {
    const x = STRIP.left + (k + 0.5) * (width / wave.max.length);
    ctx.moveTo(x, mid - (wave.max[k] / peak) * (mid - 2));
    ctx.lineTo(x, mid - (wave.min[k] / peak) * (mid - 2) + 0.5);
  }
  ctx.stroke();
  const stat = data.statistics[$("media-statistic").value];
  const all = data.units.map((_, i) => i);
  const end = Math.max(wave.seconds, data.times[n - 1][1]);
  ctx.font = "11px system-ui, sans-serif";
  for (let l = 0; l < layers; l++) {
    const y = STRIP.wave + l * STRIP.row, t = scaled(stat[l], all);
    for (let i = 0; i < n; i++) {
      const [a, b] = data.times[i];
      const x0 = STRIP.left + (a / end) * width, x1 = STRIP.left + (Math.min(b, a + (data.times[1] ? data.times[1][0] - data.times[0][0] : b - a)) / end) * width;
      ctx.fillStyle = colour(t(stat[l][i]));
      ctx.fillRect(x0, y, Math.max(1, x1 - x0), STRIP.row - 1);
    }
    ctx.fillStyle = l === row ? "#0969da" : "#636c76";
    ctx.fillText(`L${data.layers[l]}`, 4, y + STRIP.row - 3);
  }
  ctx.strokeStyle = "#0969da";
  ctx.lineWidth = 2;
  ctx.strokeRect(STRIP.left - 1, STRIP.wave + row * STRIP.row - 1, width + 2, STRIP.row + 1);
  ctx.lineWidth = 1;
}

function mediaUnitAt(ev) {
  // (unit index, layer row) under the pointer, or null
  const data = state.media, canvas = $("media-canvas");
  if (!data) return null;
  const box = canvas.getBoundingClientRect();
  const x = (ev.clientX - box.left) * (canvas.width / box.width), y = (ev.clientY - box.top) * (canvas.height / box.height);
  if (data.modality === "image") {
    const [rows, cols] = data.grid_shape;
    const r = Math.floor((y / canvas.height) * rows), c = Math.floor((x / canvas.width) * cols);
    const i = data.grid.findIndex((g) => g[0] === r && g[1] === c);
    return i < 0 ? null : { unit: i, row: Number($("media-layer").value) };
  }
  const width = canvas.width - STRIP.left, end = Math.max(data.waveform.seconds, data.times[data.times.length - 1][1]);
  const second = ((x - STRIP.left) / width) * end;
  let unit = -1;
  for (let i = 0; i < data.times.length; i++) if (data.times[i][0] <= second) unit = i;
  const row = y < STRIP.wave ? Number($("media-layer").value) : Math.floor((y - STRIP.wave) / STRIP.row);
  return unit < 0 || row < 0 || row >= data.layers.length ? null : { unit, row, strip: y >= STRIP.wave };
}

function mediaReadout(ev) {
  const at = mediaUnitAt(ev), data = state.media;
  if (!at) { $("media-readout").textContent = ""; return; }
  const name = $("media-statistic").value, value = data.statistics[name][at.row][at.unit];
  const where = data.times ? `${data.times[at.unit][0].toFixed(3)}–${data.times[at.unit][1].toFixed(3)} s` : data.units[at.unit];
  $("media-readout").textContent = `unit ${at.unit} (${where}) · L${data.layers[at.row]} · ${name} ${fmt(value, 3)}`;
}

function mediaCode() {
  const data = state.media;
  const unit = data.modality === "image" ? "patches: stack.units.grid" : "frames: stack.units.times";
  $("media-code").textContent = "import layerwise as lw\nfrom layerwise.explore import token_statistics\n\n" +
    `enc = lw.Encoder(${pyString(state.model)})\n` +
    `stack = enc.extract(${pyString(state.mediaFile)}, long_texts="window")  # ${unit}\n` +
    `token_statistics(stack)[${pyString($("media-statistic").value)}]  # (layers, units)`;
}

async function showModel() {
  showViews();
  if (isMedia()) {
    state.media = null;
    $("media-info").textContent = "Choose a file.";
    $("media-canvas").width = 10; $("media-canvas").height = 10;
    if ($("media-file").files[0]) await runMedia();
    return;
  }
  fillAttentionControls();
  await runText();
  loadSimilarity().then(loadProjection);
}

$("media-file").addEventListener("change", runMedia);
$("media-form").addEventListener("submit", (ev) => { ev.preventDefault(); runMedia(); });
$("media-statistic").addEventListener("change", () => { drawMedia(); if (state.media) mediaCode(); });
$("media-layer").addEventListener("input", () => { $("media-layer").dataset.touched = "1"; drawMedia(); });
$("media-canvas").addEventListener("mousemove", mediaReadout);
$("media-canvas").addEventListener("click", (ev) => {
  const at = mediaUnitAt(ev);
  if (at && at.strip) { $("media-layer").value = String(at.row); $("media-layer").dataset.touched = "1"; drawMedia(); }
});

// ------------------------------------------------------------------------------------------ start
async function start() {
  const params = new URLSearchParams(location.search);
  try {
    state.info = await api("/v1/explore/info");
  } catch (e) {
    showError(e.message + (e.message.startsWith("401") ? " — enter the server's API key above" : ""));
    return;
  }
  $("model").replaceChildren(...state.info.models.map((m) => el("option", { value: m.id }, m.id)));
  const wanted = params.get("model");
  state.model = state.info.models.some((m) => m.id === wanted) ? wanted : state.info.models[0].id;
  $("model").value = state.model;
  $("proj-method").replaceChildren(...state.info.projections.map((p) => el("option", { value: p }, p.toUpperCase())));
  if (params.get("text")) $("text").value = params.get("text");
  if (params.get("pair")) $("text-pair").value = params.get("pair");
  await showModel();
}

$("text-form").addEventListener("submit", (ev) => { ev.preventDefault(); runText(); });
$("text").addEventListener("keydown", (ev) => { if (ev.key === "Enter" && (ev.ctrlKey || ev.metaKey)) { ev.preventDefault(); runText(); } });
$("statistic").addEventListener("change", () => { renderGrid(); if (state.tokens) runGridCode(); });
$("att-layer").addEventListener("change", loadAttention);
$("att-head").addEventListener("change", drawAttention);
$("projection-form").addEventListener("submit", (ev) => { ev.preventDefault(); loadProjection(); });
$("proj-method").addEventListener("change", loadProjection);
$("proj-layer").addEventListener("input", () => { $("proj-layer").dataset.touched = "1"; drawProjection(); });
$("model").addEventListener("change", async () => {
  state.model = $("model").value;
  await showModel();
});
$("api-key").addEventListener("change", () => { sessionStorage.setItem("layerwise-key", $("api-key").value); start(); });

function runGridCode() {
  $("grid-code").textContent = "import layerwise as lw\nfrom layerwise.explore import token_statistics\n\n" + extractCall() +
    `token_statistics(stack)[${pyString($("statistic").value)}]  # (layers, tokens)`;
}

start();
