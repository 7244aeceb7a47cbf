"""ccscope's own TCP congestion controls as BPF programs (struct_ops): Vegas, Westwood+, Copa and a
control Reno, registered where the kernel lacks them, or next to the kernel's with `bpf:NAME`."""

from .catalog import BPF_ALGORITHMS, display_name, normalize
from .provide import Implementation, providable, provided, resolve

__all__ = ["BPF_ALGORITHMS", "Implementation", "display_name", "normalize", "providable", "provided", "resolve"]
