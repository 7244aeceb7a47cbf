"""Host-wide state that outlives one command: the congestion controls the kernel has and allows, and the
run-state lock with what each live run changed (sysctls, namespaces, registrations) for cleanup.

Both `ccscope cc` (host-wide BPF registrations) and the emulated testbed of `ccscope scenario` use it; it
imports neither, nor anything that loads pyroute2 or matplotlib, so the daemon's commands stay light.
"""
