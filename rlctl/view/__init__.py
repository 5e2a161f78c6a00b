"""`rlctl view`: curves, samples and conversations of runs, in the terminal (Textual) or as one HTML page.

data.py / samples.py read and normalise what runs wrote (no UI); app.py / screens.py / chart.py are
the terminal UI; html.py writes the self-contained page (report.html holds its CSS and JS).
"""
