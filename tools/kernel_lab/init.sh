#!/bin/sh
# ccscope kernel-lab guest init: pid 1 of the initramfs, run by busybox sh.
# Mounts the host root read-only, gives it writable scratch, runs the command the host left in the
# control share, reports its exit status there and on the console, and powers off.
export PATH=/bin:/sbin
NEW=/newroot
CTL_MNT=/run/kernel-lab

say() { echo "kernel-lab-init: $*"; }
finish() {
    # One marker line on the console too, so the host learns the status even if the share is gone.
    echo "KERNEL-LAB-EXIT $1"
    sync
    poweroff -f
    reboot -f   # qemu runs with -no-reboot, so this ends it as well
}
die() { say "$*"; echo "KERNEL-LAB-FAIL $*"; finish 125; }

mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev

while read -r mod args; do
    [ -n "$mod" ] || continue
    # shellcheck disable=SC2086  # args are module parameters, split on purpose
    insmod "/modules/$mod" $args || say "insmod $mod failed"
done < /modules/load.order

P9="trans=virtio,version=9p2000.L,msize=512000"
mkdir -p /ctl "$NEW"
mount -t 9p -o "$P9,rw,cache=none" klabctl /ctl || die "cannot mount the control share"
. /ctl/config.sh || die "cannot read /ctl/config.sh"
. /etc/klab.conf

# cache=loose: the host root does not change under a short run, and 9p without it is very slow.
mount -t 9p -o "$P9,ro,cache=loose" hostroot "$NEW" || die "cannot mount the host root over 9p"
for d in /tmp /run /var/tmp; do
    mount -t tmpfs -o mode=1777 tmpfs "$NEW$d" || die "cannot mount tmpfs on $d"
done
chmod 755 "$NEW/run"
mount -t proc proc "$NEW/proc"
mount -t sysfs sys "$NEW/sys"
mount -t devtmpfs dev "$NEW/dev"
mkdir -p "$NEW/dev/pts" "$NEW/dev/shm"
mount -t devpts devpts "$NEW/dev/pts"
mount -t tmpfs -o mode=1777 tmpfs "$NEW/dev/shm"
mount -t tracefs tracefs "$NEW/sys/kernel/tracing" 2>/dev/null
mount -t debugfs debugfs "$NEW/sys/kernel/debug" 2>/dev/null
mount -t bpf bpf "$NEW/sys/fs/bpf" 2>/dev/null
mount -t cgroup2 cgroup2 "$NEW/sys/fs/cgroup" 2>/dev/null

# /boot/config-$(uname -r) for code that reads the kernel config (the host's /boot is for its own kernel).
if mount -t tmpfs -o mode=755 tmpfs "$NEW/boot" 2>/dev/null; then
    cp "$NEW$KLAB_MODROOT/boot/config-"* "$NEW$KLAB_MODROOT/boot/System.map-"* "$NEW/boot/" 2>/dev/null
fi

mkdir -p "$NEW$CTL_MNT"
mount --move /ctl "$NEW$CTL_MNT" || die "cannot move the control share"
CTL="$NEW$CTL_MNT"

# Writable shares of host directories, at the same path as on the host (KLAB_SHARES: tag=path lines).
echo "$KLAB_SHARES" | while IFS='=' read -r tag path; do
    [ -n "$tag" ] || continue
    mkdir -p "$NEW$path" 2>/dev/null
    mount -t 9p -o "$P9,rw,cache=none" "$tag" "$NEW$path" || say "cannot mount share $path"
done

# Modules are found under the cached kernel tree (the host has no /lib/modules for this kernel):
# the kernel's own autoloading goes through a helper here in the initramfs.
echo /sbin/klab-modprobe > /proc/sys/kernel/modprobe
ip link set lo up
hostname kernel-lab

chroot "$NEW" /bin/sh "$CTL_MNT/cmd.sh" > "$CTL/stdout" 2> "$CTL/stderr" < /dev/null
rc=$?
echo "$rc" > "$CTL/rc"
finish "$rc"
