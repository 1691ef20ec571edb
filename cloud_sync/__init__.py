"""The contract between gateway and fleet: wire schemas, model package format, agent-side client.

Imports nothing from ``agent`` or ``fleet``.
"""
