// fusegrad VIZ page: the context list, pass graphs (before/after), kernel source and linear program, and the timeline.
// Plain JS, no libraries. Data comes from the /api/ endpoints of fusegrad/viz/server.py.
"use strict";
window.__vizErrors = [];
window.addEventListener("error", (e) => window.__vizErrors.push(String(e.message)));
window.addEventListener("unhandledrejection", (e) => window.__vizErrors.push(String(e.reason)));

const SVGNS = "http://www.w3.org/2000/svg";
const BIG_GRAPH = 500;   // above this many nodes a graph shows only the changed neighbourhood
const PAGE = 300;        // nodes added by each "show more"
let INDEX = null;
const cache = {};

async function api(path) {
  if (!(path in cache)) {
    const r = await fetch("/api/" + path);
    if (!r.ok) throw new Error(`GET /api/${path}: ${r.status}`);
    cache[path] = await r.json();
  }
  return cache[path];
}

function el(tag, attrs = {}, ...kids) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "onclick") e.onclick = v; else if (k === "text") e.textContent = v; else e.setAttribute(k, v);
  }
  for (const k of kids) e.append(k);
  return e;
}

function svgEl(tag, attrs = {}) {
  const e = document.createElementNS(SVGNS, tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  return e;
}

const esc = (s) => s.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;");
const fmtUs = (us) => us >= 1e6 ? (us / 1e6).toFixed(2) + " s" : us >= 1e3 ? (us / 1e3).toFixed(2) + " ms"
  : us.toFixed(1) + " µs";

// ----- sidebar: the context tree, built lazily when a <details> opens --------------------------------------------------
function setActive(node) {
  document.querySelectorAll(".item.active").forEach((n) => n.classList.remove("active"));
  if (node) node.classList.add("active");
}

function passItem(pid) {
  const p = INDEX.passes[pid];
  const it = el("div", {class: "item pass", "data-kind": "pass", "data-id": pid, title: p.name});
  it.append(`${p.name} `, el("span", {class: "n", text: `${p.n_before}→${p.n_after} nodes, ${p.n_rules} rewrites`}));
  it.onclick = () => { setActive(it); showPass(pid); };
  return it;
}

// passes in list order; a name that repeats more than 3 times is folded into one <details> ("symbolic ×14")
function appendPasses(parent, pids) {
  const byName = new Map();
  for (const pid of pids) {
    const n = INDEX.passes[pid].name;
    if (!byName.has(n)) byName.set(n, []);
    byName.get(n).push(pid);
  }
  const folded = new Set();
  for (const pid of pids) {
    const n = INDEX.passes[pid].name, group = byName.get(n);
    if (group.length <= 3) { parent.append(passItem(pid)); continue; }
    if (folded.has(n)) continue;
    folded.add(n);
    const d = el("details", {class: "kind-group"}, el("summary", {class: "item", text: `${n} ×${group.length}`}));
    d.addEventListener("toggle", () => { if (d.open && d.children.length === 1) group.forEach((p) => d.append(passItem(p))); });
    parent.append(d);
  }
}

function contextNode(c) {
  const d = el("details", {class: "kind-" + c.kind, "data-ctx": c.id});
  const sum = el("summary", {class: "item", "data-kind": c.kind, "data-id": c.kernel ?? c.id});
  sum.textContent = c.name + (c.dur != null ? `  (${fmtUs(c.dur)})` : "");
  if (c.kind === "kernel") sum.onclick = () => { setActive(sum); showKernel(c.kernel); };
  d.append(sum);
  let built = false;
  d.addEventListener("toggle", () => {
    if (built || !d.open) return;
    built = true;
    appendPasses(d, c.passes);
    for (const ch of c.children) d.append(contextNode(INDEX.contexts[ch]));
  });
  return d;
}

function buildSidebar() {
  const nav = document.getElementById("sidebar");
  const tl = el("div", {class: "item", id: "open-timeline", text: `timeline (${INDEX.n_events} events)`});
  tl.onclick = () => { setActive(tl); showTimeline(); };
  nav.append(tl);
  const top = INDEX.contexts[0];
  appendPasses(nav, top.passes);
  for (const ch of top.children) nav.append(contextNode(INDEX.contexts[ch]));
}

// ----- graphs: a layered layout (sources above users), pan and zoom, big graphs cut to the changed neighbourhood -----
function neighbourhood(nodes, keepSet, seeds, limit) {
  const users = new Map();
  for (const id of keepSet) for (const s of nodes[id][3]) {
    if (!users.has(s)) users.set(s, []);
    users.get(s).push(id);
  }
  const shown = new Set();
  const queue = [...seeds];
  while (queue.length && shown.size < limit) {
    const n = queue.shift();
    if (shown.has(n) || !keepSet.has(n)) continue;
    shown.add(n);
    for (const s of nodes[n][3]) if (!shown.has(s)) queue.push(s);
    for (const u of users.get(n) || []) if (!shown.has(u)) queue.push(u);
  }
  return shown;
}

function reachable(nodes, root) {
  const seen = new Set(), stack = [root];
  while (stack.length) {
    const n = stack.pop();
    if (seen.has(n)) continue;
    seen.add(n);
    for (const s of nodes[n][3]) stack.push(s);
  }
  return seen;
}

function layout(nodes, shown) {
  const ids = [...shown].sort((a, b) => a - b);  // node tables are sources-first: ascending ids are a topo order
  const layer = new Map();
  for (const id of ids) {
    let l = 0;
    for (const s of nodes[id][3]) if (shown.has(s)) l = Math.max(l, layer.get(s) + 1);
    layer.set(id, l);
  }
  const rows = [];
  for (const id of ids) (rows[layer.get(id)] ||= []).push(id);
  const W = 128, H = 34, GX = 14, GY = 36, pos = new Map();
  rows.forEach((row, li) => {
    const bary = (id) => {
      const xs = nodes[id][3].filter((s) => pos.has(s)).map((s) => pos.get(s).x);
      return xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : 0;
    };
    if (li > 0) row.sort((a, b) => bary(a) - bary(b));
    row.forEach((id, i) => pos.set(id, {x: i * (W + GX), y: li * (H + GY)}));
  });
  const width = Math.max(...rows.map((r) => r.length)) * (W + GX), height = rows.length * (H + GY);
  return {pos, W, H, width, height};
}

// pan (drag) and zoom (wheel) by moving the viewBox; a graph too big to read when fitted starts at full size, centred
// on `focus` (the first changed node)
function zoomable(svg, w, h, focus) {
  let vb = {x: -10, y: -10, w: Math.max(w + 20, 200), h: Math.max(h + 20, 120)};
  const apply = () => svg.setAttribute("viewBox", `${vb.x} ${vb.y} ${vb.w} ${vb.h}`);
  apply();
  requestAnimationFrame(() => {
    const r = svg.getBoundingClientRect();
    if (!r.width || Math.min(r.width / vb.w, r.height / vb.h) >= 0.5 || !focus) return;
    vb = {x: focus.x - r.width / 2, y: focus.y - r.height / 2, w: r.width, h: r.height};
    apply();
  });
  svg.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = svg.getBoundingClientRect(), f = e.deltaY > 0 ? 1.2 : 1 / 1.2;
    const mx = vb.x + (e.clientX - r.left) / r.width * vb.w, my = vb.y + (e.clientY - r.top) / r.height * vb.h;
    vb = {x: mx - (mx - vb.x) * f, y: my - (my - vb.y) * f, w: vb.w * f, h: vb.h * f};
    apply();
  }, {passive: false});
  let drag = null;
  svg.addEventListener("mousedown", (e) => { drag = {x: e.clientX, y: e.clientY, vb: {...vb}}; });
  window.addEventListener("mouseup", () => { drag = null; });
  svg.addEventListener("mousemove", (e) => {
    if (!drag) return;
    const r = svg.getBoundingClientRect();
    vb.x = drag.vb.x - (e.clientX - drag.x) / r.width * vb.w;
    vb.y = drag.vb.y - (e.clientY - drag.y) / r.height * vb.h;
    apply();
  });
}

