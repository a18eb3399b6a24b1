// Draws one dashboard frame -- status, narration, legend and five plotly figures -- into a page element.
// Shared by the notebook widget (widget.js) and the standalone HTML export (player.js). The frame is plain
// JSON made in Python (minfer/viz/frame.py): this file only places and draws it, it computes nothing.
const MinferViews = (() => {
  const VIEWS = [
    ["batch", "minfer-batch-chart", false],
    ["timeline", "minfer-timeline", false],
    ["grid", "minfer-block-grid", false],
    ["queues", "minfer-queues", true],
    ["latency", "minfer-latency", true],
  ];
  const CONFIG = { displayModeBar: false, displaylogo: false, responsive: false };

  function div(cls, parent) {
    const d = document.createElement("div");
    d.className = cls;
    parent.appendChild(d);
    return d;
  }

  function build(el) {
    const root = div("minfer-canvas", el);
    root.tabIndex = 0;
    root.title = "click here, then use the left and right arrow keys to step";
    const parts = { root, status: div("minfer-status", root), narration: div("minfer-narration", root),
                    legend: div("minfer-legend", root), plots: {}, json: {}, drawn: null, width: 0 };
    const views = div("minfer-views", root);
    let pair = null;
    for (const [name, cls, paired] of VIEWS) {
      if (paired && !pair) pair = div("minfer-pair", views);
      parts.plots[name] = div(`minfer-view ${cls}`, paired ? pair : views);
    }
    parts.status.innerHTML = "<span class='minfer-loading'>loading plotly.js …</span>";
    return parts;
  }

  // The block grid keeps square cells at any width: its height follows the width it gets.
  function sized(el, layout) {
    const aspect = layout.meta && layout.meta.aspect;
    if (!aspect) return layout;
    const m = layout.margin || {};
    const width = el.clientWidth || 900;
    const plot = Math.max(width - (m.l || 0) - (m.r || 0), 100);
    const height = Math.round(plot * aspect + (m.t || 0) + (m.b || 0));
    return { ...layout, height: Math.min(height, layout.meta.max_height || height) };  // capped: a narrower grid
  }

  // The frame's layout ("notebook" or "lecture") is a class on the canvas, and so are big fonts (1.5x and
  // up: the views need more width); dashboard.css places the views accordingly.
  function arrange(parts, frame) {
    for (const name of ["notebook", "lecture"]) {
      parts.root.classList.toggle(`minfer-layout-${name}`, (frame.layout || "notebook") === name);
    }
    parts.root.classList.toggle("minfer-large", (frame.scale || 1) >= 1.5);
  }

  async function draw(Plotly, parts, frame) {
    if (!frame || !frame.views) return;
    parts.drawn = frame;
    parts.width = parts.root.clientWidth;
    parts.root.style.setProperty("--minfer-scale", String(frame.scale || 1));
    arrange(parts, frame);
    parts.status.innerHTML = frame.status || "";
    parts.narration.innerHTML = frame.narration || "";
    parts.legend.innerHTML = frame.legend || "";
    const began = performance.now();
    const times = {};
    for (const [name, el] of Object.entries(parts.plots)) {
      const spec = frame.views[name];
      if (!spec) continue;
      const json = JSON.stringify(spec);
      if (json === parts.json[name] && el.data) continue;  // unchanged (a scrub that moved nothing, say)
      const t0 = performance.now();
      await Plotly.react(el, spec.data, sized(el, spec.layout), CONFIG);
      parts.json[name] = json;
      times[name] = performance.now() - t0;
      await new Promise((r) => setTimeout(r, 0));  // a click (Pause) is handled between two figures
    }
    const log = (globalThis.__minferDrawTimes ??= []);  // for the browser test's response times
    log.push({ total: performance.now() - began, ...times });
    if (log.length > 200) log.shift();
  }

  function resize(Plotly, parts) {
    const width = parts.root.clientWidth;
    if (!parts.drawn || !width || width === parts.width) return;
    parts.width = width;
    for (const [name, el] of Object.entries(parts.plots)) {
      const spec = parts.drawn.views[name];
      if (!spec || !el.data) continue;
      if (spec.layout.meta && spec.layout.meta.aspect) Plotly.relayout(el, { height: sized(el, spec.layout).height });
      Plotly.Plots.resize(el);
    }
  }

  function purge(Plotly, parts) {
    for (const el of Object.values(parts.plots)) if (Plotly && el.data) Plotly.purge(el);
  }

  // ---- PNG of what is on screen: each figure through Plotly.toImage, the text as the page draws it ----
  function loadImage(url) {
    return new Promise((resolve, reject) => {
      const img = new Image();
      img.onload = () => resolve(img);
      img.onerror = reject;
      img.src = url;
    });
  }

  // The text parts (status, narration, legend) are drawn by the browser itself, exactly as on screen --
  // name chips, the legend's hatched swatches, line breaks -- as an SVG image holding a copy of the HTML
  // (foreignObject). The copy carries every element's computed style inline: the SVG image sees no CSS.
  function inlineStyles(from, to) {
    const style = getComputedStyle(from);
    let css = "";
    for (const name of style) css += `${name}:${style.getPropertyValue(name)};`;
    to.setAttribute("style", css);
    for (let i = 0; i < from.children.length; i++) inlineStyles(from.children[i], to.children[i]);
  }

  async function htmlImage(el, scale) {
    const r = el.getBoundingClientRect();
    const copy = el.cloneNode(true);
    inlineStyles(el, copy);
    copy.style.margin = "0";
    const xml = new XMLSerializer().serializeToString(copy);
    const w = Math.ceil(r.width), h = Math.ceil(r.height);
    const svg = `<svg xmlns="http://www.w3.org/2000/svg" width="${w * scale}" height="${h * scale}" ` +
      `viewBox="0 0 ${w} ${h}"><foreignObject x="0" y="0" width="${w}" height="${h}">${xml}</foreignObject></svg>`;
    return loadImage(`data:image/svg+xml;charset=utf-8,${encodeURIComponent(svg)}`);
  }

  async function png(Plotly, parts, scale = 2) {
    const origin = parts.root.getBoundingClientRect();
    const canvas = document.createElement("canvas");
    canvas.width = Math.ceil(origin.width * scale);
    canvas.height = Math.ceil(origin.height * scale);
    const ctx = canvas.getContext("2d");
    ctx.scale(scale, scale);
    ctx.fillStyle = "white";
    ctx.fillRect(0, 0, origin.width, origin.height);
    for (const el of [parts.status, parts.narration, parts.legend]) {
      const r = el.getBoundingClientRect();
      if (!r.width || !r.height) continue;
      const img = await htmlImage(el, scale);
      ctx.drawImage(img, r.left - origin.left, r.top - origin.top, Math.ceil(r.width), Math.ceil(r.height));
    }
    for (const el of Object.values(parts.plots)) {
      const r = el.getBoundingClientRect();
      if (!r.width || !el.data) continue;
      const url = await Plotly.toImage(el, { format: "png", width: r.width, height: r.height, scale });
      ctx.drawImage(await loadImage(url), r.left - origin.left, r.top - origin.top, r.width, r.height);
    }
    return canvas.toDataURL("image/png");
  }

  return { build, draw, resize, purge, png };
})();
