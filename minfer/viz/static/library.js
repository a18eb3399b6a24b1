// plotly.js, loaded once per page for every minfer dashboard. The source arrives as this model's "source"
// string; initialize() starts it as a script and returns at once, so the 5 MB never counts against
// anywidget's time limit for loading a widget's code. Dashboards wait on globalThis.__minferPlotly.
function plotlyPromise() {
  const g = globalThis;
  if (!g.__minferPlotly) {
    let resolve;
    const promise = new Promise((r) => { resolve = r; });
    g.__minferPlotly = { promise, resolve, loading: false };
  }
  return g.__minferPlotly;
}

export default {
  initialize({ model }) {
    const state = plotlyPromise();
    if (state.loading) return;
    state.loading = true;
    const url = URL.createObjectURL(new Blob([model.get("source")], { type: "text/javascript" }));
    const script = document.createElement("script");
    const previous = window.Plotly;  // another copy on the page (an HTML figure) stays as it was
    script.src = url;
    script.onload = () => {
      const Plotly = window.Plotly;
      if (previous !== undefined) window.Plotly = previous;
      URL.revokeObjectURL(url);
      state.resolve(Plotly);
    };
    script.onerror = () => { state.loading = false; console.error("[minfer] plotly.js failed to load"); };
    document.head.appendChild(script);
  },
};
