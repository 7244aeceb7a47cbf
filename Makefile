# Build the BPF object and place it inside the Python package, which ships it.
CLANG ?= clang
ARCH := $(shell uname -m | sed -e 's/x86_64/x86/' -e 's/aarch64/arm64/')
MULTIARCH := $(shell $(CLANG) -print-multiarch 2>/dev/null || echo $(shell uname -m)-linux-gnu)
BPF_OBJ := daemon/ccscope/bpf/ccscope.bpf.o
BPF_CFLAGS := -g -O2 -target bpf -D__TARGET_ARCH_$(ARCH) -Wall -Werror \
	-I/usr/include/$(MULTIARCH) -Ibpf

.PHONY: all bpf clean setup setup-dev demo test lint
all: bpf

# The README's two commands.
demo: setup
	.venv/bin/ccscope scenario wired-vs-wireless --quick
test: setup-dev
	.venv/bin/ruff check daemon tests bench tools
	.venv/bin/python -m pytest -q

setup:
	tools/bootstrap
setup-dev:
	tools/bootstrap --dev
bpf: $(BPF_OBJ)

$(BPF_OBJ): bpf/ccscope.bpf.c bpf/ccscope.h bpf/core_min.h
	@mkdir -p $(dir $@)
	$(CLANG) $(BPF_CFLAGS) -c $< -o $@

clean:
	rm -f $(BPF_OBJ)
