"""Model registry (signed packages) and rollouts (canary, promote, pause, abort, auto-halt)."""
