"""Plots of benchmark result files (docs/bench-results.md): a Streamlit dashboard (``lumenrt
dashboard``) and the same figures as one static HTML file (``lumenrt bench report``).

``results`` reads the files, ``figures`` builds the plotly figures both front ends share.
"""
