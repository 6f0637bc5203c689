() => {
  // The page's script (app/page/ui.py runs it on load): (1) a plot updated while its tab was hidden is
  // sized wrongly by plotly, so plots are resized when a tab is shown; (2) clicking a point of the
  // entropy plot selects its step (plotly_click -> the hidden number #entropy-click -> its change event).
  document.addEventListener('click', (ev) => {
    if (!ev.target.closest || !ev.target.closest('[role="tab"]')) return;
    setTimeout(() => {
      if (!window.Plotly) return;
      document.querySelectorAll('.js-plotly-plot').forEach((gd) => {
        if (gd.offsetParent !== null) window.Plotly.Plots.resize(gd);
      });
    }, 200);
  }, true);
  const hook = () => {
    const gd = document.querySelector('#entropy-plot .js-plotly-plot');
    if (!gd || gd.__respecHooked || typeof gd.on !== 'function') return;
    gd.__respecHooked = true;
    gd.on('plotly_click', (ev) => {
      const p = ev && ev.points && ev.points[0];
      if (!p || p.customdata === undefined || p.customdata === null) return;
      const box = document.querySelector('#entropy-click input');
      if (!box) return;
      box.value = String(p.customdata);
      box.dispatchEvent(new Event('input', {bubbles: true}));
      box.dispatchEvent(new Event('change', {bubbles: true}));
    });
  };
  setInterval(hook, 700);
}
