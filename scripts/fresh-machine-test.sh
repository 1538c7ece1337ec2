#!/bin/sh
# Checks what the README promises: that `make test` passes on a fresh Debian
# 12 machine, as root, with nothing but Go at /usr/local/go. A machine that
# has been worked on hides what a fresh one lacks (a Recommends, a tool, a
# user, a locale), so this makes a fresh one:
#
#  1. debootstrap bookworm --variant=minbase from this machine's Debian mirror
#     (scripts/debian-mirrors.sh) into bin/fresh-machine/_root.XXXXXX, with
#     the apt sources an installer writes, this machine's resolver, the local
#     CA certificates its network needs (see below) and Go copied from
#     /usr/local/go: nothing else, not even make or git;
#  2. clones this checkout's HEAD into it as /root/agentconnect (uncommitted
#     changes stay out) and copies ../shared beside it (the tests read it);
#  3. runs the README's steps in it as root: `apt-get update && apt-get install
#     -y make git`, then `make test`, with a clean environment (no GOPATH,
#     GOCACHE, GOFLAGS or go env file of this machine's). The one addition is
#     GOFLAGS=-v, so that the report can list the tests that skipped;
#  4. reports pass or fail, the failed and skipped tests, what the run left
#     running or in its cgroups, and the time taken. The log stays in
#     bin/fresh-machine/ (the underscore of _root and _base keeps the machines
#     out of the go tool's ./...).
#
# The machine runs in its own mount and pid namespaces with the root pivoted
# (not a chroot: bwrap and the tests need a real root), with a new /proc, the
# host's /sys (cgroups writable) and /dev (/dev/kvm, /dev/net/tun, /dev/pts,
# /dev/shm), a tmpfs on /run, and the host's network, in a cgroup of its own
# in every hierarchy. The kernel, cgroup layout and network are this
# machine's: the check is about what is installed and configured, not about
# a different kernel. A network that intercepts TLS needs its CA on every
# machine on it: this machine's local CAs (those in
# /usr/local/share/ca-certificates, and certificates in /etc/ssl/certs that no
# package put there) go to the fresh machine's /usr/local/share/ca-certificates,
# where its ca-certificates package finds them once installed, as an
# administrator would have put them there.
#
# When the run ends its namespaces end with it: the kernel kills every process
# it left and every mount it made is gone (checked with findmnt before
# anything is deleted); the cgroups it left are listed and removed.
#
# Usage: scripts/fresh-machine-test.sh [--keep] [--cached-base]   (as root)
#   --keep         leave the machine's root directory after the run
#   --cached-base  copy a pristine debootstrap kept in bin/fresh-machine/_base
#                  (made on first use) instead of making a new one
set -eu

SUITE=bookworm

say() { echo "fresh-machine: $*" >&2; }
die() { say "$*"; exit 1; }
usage() { echo "usage: $0 [--keep] [--cached-base]" >&2; exit 2; }

# The whole script is one function, read before it runs: editing the file
# during a run (which takes a while) cannot change what the run does.
main() {
	keep=0 cached=0
	for a; do
		case $a in
		--keep) keep=1 ;;
		--cached-base) cached=1 ;;
		*) usage ;;
		esac
	done

	[ "$(id -u)" -eq 0 ] || die "must run as root (debootstrap, mounts and namespaces need it): sudo make fresh-test"
	cd "$(dirname "$0")/.."
	repo=$PWD
	[ -x /usr/local/go/bin/go ] || die "no Go at /usr/local/go (the fresh machine gets a copy of it)"
	shared=$(realpath -m "$repo/../shared")
	[ -d "$shared" ] || die "no $shared (the tests read ../shared/seeds): put the shared directory beside the checkout"
	head=$(git rev-parse HEAD) || die "$repo is not a git checkout (the fresh machine gets a clone of HEAD)"
	[ -z "$(git status --porcelain --untracked-files=no)" ] || say "uncommitted changes are not tested: only HEAD ($head) is"

	missing=""
	for p in debootstrap debian-archive-keyring gpgv wget util-linux mount; do
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

	. ./scripts/debian-mirrors.sh
	debian_mirrors "$SUITE"

	work=$repo/bin/fresh-machine
	mkdir -p "$work"
	root=$(mktemp -d "$work/_root.XXXXXX")
	chmod 0755 "$root" # a system's root: everyone may traverse it
	log=$root.log
	: >"$log"
	cgdirs=""
	child=""
	trap cleanup EXIT
	trap 'stop_child; exit 130' INT TERM

	start=$(date +%s)
	make_machine
	run_machine
	report
}