// draws the graph under `root`; `cls(id)` gives extra classes; returns {box, svg}
function drawGraph(title, nodes, root, cls, seeds, info, madeBy) {
  const all = reachable(nodes, root);
  const box = el("div", {class: "graphbox"});
  const bar = el("div", {class: "bar"});
  box.append(bar);
  let limit = all.size > BIG_GRAPH ? PAGE : all.size;
  const render = () => {
    const shown = limit >= all.size ? all : neighbourhood(nodes, all, seeds.length ? seeds : [root], limit);
    bar.textContent = `${title}: ${all.size} nodes` + (shown.size < all.size ? `, showing ${shown.size} around the changes ` : "");
    if (shown.size < all.size) {
      const more = el("button", {class: "more", text: `show ${Math.min(PAGE, all.size - shown.size)} more`});
      more.onclick = () => { limit += PAGE; render(); };
      bar.append(more);
    }
    box.querySelector("svg")?.remove();
    const {pos, W, H, width, height} = layout(nodes, shown);
    const svg = svgEl("svg");
    const edges = svgEl("g"), gnodes = svgEl("g");
    for (const id of shown) {
      const p = pos.get(id), [op, dtype, arg, srcs] = nodes[id];
      for (const s of srcs) if (shown.has(s)) {
        const q = pos.get(s), x1 = q.x + W / 2, y1 = q.y + H, x2 = p.x + W / 2, y2 = p.y;
        edges.append(svgEl("path", {class: "edge", d: `M${x1},${y1} C${x1},${y1 + 20} ${x2},${y2 - 20} ${x2},${y2}`}));
      }
      const cut = srcs.some((s) => !shown.has(s));
      const g = svgEl("g", {class: `node ${cls(id)}${cut ? " cut" : ""}`, transform: `translate(${p.x},${p.y})`,
        "data-id": id});
      const t = svgEl("title");
      t.textContent = `%${id} ${op} ${dtype} ${arg}` + (madeBy && madeBy[id] ? `\nmade by ${madeBy[id]}` : "");
      g.append(t, svgEl("rect", {width: W, height: H, rx: 4}));
      const t1 = svgEl("text", {x: 5, y: 13, class: "op"}), t2 = svgEl("text", {x: 5, y: 27});
      t1.textContent = `${op} %${id}`;
      const sub = arg ? arg : dtype;
      t2.textContent = sub.length > 20 ? sub.slice(0, 19) + "…" : sub;
      g.append(t1, t2);
      g.addEventListener("click", () => {
        info.textContent = `%${id} ${op} ${dtype} ${arg} srcs [${srcs.map((s) => "%" + s).join(", ")}]` +
          (madeBy && madeBy[id] ? `  made by the rule at ${madeBy[id]}` : "");
      });
      gnodes.append(g);
    }
    svg.append(edges, gnodes);
    box.append(svg);
    const seed = seeds.find((id) => pos.has(id)) ?? root;
    zoomable(svg, width, height, pos.get(seed));
  };
  render();
  return box;
}

