"""Self-contained HTML pages with plotly figures that paint their text first.

A page with plotly.js (4.6 MB) inline in its head shows nothing until that
script is parsed and run: in MLflow's artifact preview (a sandboxed iframe fed
the file as a blob) the pane stayed blank for seconds, then longer than a user
waits on a loaded machine. Here the text comes first; each figure is its div and
its JSON (`<script type="application/json">`, data the page parses, never code);
plotly.js and a small loader come last, and the loader draws the figures one per
task, top to bottom, so the page stays responsive while they appear. Nothing is
fetched from the network.
"""

import json

import plotly.io as pio
from plotly.offline import get_plotlyjs

PLOTLY_CONFIG = {"displaylogo": False, "responsive": True, "scrollZoom": False}
DEFAULT_HEIGHT_PX = 450  # plotly's own default

_LOADER = """
(function () {
  var specs = Array.prototype.slice.call(document.querySelectorAll('script.diagnose-figure'));
  var config = %s;
  function next() {
    var spec = specs.shift();
    if (!spec) { document.body.setAttribute('data-figures-drawn', 'all'); return; }
    try {
      var figure = JSON.parse(spec.textContent);
      Plotly.newPlot(spec.getAttribute('data-target'), figure.data, figure.layout, config);
    } catch (err) {
      var target = document.getElementById(spec.getAttribute('data-target'));
      if (target) { target.textContent = 'This figure could not be drawn: ' + err; }
    }
    setTimeout(next, 0);
  }
  next();
})();
"""


def figure_html(fig, div_id: str) -> str:
    """The figure's div and its JSON, drawn by the page's loader."""
    height = fig.layout.height or DEFAULT_HEIGHT_PX
    # `<` only occurs inside JSON strings, where \\u003c is the same character:
    # no `</script>` (or `<!--`) in a trace's text can end the element early
    spec = pio.to_json(fig, validate=False).replace("<", "\\u003c")
    return (
        f'<div style="height:{int(height)}px; width:100%;"><div id="{div_id}" class="plotly-graph-div" '
        f'style="height:100%; width:100%;"></div></div>'
        f'<script type="application/json" class="diagnose-figure" data-target="{div_id}">{spec}</script>'
    )


def page_html(title: str, css: str, body: str) -> str:
    """A whole page: head (title, style), the body's text and figure divs, then
    plotly.js and the loader."""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{title}</title><style>{css}</style></head><body>{body}"
        f'<script type="text/javascript">{get_plotlyjs()}</script>'
        f'<script type="text/javascript">{_LOADER % json.dumps(PLOTLY_CONFIG)}</script>'
        "</body></html>\n"
    )
