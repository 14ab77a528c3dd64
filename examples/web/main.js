// The demo page: checks for WebGPU, loads the wasm module (pkg/, made by build.sh), runs the
// indexer through it and draws the result. When done it sets #result's data-status
// ("pass", "fail" or "no-webgpu") and the title, and POSTs the JSON result to /result on the
// serving origin (serve.py stores it; a plain static server refuses it, which is harmless).
//
// The result names its stages (`stages`, `timings_ms`) and lists its checks, so the tables
// below show a stage added later (e.g. sparse attention) without changes here.

const $ = (id) => document.getElementById(id);
const logs = [];
for (const level of ["error", "warn"]) {
  const orig = console[level].bind(console);
  console[level] = (...args) => {
    logs.push(`${level}: ${args.join(" ")}`);
    orig(...args);
  };
}
addEventListener("error", (e) => logs.push(`error: ${e.message}`));
addEventListener("unhandledrejection", (e) => logs.push(`unhandled rejection: ${e.reason}`));

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  Object.assign(e, attrs);
  e.append(...children);
  return e;
}

function finish(status, message, result = {}) {
  const r = $("result");
  r.dataset.status = status;
  r.className = status;
  r.textContent = message;
  document.title = `qsa web demo: ${status}`;
  if (logs.length) {
    $("console").append(el("h2", { textContent: "Console" }), el("pre", { textContent: logs.join("\n") }));
  }
  const body = { ...result, status, message, console: logs, user_agent: navigator.userAgent };
  fetch("/result", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body),
  }).catch(() => {});
}

function options() {
  const q = new URLSearchParams(location.search);
  const o = {};
  if (q.has("prefill")) o.prefill = q.get("prefill").split(",").map(Number);
  for (const name of ["decode", "k", "seed"]) if (q.has(name)) o[name] = Number(q.get(name));
  if (q.has("dtype")) o.dtype = q.get("dtype");
  if (q.has("attention")) o.attention = !["0", "false", "off"].includes(q.get("attention"));
  return o;
}

function showAdapter(info, result) {
  const s = $("adapter");
  s.append(el("h2", { textContent: "Adapter" }));
  const desc = [info.vendor, info.architecture, info.device, info.description].filter(Boolean).join(" / ");
  s.append(el("p", { textContent: `navigator.gpu adapter: ${desc || "(no details)"}` }));
  if (result) {
    const c = result.config;
    s.append(el("p", {
      textContent: `wgpu: ${result.adapter}. Layer: Hi=${c.hi} Di=${c.di} Dr=${c.dr} r=${c.r} ` +
        `k=${c.k} page=${c.page_size} ${c.dtype}; ${c.sequences} sequences, prefill ` +
        `[${c.prefill}], ${c.decode} decode steps` +
        (c.attention ? `; attention H=${c.attention.h} Hkv=${c.attention.hkv} E=${c.attention.e} in the decode steps` : "") +
        `. Context ${result.context_ms.toFixed(1)} ms; ` +
        `${result.pipelines_built} pipelines built in the first step.`,
    }));
  }
}

function showChecks(result) {
  const s = $("checks");
  s.append(el("h2", { textContent: "GPU against the CPU reference" }));
  const ul = el("ul");
  for (const c of result.checks) {
    ul.append(el("li", { className: c.pass ? "ok" : "bad", textContent: `${c.name}: ${c.detail}` }));
  }
  s.append(ul);
  if (result.failures.length) s.append(el("pre", { textContent: result.failures.join("\n") }));
}

function showTimings(result) {
  const s = $("timings");
  s.append(el("h2", { textContent: "Timings (ms, performance.now)" }));
  const stages = result.stages;
  const head = el("tr", {}, el("th", { textContent: "step" }), el("th", { textContent: "rows" }),
    ...stages.map((n) => el("th", { textContent: n })), el("th", { textContent: "total" }));
  const table = el("table", {}, head);
  const row = (label, rows, ms) => {
    const total = stages.reduce((a, n) => a + (ms[n] ?? 0), 0);
    table.append(el("tr", {}, el("td", { textContent: label }), el("td", { textContent: rows }),
      ...stages.map((n) => el("td", { textContent: (ms[n] ?? 0).toFixed(1) })),
      el("td", { textContent: total.toFixed(1) })));
  };
  result.steps.forEach((st, i) => row(`${i} ${st.phase} [${st.new_tokens}]`, st.rows, st.timings_ms));
  row("all steps", result.steps.reduce((a, st) => a + st.rows, 0), result.totals_ms);
  s.append(table);
  s.append(el("p", {
    className: "muted",
    textContent: "append: keys to the paged pool + queries (host); indexer: record and submit " +
      "one step (the first builds the pipelines); readback: wait for the GPU and map the " +
      "outputs; cpu_reference: the same step on the CPU in wasm; check: the comparison.",
  }));
}