// ----- views ---------------------------------------------------------------------------------------------------------
function mainView(...kids) {
  const m = document.getElementById("main");
  m.replaceChildren(...kids);
  m.scrollTop = 0;
  return m;
}

async function showPass(pid) {
  const p = await api("pass/" + pid);
  const ctx = INDEX.contexts[p.ctx];
  const info = el("div", {id: "nodeinfo", text: "click a node for its details"});
  const removed = new Set(p.removed), added = new Set(p.added), made = p.made_by;
  const rules = el("table", {class: "rules"});
  let before, after;
  for (const r of p.rules) {
    const tr = el("tr", {}, el("td", {text: r.loc}), el("td", {text: `${r.count}×`}));
    tr.onclick = () => {
      const on = !tr.classList.contains("sel");
      rules.querySelectorAll("tr.sel").forEach((x) => x.classList.remove("sel"));
      after.querySelectorAll("g.node.sel").forEach((x) => x.classList.remove("sel"));
      if (!on) return;
      tr.classList.add("sel");
      after.querySelectorAll("g.node").forEach((g) => { if (made[g.dataset.id] === r.loc) g.classList.add("sel"); });
    };
    rules.append(tr);
  }
  if (!p.rules.length) rules.append(el("tr", {}, el("td", {text: "no rule fired: the graph is unchanged"})));
  before = drawGraph("before", p.nodes, p.before, (id) => removed.has(id) ? "removed" : "", p.removed, info, made);
  const madeIds = Object.keys(made).map(Number);
  after = drawGraph("after", p.nodes, p.after, (id) => id in made ? "made" : added.has(id) ? "added" : "",
    madeIds.length ? madeIds : p.added, info, made);
  before.id = "graph-before"; after.id = "graph-after";
  mainView(el("h2", {text: `pass "${p.name}"`}),
    el("div", {class: "hint", text: `in ${ctx.name} · ${p.n_before} → ${p.n_after} nodes · red: gone after the ` +
      "pass, dark green: made by a rule, light green: rebuilt above a change · wheel to zoom, drag to pan"}),
    el("h3", {text: "rules that fired (file:line, click to mark the nodes each made)"}), rules, info,
    el("div", {class: "graphs"}, before, after));
}

