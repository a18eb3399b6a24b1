// The notebook side of a dashboard (an anywidget ESM; views.js is prepended to this file). The model holds
// one "frame" -- the full picture of the current step -- so every view, a second one or one restored after
// a page reload, draws the same thing. The browser sends arrow keys and PNG images to the kernel.
function plotly() {
  const g = globalThis;
  if (!g.__minferPlotly) {
    let resolve;
    const promise = new Promise((r) => { resolve = r; });
    g.__minferPlotly = { promise, resolve, loading: false };
  }
  return g.__minferPlotly.promise;
}

const views = new Set();  // the views of this model on the page (a PNG is taken from one on screen)

function download(url, filename) {
  const a = document.createElement("a");
  a.href = url;
  a.download = filename;
  document.body.appendChild(a);
  a.click();
  a.remove();
}

// The dashboard's ipywidgets controls live outside this widget's element, in the ipywidgets box around it
// (class minfer-dashboard): the frame's font scale goes there too, as --minfer-scale, so that the buttons,
// knobs and slider labels grow with the charts (dashboard.css turns it into the ipywidgets' own sizes).
function dress(el, frame) {
  const box = el.closest(".minfer-dashboard");
  if (box) box.style.setProperty("--minfer-scale", String(frame.scale || 1));
}

export default {
  initialize({ model }) {
    model.on("msg:custom", async (msg) => {
      if (msg.command !== "png") return;
      const shown = [...views].filter((p) => p.root.isConnected && p.root.offsetParent !== null);
      const parts = shown[0] || [...views][0];
      if (!parts) {
        model.send({ event: "png", error: "no view of this dashboard is on the page" });
        return;
      }
      try {
        const url = await MinferViews.png(await plotly(), parts);
        if (msg.download) download(url, msg.filename);
        model.send({ event: "png", filename: msg.filename, data: url.slice(url.indexOf(",") + 1) });
      } catch (e) {
        model.send({ event: "png", error: String(e) });
      }
    });
  },

  async render({ model, el }) {
    const parts = MinferViews.build(el);
    views.add(parts);
    let Plotly = null;
    let queued = false;
    const paint = async () => {
      const frame = model.get("frame");
      const began = performance.now();
      await MinferViews.draw(Plotly, parts, frame);
      dress(el, frame);
      queued = false;
      // tell the kernel this frame is on screen: a paced run waits for it, so the engine is never more
      // than a step ahead of what the audience sees (and Pause lands within one step)
      model.send({ event: "drawn", serial: frame.serial, ms: performance.now() - began });
      if (model.get("frame").serial !== frame.serial) schedule();  // a newer one arrived meanwhile
    };
    const schedule = () => {  // the newest frame, once per animation frame, however many arrived
      if (queued || !Plotly) return;
      queued = true;
      if (document.hidden) setTimeout(paint, 0);  // no animation frames in a background tab
      else requestAnimationFrame(paint);
    };
    model.on("change:frame", schedule);
    parts.root.addEventListener("keydown", (e) => {
      if (e.key !== "ArrowLeft" && e.key !== "ArrowRight") return;
      e.preventDefault();
      e.stopPropagation();
      model.send({ event: "key", key: e.key });
    });
    parts.root.addEventListener("mousedown", () => parts.root.focus({ preventScroll: true }));
    const observer = new ResizeObserver(() => Plotly && MinferViews.resize(Plotly, parts));
    observer.observe(parts.root);
    const late = setTimeout(() => {
      parts.status.innerHTML = "<span class='minfer-loading'>plotly.js has not loaded yet: if this stays, " +
        "re-run the cell (the kernel sends it with the first dashboard)</span>";
    }, 20000);
    Plotly = await plotly();
    clearTimeout(late);
    schedule();
    return () => {
      views.delete(parts);
      model.off("change:frame", schedule);
      observer.disconnect();
      MinferViews.purge(Plotly, parts);
    };
  },
};
