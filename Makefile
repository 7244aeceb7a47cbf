# Build the BPF object and place it inside the Python package, which ships it.
CLANG ?= clang
ARCH := $(shell uname -m | sed -e 's/x86_64/x86/' -e 's/aarch64/arm64/')
MULTIARCH := $(shell $(CLANG) -print-multiarch 2>/dev/null || echo $(shell uname -m)-linux-gnu)
BPF_OBJ := daemon/ccscope/bpf/ccscope.bpf.o
STATE_OBJ := daemon/ccscope/bpf/ccstate.bpf.o
BPF_CFLAGS := -g -O2 -target bpf -D__TARGET_ARCH_$(ARCH) -Wall -Werror \
	-I/usr/include/$(MULTIARCH) -Ibpf

# The live page's chart library (uPlot from the npm registry, pinned and verified in live/vendor.py; no node).
ASSETS := daemon/ccscope/live/static/vendor/uPlot.iife.min.js

# ccscope's BPF congestion controls (struct_ops), one object per algorithm.
CC_NAMES := reno vegas westwood copa prague
CC_OBJS := $(patsubst %,daemon/ccscope/bpf/cc/%.bpf.o,$(CC_NAMES))
# Copa runs twice per ACK, and there its cost is mostly its cold JIT code (bench/cc.py): 32-bit ALU and
# jumps (BPF ISA v3, Linux >= 5.1) spare the zero-extensions and make that code about a fifth shorter.
daemon/ccscope/bpf/cc/copa.bpf.o: BPF_CFLAGS += -mcpu=v3

# The userspace delay stage of the emulated network (kernels without sch_netem).
DELAYLINE := daemon/ccscope/emulation/ccscope-delayline

.PHONY: all bpf delayline assets clean setup setup-dev demo test lint
all: bpf delayline assets

# The README's two commands.
demo: setup
	.venv/bin/ccscope scenario wired-vs-wireless --quick
test:
	tools/run-tests

setup:
	tools/bootstrap
setup-dev:
	tools/bootstrap --dev
bpf: $(BPF_OBJ) $(STATE_OBJ) $(CC_OBJS)

$(BPF_OBJ): bpf/ccscope.bpf.c bpf/ccscope.h bpf/core_min.h bpf/tcp_probe_builds.h
	@mkdir -p $(dir $@)
	$(CLANG) $(BPF_CFLAGS) -c $< -o $@

$(STATE_OBJ): bpf/ccstate.bpf.c bpf/ccstate.h bpf/core_cc.h bpf/core_min.h bpf/tcp_probe_builds.h bpf/cc/cc_state.h
	@mkdir -p $(dir $@)
	$(CLANG) $(BPF_CFLAGS) -c $< -o $@

daemon/ccscope/bpf/cc/%.bpf.o: bpf/cc/%.bpf.c bpf/cc/cc_common.h bpf/cc/cc_state.h bpf/ccstate.h bpf/core_min.h
	@mkdir -p $(dir $@)
	$(CLANG) $(BPF_CFLAGS) -c $< -o $@

delayline: $(DELAYLINE)

$(DELAYLINE): daemon/ccscope/emulation/delayline.c daemon/ccscope/emulation/pi.c daemon/ccscope/emulation/pi.h
	$(CC) -O2 -Wall -Wextra -Werror -o $@ daemon/ccscope/emulation/delayline.c daemon/ccscope/emulation/pi.c -lnetfilter_queue -lnfnetlink -lm

assets: $(ASSETS)

$(ASSETS): daemon/ccscope/live/vendor.py
	python3 daemon/ccscope/live/vendor.py

clean:
	rm -f $(BPF_OBJ) $(STATE_OBJ) $(CC_OBJS) $(DELAYLINE)
	rm -rf daemon/ccscope/live/static/vendor
