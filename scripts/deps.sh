#!/bin/sh
# Installs what building and testing agentconnect needs and this machine
# lacks: Debian packages (as root) and Go tools (into bin/tools). It installs
# nothing that is already there, so it is fast on a prepared machine.
set -eu
cd "$(dirname "$0")/.."

# command -> Debian package
missing=""
need() {
	command -v "$1" >/dev/null 2>&1 || missing="$missing $2"
}
need protoc protobuf-compiler
need systemd-analyze systemd
need systemd-socket-activate systemd
need setpriv util-linux
need git git
# srt: bwrap only; the rest is what the tests run inside sandboxes and the
# network namespaces they build.
need bwrap bubblewrap
need ip iproute2
need curl curl
need python3 python3
need node nodejs
# microsandbox: QEMU (its package brings virtiofsd) and mke2fs for the
# session disks; scripts/build-image.sh installs what the image build needs.
need qemu-system-x86_64 qemu-system-x86
need mke2fs e2fsprogs

if [ -n "$missing" ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "deps: missing Debian packages:$missing (run as root, or install them: apt-get install$missing)" >&2
		exit 1
	fi
	echo "deps: installing$missing"
	apt-get update -q >/dev/null
	# shellcheck disable=SC2086
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >/dev/null
fi

# Go tools, pinned, into bin/tools.
tools=bin/tools
mkdir -p "$tools"
gotool() {
	[ -x "$tools/$1" ] || { echo "deps: go install $2"; GOBIN="$PWD/$tools" go install "$2"; }
}
gotool protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
gotool protoc-gen-go-ttrpc github.com/containerd/ttrpc/cmd/protoc-gen-go-ttrpc@v1.2.10
gotool staticcheck honnef.co/go/tools/cmd/staticcheck@v0.8.2
