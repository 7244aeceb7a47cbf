# ccscope image: `ccscope daemon` by default; also carries what `ccscope scenario` needs.
#   docker build -t ccscope:local .
# The build stage runs the same steps as tools/bootstrap (and so CI): the bootstrap build packages,
# `make all` (the BPF object via `make bpf`, the delay-line helper, and the live page's chart library via
# `make assets`: the pinned uPlot tarball from the npm registry, checked against its sha512, so the build needs
# network access but no node), then `pip install` of the package, which ships all three.
# The BPF build uses bpf/core_min.h, our minimal CO-RE header: no vmlinux.h or BTF is needed to build,
# only at run time (mount /sys/kernel/btf read-only).
ARG DEBIAN_RELEASE=bookworm

FROM debian:${DEBIAN_RELEASE}-slim AS build
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      clang llvm libbpf-dev make gcc libc6-dev libnetfilter-queue-dev python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Makefile pyproject.toml README.md ./
COPY bpf/ bpf/
COPY daemon/ daemon/
COPY scenarios/ scenarios/
RUN make all
RUN python3 -m venv /opt/ccscope \
 && /opt/ccscope/bin/pip install -q --no-cache-dir --upgrade pip \
 && /opt/ccscope/bin/pip install -q --no-cache-dir . \
 && /opt/ccscope/bin/python -c "import ccscope.loader as l; assert l.object_path().is_file(), l.object_path()" \
 && /opt/ccscope/bin/python -c "import ccscope.live.app as a; a.static_files()"

FROM debian:${DEBIAN_RELEASE}-slim
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 libbpf1 iperf3 iproute2 iptables ethtool iputils-ping libnetfilter-queue1 procps \
 && rm -rf /var/lib/apt/lists/*
COPY --from=build /opt/ccscope /opt/ccscope
ENV PATH=/opt/ccscope/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Runs as root inside the container, but with every capability dropped except BPF and PERFMON (see
# deploy/compose/compose.yaml and deploy/kubernetes/): container runtimes give capabilities to a
# non-root user only through ambient sets, which Docker and Kubernetes do not set.
WORKDIR /var/lib/ccscope
EXPOSE 9977
STOPSIGNAL SIGTERM
ENTRYPOINT ["ccscope"]
CMD ["daemon", "--listen", "127.0.0.1:9977", "--flows", "top:50", "--grace", "10s"]
