"""The emulated network of `ccscope scenario`: namespaces, per-direction link impairments, cleanup.

    with Testbed(PathProfile.from_dict("wired", {"rate": "50mbit", "delay": "10ms"}, "profiles.wired")) as tb:
        tb.set_algorithm("cubic")
        print(tb.verify().message)
        tb.run(tb.sender_ns, ["iperf3", "-c", tb.receiver_addr, "-t", "5"], timeout=20)
"""

from .backends import Capabilities, probe_backends
from .profile import Isolation, LinkProfile, PathProfile, QueueSize
from .testbed import Testbed, VerifyResult

__all__ = [
    "Capabilities",
    "Isolation",
    "LinkProfile",
    "PathProfile",
    "QueueSize",
    "Testbed",
    "VerifyResult",
    "probe_backends",
]
