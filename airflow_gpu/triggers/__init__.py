"""Triggers (Airflow provider convention): GangTrigger waits for a gang in the triggerer."""
