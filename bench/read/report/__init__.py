"""`specbench report`: an HTML report (index.html + PNGs) from a sweep or run results directory.

Layout: `inputs` reads results, `pareto` / `recommend` / `views` compute (pure, tested exactly),
`plots` draws, `page` writes the HTML, `build` puts them together, `cli` is the command.
Reports only read results; they never measure.
"""
from bench.read.report.build import build_report

__all__ = ["build_report"]
