"""gpulab hub configuration: the embedded single-server hub, hub-side APIs and pages."""
