"""Reports of run folders: figures (PNG/SVG), a Markdown summary, the HTML dashboard, the
index over a results folder, and the comparison of two runs."""