const C_KW = new Set(("for if else while do return break continue switch case default typedef struct union sizeof " +
  "const restrict static inline extern volatile goto __attribute__ __kernel kernel __global global __local local " +
  "__constant constant").split(" "));
const C_TY = new Set(("void char short int long float double half bool unsigned signed size_t uint uchar ushort " +
  "ulong").split(" "));

function highlight(src) {
  const re = /(\/\/[^\n]*|\/\*[\s\S]*?\*\/)|(^[ \t]*#[^\n]*)|("(?:[^"\\\n]|\\.)*")|\b(\d+\.?\d*(?:e[+-]?\d+)?[fuUlL]*|0x[0-9a-fA-F]+[uUlL]*)\b|([A-Za-z_]\w*)/gm;
  let out = "", last = 0, m;
  while ((m = re.exec(src)) !== null) {
    out += esc(src.slice(last, m.index));
    const t = esc(m[0]);
    if (m[1]) out += `<span class="tok-com">${t}</span>`;
    else if (m[2]) out += `<span class="tok-pp">${t}</span>`;
    else if (m[3]) out += `<span class="tok-str">${t}</span>`;
    else if (m[4]) out += `<span class="tok-num">${t}</span>`;
    else if (C_KW.has(m[5])) out += `<span class="tok-kw">${t}</span>`;
    else if (C_TY.has(m[5].replace(/_x\d+(_u)?$|\d+$/, ""))) out += `<span class="tok-ty">${t}</span>`;
    else out += t;
    last = re.lastIndex;
  }
  return out + esc(src.slice(last));
}

async function showKernel(kid) {
  const k = await api("kernel/" + kid);
  const src = el("pre", {class: "code", id: "source"});
  src.innerHTML = highlight(k.src);
  const lin = el("pre", {class: "code", id: "linear", text: k.linear || "(not recorded)"});
  const info = el("div", {id: "nodeinfo", text: "click a node for its details"});
  const ast = drawGraph("kernel AST", k.ast.nodes, k.ast.root, () => "", [], info, null);
  ast.id = "graph-ast";
  const passes = el("div");
  appendPasses(passes, INDEX.contexts[k.ctx].passes);
  mainView(el("h2", {text: `kernel ${k.name} on ${k.device}`}),
    el("div", {class: "hint", text: `${k.renderer}${k.opts ? " · opts " + k.opts : ""} · ${k.n_linear} linear ops`}),
    el("div", {class: "cols"}, el("div", {}, el("h3", {text: "source"}), src),
      el("div", {}, el("h3", {text: "linear program"}), lin)),
    el("h3", {text: "passes"}), passes, el("h3", {text: "kernel AST"}), info, ast);
}

// ----- timeline: one row per (device, stream); wheel zooms around the mouse, drag pans ---------------------------------
async function showTimeline() {
  const evs = await api("timeline");
  const box = el("div", {id: "timeline"});
  mainView(el("h2", {text: "timeline"}),
    el("div", {class: "hint", text: `${evs.length} events · wheel to zoom, drag to pan, click a kernel to open it`}),
    el("div", {class: "legend"}, ...["kernel", "copy", "codegen", "compile", "schedule"].map((c) =>
      el("span", {}, el("i", {class: "sw ev-" + c}), c))),
    box, el("div", {id: "evinfo", class: "hint"}));
  if (!evs.length) { box.append(el("p", {class: "hint", text: "no events recorded"})); return; }
  const rowsKey = [...new Set(evs.map((e) => e.pid + "\u0000" + e.tid))].sort();
  const row = new Map(rowsKey.map((k, i) => [k, i]));
  const t0 = Math.min(...evs.map((e) => e.ts)), t1 = Math.max(...evs.map((e) => e.ts + e.dur));
  let v0 = t0, v1 = t1 + (t1 - t0) * 0.02 + 1;
  const LABEL = 230, RH = 22, TOP = 22, width = Math.max(box.clientWidth, 600), height = TOP + rowsKey.length * RH + 4;
  const svg = svgEl("svg", {height, viewBox: `0 0 ${width} ${height}`});
  box.append(svg);
  const plot = width - LABEL;
  const draw = () => {
    svg.replaceChildren();
    const scale = plot / (v1 - v0), step = niceStep((v1 - v0) / 8);
    for (let t = Math.ceil((v0 - t0) / step) * step; t0 + t <= v1; t += step) {
      const x = LABEL + (t0 + t - v0) * scale;
      svg.append(svgEl("line", {class: "tick", x1: x, x2: x, y1: 0, y2: height}));
      const lb = svgEl("text", {class: "ticklabel", x: x + 2, y: 12});
      lb.textContent = fmtUs(t);
      svg.append(lb);
    }
    let drawn = 0;
    for (const e of evs) {
      if (e.ts + e.dur < v0 || e.ts > v1 || drawn > 20000) continue;
      const x = LABEL + Math.max(e.ts - v0, 0) * scale;
      const w = Math.max((Math.min(e.ts + e.dur, v1) - Math.max(e.ts, v0)) * scale, 1);
      const r = svgEl("rect", {class: `ev ev-${e.cat}`, x, y: TOP + row.get(e.pid + "\u0000" + e.tid) * RH + 2,
        width: w, height: RH - 4, "data-cat": e.cat});
      const t = svgEl("title");
      t.textContent = `${e.name}  ${fmtUs(e.dur)}`;
      r.append(t);
      r.addEventListener("click", () => {
        document.getElementById("evinfo").textContent = `${e.name} on ${e.pid}/${e.tid}: start ${fmtUs(e.ts - t0)},` +
          ` ${fmtUs(e.dur)} ${JSON.stringify(e.args)}`;
        const kc = e.args && e.args.kernel != null ? INDEX.contexts[e.args.kernel] : null;
        if (kc && kc.kernel != null && e.cat === "kernel") showKernel(kc.kernel);
      });
      svg.append(r);
      drawn++;
    }
    svg.append(svgEl("rect", {x: 0, y: 0, width: LABEL - 4, height, fill: "#fff"}));
    rowsKey.forEach((k, i) => {
      const [pid, tid] = k.split("\u0000");
      const lb = svgEl("text", {class: "rowlabel", x: 4, y: TOP + i * RH + 15});
      lb.textContent = `${pid} · ${tid}`.slice(0, 36);
      svg.append(lb);
    });
  };
  draw();
  let pending = false;
  const redraw = () => { if (!pending) { pending = true; requestAnimationFrame(() => { pending = false; draw(); }); } };
  svg.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = svg.getBoundingClientRect(), px = (e.clientX - r.left) / r.width * width - LABEL;
    const at = v0 + Math.max(px, 0) / plot * (v1 - v0), f = e.deltaY > 0 ? 1.25 : 0.8;
    const span = Math.max((v1 - v0) * f, 0.01);
    v0 = at - (at - v0) / (v1 - v0) * span;
    v1 = v0 + span;
    redraw();
  }, {passive: false});
  let drag = null;
  svg.addEventListener("mousedown", (e) => { drag = {x: e.clientX, v0, v1}; });
  window.addEventListener("mouseup", () => { drag = null; });
  svg.addEventListener("mousemove", (e) => {
    if (!drag) return;
    const r = svg.getBoundingClientRect(), dt = (e.clientX - drag.x) / r.width * width / plot * (drag.v1 - drag.v0);
    v0 = drag.v0 - dt; v1 = drag.v1 - dt;
    redraw();
  });
}

function niceStep(x) {
  const p = Math.pow(10, Math.floor(Math.log10(Math.max(x, 1e-3))));
  return [1, 2, 5, 10].map((m) => m * p).find((s) => s >= x) || 10 * p;
}

async function main() {
  INDEX = await api("index");
  document.getElementById("summary").textContent = `${INDEX.contexts.length - 1} contexts · ` +
    `${INDEX.kernels.length} kernels · ${INDEX.passes.length} passes · ${INDEX.n_events} timeline events · ` +
    (INDEX.argv || []).join(" ");
  buildSidebar();
  document.body.dataset.ready = "1";
}
main().catch((e) => { window.__vizErrors.push(String(e)); document.getElementById("main").textContent = String(e); });