# cleanup runs on every exit: the run's namespaces are gone by then (unshare
# --kill-child), so only cgroups and the directory are left to remove.
# shellcheck disable=SC2317 # called by the EXIT trap
cleanup() {
	rc=$?
	trap - EXIT INT TERM
	cg_leave || rc=1
	m=$(findmnt -rn -o TARGET | awk -v r="$root" 'index($0, r "/") == 1 || $0 == r')
	if [ -n "$m" ]; then
		say "left mounted (not deleting $root):"
		echo "$m" >&2
		rc=1
	elif [ "$keep" -eq 1 ]; then
		say "nothing left mounted under $root (findmnt); kept it"
	else
		say "nothing left mounted under $root (findmnt); removing it"
		rm -rf --one-file-system "$root"
	fi
	exit "$rc"
}

elapsed() { echo "$(($(date +%s) - start)) s"; }

# waitfor runs a command in the background and waits for it, so that a
# signal to this script is handled at once (stop_child kills the command)
# rather than once the command is done. The commands are unshare --fork
# --kill-child: killing one ends its pid namespace and all that is in it.
waitfor() {
	"$@" &
	child=$!
	wait "$child"
	_rc=$?
	child=""
	return "$_rc"
}

# shellcheck disable=SC2317 # called by the INT and TERM traps
stop_child() {
	[ -n "$child" ] || return 0
	kill -KILL "$child" 2>/dev/null
	wait "$child" 2>/dev/null
	child=""
}

# --- 1. The machine: Debian minbase, the installer's apt sources, Go.
bootstrap() { # DIR; in mount and pid namespaces of its own, so that
	# nothing it mounts in the target stays mounted on this machine and
	# nothing it starts outlives it
	say "debootstrap $SUITE --variant=minbase from $mirror into $1"
	waitfor unshare --mount --propagation private --pid --fork --kill-child \
		debootstrap --variant=minbase "$SUITE" "$1" "$mirror" >>"$log" 2>&1 ||
		die "debootstrap failed: see $log"
}

make_machine() {
	if [ "$cached" -eq 1 ]; then
		base=$work/_base
		if [ "$(cat "$base.stamp" 2>/dev/null || true)" != "$SUITE $mirror" ]; then
			rm -rf --one-file-system "$base" "$base.stamp" "$base.new"
			bootstrap "$base.new"
			mv "$base.new" "$base"
			echo "$SUITE $mirror" >"$base.stamp"
		fi
		say "copying the pristine debootstrap in $base"
		cp -a "$base/." "$root/"
	else
		bootstrap "$root"
	fi
	cat >"$root/etc/apt/sources.list" <<-EOF
		deb $mirror $SUITE main
		deb $mirror $SUITE-updates main
		deb $secmirror $SUITE-security main
	EOF
	cp -L /etc/resolv.conf "$root/etc/resolv.conf"
	printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' "$(hostname)" >"$root/etc/hosts"
	cas=$root/usr/local/share/ca-certificates/this-network
	for c in $(find /usr/local/share/ca-certificates -name '*.crt' 2>/dev/null) \
		$(find /etc/ssl/certs -maxdepth 1 -type f -name '*.pem' ! -name ssl-cert-snakeoil.pem); do
		dpkg -S "$c" >/dev/null 2>&1 && continue # a package's, not a local one
		n=$(basename "$c")
		[ ! -e "$cas/${n%.*}.crt" ] || continue
		mkdir -p "$cas"
		cp "$c" "$cas/${n%.*}.crt"
		say "trusting this machine's local CA $c (for its network)"
	done
	mkdir -p "$root/usr/local/go"
	cp -a /usr/local/go/. "$root/usr/local/go/" # /. : a symlinked Go is copied too

	# The project: HEAD, and ../shared beside it.
	git clone -q --no-hardlinks "$repo" "$root/root/agentconnect"
	git -C "$root/root/agentconnect" checkout -q "$head"
	cp -a "$shared" "$root/root/shared"
	say "machine ready ($(elapsed)): $(du -sh "$root" | cut -f1), project at $head"
}

# --- 2. The run's cgroups: one below this script's own in every hierarchy,
# so that what the tests create (below their own) can be told from other
# users' cgroups, and what they leave can be removed.
cg_mount() { # CONTROLLERS (from /proc/self/cgroup; empty: cgroup2)
	findmnt -rn -t cgroup,cgroup2 -o TARGET,FSTYPE,OPTIONS | awk -v want="$1" '
		want == "" && $2 == "cgroup2" { print $1; exit }
		want != "" && $2 == "cgroup" {
			n = split(want, w, ","); split($3, o, ","); for (i in o) have[o[i]] = 1
			ok = 1; for (i = 1; i <= n; i++) if (!(w[i] in have)) ok = 0
			delete have
			if (ok) { print $1; exit }
		}'
}

