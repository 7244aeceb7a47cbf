"""What the tests, the benches and the kernel lab's guest checks share: the prerequisite policy (prereqs), network
namespaces, a daemon wrapper and TCP_INFO (net), cgroup trees (cgroups), and the hostile clients (hostile).

A package of its own, installed beside ccscope by `tools/bootstrap --dev` (never shipped in ccscope's wheel), so
that tests/, bench/ and tests/vm/ import it by name instead of putting tests/ on sys.path.
"""
