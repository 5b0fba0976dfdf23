"""What the gateway says about itself: the log pipeline with its redactor (logs.py), Prometheus metrics
(metrics.py) and OpenTelemetry tracing (tracing.py)."""
