"""The telemetry core: what ccscope measures of each flow, described once (quantities.py), for every output."""
