"""Edge anomaly agent: sensor/camera ingest, INT8 anomaly detection, MQTT alerts, fleet sync."""

__version__ = "0.1.0"
