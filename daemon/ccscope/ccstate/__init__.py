"""Each congestion control's own state per flow (BBR's mode, gains and estimates; CUBIC's W_max, K and epoch),
read with CO-RE from the kernel by bpf/ccstate.bpf.c.

- record.py: the ctypes mirror of bpf/ccstate.h;
- bbr.py, cubic.py: one decoder per algorithm, each with its Prometheus series and its `ss`-like summary;
- decoders.py: the decoders by kind, and the series of all of them;
- probe.py: loads and attaches the object beside the telemetry probe, and reads its map.
"""
