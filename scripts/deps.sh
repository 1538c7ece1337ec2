#!/bin/sh
# Installs what building and testing agentconnect needs and this machine
# lacks: Debian packages (as root) and Go tools (into bin/tools). It installs
# nothing that is already there, so it is fast on a prepared machine.
#
# Packages are checked by name with dpkg, never by a command they happen to
# bring: a header or data file (libprotobuf-dev's well-known .proto files) has
# no command, and a Recommends that --no-install-recommends drops must be
# named here or a fresh machine goes without it.
set -eu
cd "$(dirname "$0")/.."

PACKAGES="
	make ca-certificates git
	gcc libc6-dev
	protobuf-compiler libprotobuf-dev
	systemd procps util-linux coreutils tar
	bubblewrap
	iproute2 curl python3 nodejs
	qemu-system-x86 e2fsprogs busybox-static
	chromium socat
"
# What each is for:
#   make, ca-certificates (the Go module proxy over HTTPS), git (the version
#     stamp; the tests' repositories)
#   gcc, libc6-dev: go test -race needs cgo
#   protobuf-compiler, libprotobuf-dev (google/protobuf/*.proto): make proto
#     and the test that the generated code is current
#   systemd (systemd-analyze, systemd-socket-activate), procps (/bin/kill,
#     the units' ExecReload, which systemd-analyze verify requires to exist),
#     util-linux (setpriv, unshare), coreutils, tar: the systemd and
#     integration tests
#   bubblewrap: srt, and the confinement of QEMU and virtiofsd
#   iproute2 (test network namespaces), curl, python3, nodejs: what the tests
#     run inside sandboxes and VMs
#   npm: the real runtimes the tests install (claude-agent-acp, pinned) and the
#     bench's reference sandbox-runtime; Debian's nodejs does not bring it (a
#     nodejs from NodeSource does, and conflicts with Debian's npm)
#   git also brings git-http-backend, the tests' git server over HTTPS
#   qemu-system-x86 (brings virtiofsd), e2fsprogs (mke2fs, debugfs,
#     dumpe2fs): microsandbox, and make chaos's loop filesystem (mkfs.ext4,
#     mounted with util-linux's mount); busybox-static: the guest agent's own
#     VM tests
#   chromium: a headless browser inside srt, among the developer tools whose
#     unix sockets the tests check; socat: Claude Code's own sandbox (its
#     bridges) inside a nested srt sandbox
# scripts/build-image.sh installs what the image build needs.

missing=""
for p in $PACKAGES; do
	st=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null || true)
	[ "$st" = installed ] || missing="$missing $p"
done
command -v npm >/dev/null 2>&1 || missing="$missing npm"

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
