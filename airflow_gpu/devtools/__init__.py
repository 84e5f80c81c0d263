"""Starting local stand-ins (S3 server, Airflow components, the local cluster) for the demo and tests."""
