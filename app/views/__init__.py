"""Views: traces and histories -> what the page shows (spans, tables, plotly figures, copy). No Gradio."""
