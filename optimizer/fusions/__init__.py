"""One module per fusion rule; optimizer/levels.py lists them in order."""
