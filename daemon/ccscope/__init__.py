"""ccscope: live TCP congestion telemetry from eBPF, with a scenario runner."""

__version__ = "0.1.0"
