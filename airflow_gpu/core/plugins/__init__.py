"""Placement plugins: filters (filters.py) and score policies (scores.py, fgd.py)."""
