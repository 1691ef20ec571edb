"""Operator accounts: users and roles, passwords, browser sessions, personal API tokens, login
throttling and the audit log (see docs/console.md)."""
