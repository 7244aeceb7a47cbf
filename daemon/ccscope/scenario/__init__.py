"""Scenario engine: YAML experiments (profiles x algorithms x runs) on the emulated testbed.

spec.py parses and validates a scenario file, runner.py executes it, traffic.py drives iperf3, ping and
short downloads, recorder.py collects the BPF time series, analysis.py computes the metrics,
report.py renders results.json + CSVs into HTML and PNG, cli.py wires it into `ccscope`.
"""
