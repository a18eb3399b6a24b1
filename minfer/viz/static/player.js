// The standalone player of an exported dashboard (minfer/viz/export.py): the recording's frames, one per
// step, drawn by views.js, with a step slider, Play/Pause, a speed choice, the arrow keys and a PNG of the
// step on screen. No kernel, no network: plotly.js and every frame are inside the HTML file.
// The frames are stored gzipped (JSON of consecutive steps repeats itself: ~10x smaller) and unpacked by
// the browser's own DecompressionStream.
async function minferFrames() {
  const b64 = document.getElementById("minfer-frames").textContent.trim();
  const bytes = Uint8Array.from(atob(b64), (c) => c.charCodeAt(0));
  const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("gzip"));
  return JSON.parse(await new Response(stream).text());
}

minferFrames().then((frames) => {
  const stage = document.getElementById("minfer-stage");
  const slider = document.getElementById("minfer-slider");
  const label = document.getElementById("minfer-step");
  const play = document.getElementById("minfer-play");
  const speed = document.getElementById("minfer-speed");
  const parts = MinferViews.build(stage);
  let index = Math.max(0, Math.min(frames.length - 1, Number(stage.dataset.start || frames.length - 1)));
  let timer = null;
  slider.max = String(frames.length - 1);

  function show(i) {
    index = Math.max(0, Math.min(frames.length - 1, i));
    slider.value = String(index);
    label.textContent = `step ${frames[index].step_number} · ${index + 1} of ${frames.length}`;
    document.body.dataset.index = String(index);
    MinferViews.draw(Plotly, parts, frames[index]);
  }

  function stop() {
    if (timer !== null) clearInterval(timer);
    timer = null;
    play.textContent = "▶ Play";
  }

  function start() {
    if (index >= frames.length - 1) show(0);
    play.textContent = "⏸ Pause";
    timer = setInterval(() => (index >= frames.length - 1 ? stop() : show(index + 1)), 1000 / Number(speed.value));
  }

  play.addEventListener("click", () => (timer === null ? start() : stop()));
  speed.addEventListener("change", () => { if (timer !== null) { stop(); start(); } });
  slider.addEventListener("input", () => { stop(); show(Number(slider.value)); });
  document.getElementById("minfer-back").addEventListener("click", () => { stop(); show(index - 1); });
  document.getElementById("minfer-forward").addEventListener("click", () => { stop(); show(index + 1); });
  document.addEventListener("keydown", (e) => {
    if (e.target === slider) return;  // the slider moves itself on arrow keys
    if (e.key === "ArrowLeft" || e.key === "ArrowRight") {
      e.preventDefault();
      stop();
      show(index + (e.key === "ArrowLeft" ? -1 : 1));
    } else if (e.key === " ") {
      e.preventDefault();
      timer === null ? start() : stop();
    }
  });
  document.getElementById("minfer-png").addEventListener("click", async () => {  // the step on screen, for a slide
    stop();
    const a = document.createElement("a");
    a.href = await MinferViews.png(Plotly, parts);
    a.download = `minfer-step-${frames[index].step_number}.png`;
    document.body.appendChild(a);
    a.click();
    a.remove();
  });
  new ResizeObserver(() => MinferViews.resize(Plotly, parts)).observe(parts.root);
  show(index);
}).catch((e) => {
  document.getElementById("minfer-stage").textContent = `this browser could not unpack the recording: ${e}`;
});