cg_enter() {
	name=fresh-machine-${root##*.}
	while IFS=: read -r _ ctrls path; do
		mnt=$(cg_mount "$ctrls")
		[ -n "$mnt" ] || continue
		d=${mnt%/}${path%/}/$name
		mkdir "$d" || die "create cgroup $d"
		cgdirs="$cgdirs $d"
		# A new v1 cpuset has no cpus or memory nodes until given its parent's.
		if [ -f "$d/cpuset.cpus" ]; then
			cat "$(dirname "$d")/cpuset.cpus" >"$d/cpuset.cpus"
			cat "$(dirname "$d")/cpuset.mems" >"$d/cpuset.mems"
		fi
		echo $$ >"$d/cgroup.procs" || die "move this script into cgroup $d"
	done </proc/self/cgroup
}

# cg_leave moves this script back, lists what the run left in its cgroups and
# removes them (their processes died with the run's pid namespace).
cg_leave() {
	ok=0
	for d in $cgdirs; do
		echo $$ >"$(dirname "$d")/cgroup.procs" || ok=1
	done
	for d in $cgdirs; do
		left=$(find "$d" -mindepth 1 -type d | sed "s|^$d/||")
		[ -z "$left" ] || say "cgroups the run left in $d (removed): $(echo "$left" | tr '\n' ' ')"
		i=0
		while ! find "$d" -depth -type d -exec rmdir {} + 2>/dev/null; do
			i=$((i + 1))
			[ "$i" -lt 50 ] || { say "cannot remove cgroup $d: $(tr '\n' ' ' <"$d/cgroup.procs")"; ok=1; break; }
			sleep 0.2
		done
	done
	cgdirs=""
	return "$ok"
}

# --- 3. The README's steps, as root, in the machine. Its PID 1 is the shell
# below: it reaps orphans while it waits (as init would), lists what is still
# running when make is done, and when it exits the kernel kills the rest.
# shellcheck disable=SC2016 # expanded inside the machine
inner='
cd /root/agentconnect
echo "fresh-machine: \$ apt-get update && apt-get install -y make git"
apt-get update -q && apt-get install -y -q make git </dev/null || exit 100
echo "fresh-machine: \$ make test"
make test </dev/null
rc=$?
left=0
for p in /proc/[0-9]*; do
	pid=${p#/proc/}
	[ "$pid" -ne 1 ] || continue
	[ -r "$p/cmdline" ] || continue
	echo "fresh-machine: left running: $pid $(tr "\0" " " <"$p/cmdline")"
	left=1
done
[ "$rc" -ne 0 ] || [ "$left" -eq 0 ] || rc=101
exit "$rc"
'
# shellcheck disable=SC2016 # expanded in the new namespaces
setup='
set -e
root=$1
mount --rbind "$root" "$root"
mount -t proc -o nosuid,nodev,noexec proc "$root/proc"
mount --rbind /sys "$root/sys"
mount --rbind /dev "$root/dev"
mount -t tmpfs -o nosuid,nodev,mode=0755 tmpfs "$root/run"
mkdir -m 1777 "$root/run/lock"
cd "$root"
pivot_root . mnt
cd /
umount -l /mnt
exec /usr/bin/env -i HOME=/root USER=root LOGNAME=root SHELL=/bin/bash TERM=dumb \
	PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin GOFLAGS=-v \
	/bin/sh -c "$2"
'

run_machine() {
	cg_enter
	say "running the README's steps in the machine (log: $log)"
	tstart=$(date +%s)
	set +e
	waitfor unshare --mount --propagation private --pid --fork --kill-child sh -c "$setup" sh "$root" "$inner" >>"$log" 2>&1
	rc=$?
	set -e
	say "the run took $(($(date +%s) - tstart)) s"
	cg_leave || { [ "$rc" -ne 0 ] || rc=102; }
}

# --- 4. The report: failures, skips (with their reasons) and leftovers.
report() {
	grep '^fresh-machine: left running' "$log" >&2 || true
	grep -E '^(--- FAIL|FAIL|panic:)' "$log" >&2 || true
	skips=$(awk '
		/^=== (RUN|CONT|NAME) / { cur = $3; next }
		/^ +[^ ]+\.go:[0-9]+: / && cur != "" { why[cur] = $0; next } # the last one logged: the reason
		/^ *--- SKIP: / { n = $3; r = why[n]; sub(/^ +/, "", r); print "  " n ": " r }
	' "$log")
	if [ -n "$skips" ]; then
		say "skipped tests:"
		echo "$skips" >&2
	fi
	case $rc in
	0) say "PASS: make test on a fresh Debian $SUITE machine ($(elapsed) in all)" ;;
	100) say "FAIL: apt-get install make git failed: see $log" ;;
	101) say "FAIL: make test passed but left processes running (above); see $log" ;;
	102) say "FAIL: make test passed but its cgroups could not be removed (above); see $log" ;;
	*)
		tail -n 40 "$log" >&2
		say "FAIL: make test exited $rc ($(elapsed) in all): see $log"
		;;
	esac
	exit "$rc"
}

main "$@"
