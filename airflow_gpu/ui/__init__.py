"""The GPU queue in the Airflow UI: plugin app (app.py), page (static/), queue view (queue.py),
chargeback ledger (ledger.py + core.chargeback), reads (sources.py), Stats metrics (metrics.py)."""
