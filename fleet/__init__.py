"""The cloud fleet service: device enrollment, idempotent ingest, queries (``edge-fleet``).

Imports nothing from ``agent``; the wire contract lives in :mod:`cloud_sync.protocol`.
"""
