"""tools/kernel-lab's reading of a panicked guest's console (kernel_lab.vm.crash_site): the one error line names
the oops that led to the panic and the function it stopped in. The consoles are real reports' shapes: the 7.2
guest's int3 oops that the CI run of 454a740 died of (a second CPU's oops after it), a page fault's BUG with its
#PF lines, 6.1's form without "Oops: ", a kernel BUG, and a non-fatal BUG with a RIP of its own before the oops."""

from __future__ import annotations

import json
import subprocess

import pytest
from ccscope_testkit.prereqs import ROOT

T = "[    2.189222] "
CONSOLES = {
    "int3, then a second CPU's": (
        f"{T}Oops: int3: 0000 [#1] SMP NOPTI\n{T}CPU: 0 UID: 0 PID: 0 Comm: swapper/0\n"
        f"{T}RIP: 0010:sched_clock_idle_wakeup_event+0x5/0x50\n{T}Call Trace:\n"
        f"{T}RIP: 0010:pv_native_safe_halt+0xf/0x20\n"
        f"{T}Oops: int3: 0000 [#2] SMP NOPTI\n{T}RIP: 0010:sched_clock_idle_wakeup_event+0x5/0x50\n"
        f"{T}Kernel panic - not syncing: Fatal exception in interrupt\n",
        "Oops: int3: 0000 [#1] SMP NOPTI at sched_clock_idle_wakeup_event+0x5/0x50"),
    "page fault": (
        f"{T}BUG: kernel NULL pointer dereference, address: 0000000000000008\n"
        f"{T}#PF: supervisor read access in kernel mode\n{T}#PF: error_code(0x0000) - not-present page\n"
        f"{T}PGD 0 P4D 0\n{T}Oops: 0000 [#1] PREEMPT SMP NOPTI\n{T}CPU: 1 PID: 0 Comm: swapper/1\n"
        f"{T}RIP: 0010:dualpi2_timer+0x6a/0x1f0 [sch_dualpi2]\n{T}Kernel panic - not syncing: Fatal exception\n",
        "BUG: kernel NULL pointer dereference, address: 0000000000000008 at dualpi2_timer+0x6a/0x1f0 [sch_dualpi2]"),
    "6.1, a warning before": (
        f"{T}BUG: sleeping function called from invalid context at mm/slab.h:1\n{T}RIP: 0010:warned+0x1/0x2\n"
        f"{T}int3: 0000 [#1] SMP NOPTI\n{T}RIP: 0010:tick_irq_enter+0x8e/0xa0\n"
        f"{T}Kernel panic - not syncing: Fatal exception in interrupt\n",
        "int3: 0000 [#1] SMP NOPTI at tick_irq_enter+0x8e/0xa0"),
    "kernel BUG": (
        f"{T}kernel BUG at net/sched/sch_generic.c:123!\n{T}invalid opcode: 0000 [#1] SMP\n"
        f"{T}RIP: 0010:qdisc_reset+0x10/0x20 [sch_x 0123abcd]\n{T}Kernel panic - not syncing: Fatal exception\n",
        "kernel BUG at net/sched/sch_generic.c:123! at qdisc_reset+0x10/0x20 [sch_x 0123abcd]"),
    "a panic with no oops": (f"{T}Kernel panic - not syncing: sysrq triggered crash\n", ""),
}


def _crash_sites(consoles: list[str]) -> list[str]:
    # the lab is a script's package (tools/kernel_lab), not an installed one: run it from tools/
    code = "import json, sys; from kernel_lab.vm import crash_site; print(json.dumps([crash_site(c) for c in " \
           "json.load(sys.stdin)]))"
    ran = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-c", code], input=json.dumps(consoles),
                         capture_output=True, text=True, cwd=ROOT / "tools", check=True)
    return json.loads(ran.stdout)


@pytest.fixture(scope="module")
def sites() -> dict[str, str]:
    return dict(zip(CONSOLES, _crash_sites([console for console, _ in CONSOLES.values()]), strict=True))


@pytest.mark.parametrize("shape", CONSOLES)
def test_the_panic_line_names_the_oops_and_its_function(sites: dict[str, str], shape: str) -> None:
    assert sites[shape] == CONSOLES[shape][1]
