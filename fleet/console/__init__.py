"""The operator's web console: static files served by the fleet itself (no CDN, no internet)."""
