"""Talking to data nodes: members, dialling, the connection pool, retries, the error boundary,
requests, streams, dataset info and reports.
"""
