"""HTTP API: routers (devices, ingest, queries, health), auth, body reading, error handlers."""