// A viridis-like ramp over [0, 1].
const RAMP = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
function ramp(t) {
  const x = Math.min(Math.max(t, 0), 1) * (RAMP.length - 1);
  const i = Math.min(Math.floor(x), RAMP.length - 2);
  const f = x - i;
  return RAMP[i].map((a, c) => Math.round(a + f * (RAMP[i + 1][c] - a)));
}

function drawHeat(h) {
  const rows = h.positions.length;
  const cols = h.blocks;
  const cw = Math.max(3, Math.min(12, Math.floor(880 / Math.max(cols, 1))));
  const ch = Math.max(1, Math.min(8, Math.floor(480 / Math.max(rows, 1))));
  const canvas = el("canvas", { width: cols * cw, height: rows * ch });
  const g = canvas.getContext("2d");
  const img = g.createImageData(canvas.width, canvas.height);
  for (let r = 0; r < rows; r++) {
    const vals = h.scores[r];
    const max = Math.max(1e-30, ...vals.filter((v) => v !== null));
    for (let b = 0; b < cols; b++) {
      const v = vals[b];
      const rgb = v === null ? [40, 40, 40] : ramp(v / max);
      for (let y = r * ch; y < (r + 1) * ch; y++) {
        for (let x = b * cw; x < (b + 1) * cw; x++) {
          const o = 4 * (y * canvas.width + x);
          img.data.set([...rgb, 255], o);
        }
      }
    }
  }
  g.putImageData(img, 0, 0);
  const mw = Math.max(1, Math.floor(cw / 3));
  for (let r = 0; r < rows; r++) {
    g.fillStyle = h.differs[r] ? "#00e5ff" : "#ff2d55";
    for (const b of h.selected[r]) g.fillRect(b * cw + Math.floor((cw - mw) / 2), r * ch, mw, ch);
  }
  // Where the decode rows start.
  if (h.prefill_rows > 0 && h.prefill_rows < rows) {
    g.fillStyle = "#fff";
    g.fillRect(0, h.prefill_rows * ch, canvas.width, 1);
  }
  canvas.style.height = `${Math.max(rows * ch, Math.min(rows * 2, 600))}px`;
  canvas.style.width = `${cols * cw}px`;
  const p0 = h.positions[0] ?? 0;
  const p1 = h.positions[rows - 1] ?? 0;
  return el("div", { className: "heat" },
    el("div", { textContent: `sequence ${h.sequence}: query positions ${p0}…${p1} ↓, blocks 0…${cols - 1} →` }),
    canvas);
}

function showHeat(result) {
  const s = $("heatmaps");
  s.append(el("h2", { textContent: "Block scores and the selected blocks" }));
  const legend = el("p", { className: "legend muted" },
    "colour: the GPU's block score / the row's best",
    el("span", { style: "background:#ff2d55" }), "selected",
    el("span", { style: "background:#00e5ff" }), "selected, in a row that differs from the CPU (near-tie)",
    el("span", { style: "background:#282828" }), "not visible (causal)");
  s.append(legend);
  for (const h of result.heatmaps) s.append(drawHeat(h));
}

async function main() {
  if (!("gpu" in navigator)) {
    return finish("no-webgpu", "This browser has no WebGPU (navigator.gpu is missing): " +
      "use a browser with WebGPU enabled (Chrome or Edge 113+, recent Firefox or Safari), " +
      "over https or from localhost.");
  }
  let adapter = null;
  try {
    adapter = await navigator.gpu.requestAdapter();
  } catch (e) {
    logs.push(`requestAdapter: ${e}`);
  }
  if (!adapter) {
    return finish("no-webgpu", "This browser has WebGPU, but it offers no adapter " +
      "(navigator.gpu.requestAdapter() returned null): the GPU or its driver is blocked or absent.");
  }
  const info = adapter.info ?? {};
  let wasm;
  try {
    wasm = await import("./pkg/qsa_web.js");
    await wasm.default();
  } catch (e) {
    showAdapter(info);
    return finish("fail", `Could not load the wasm module (run examples/web/build.sh): ${e}`);
  }
  let result;
  try {
    result = JSON.parse(await wasm.run_demo(JSON.stringify(options())));
  } catch (e) {
    showAdapter(info);
    return finish("fail", `The run failed: ${e}`);
  }
  showAdapter(info, result);
  showChecks(result);
  showTimings(result);
  showHeat(result);
  const a = result.agreement;
  const what = `${a.rows} query rows, ${a.exact} equal to the CPU reference, ${a.near_tie} ` +
    `near-tie swaps, ${a.failed} wrong`;
  finish(result.status, result.status === "pass"
    ? `PASS: the GPU matches the CPU reference (${what}).`
    : `FAIL: the GPU differs from the CPU reference (${what}).`, result);
}

main();
