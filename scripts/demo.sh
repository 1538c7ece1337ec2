#!/bin/sh
# make demo: a daemon in a temporary home, a real session in the strongest
# strategy this host offers, what its boundary allows and denies, and a
# supervisor SIGKILL the session survives. Runs under bin/tools/subreaper
# (this machine's PID 1 does not reap the shims a daemon leaves).
set -eu
cd "$(dirname "$0")/.."
if [ -z "${AGENTCONNECT_DEMO_REAPED:-}" ]; then
	go build -o bin/tools/subreaper ./internal/reaper/subreaper
	AGENTCONNECT_DEMO_REAPED=1 exec bin/tools/subreaper "$0" "$@"
fi

ac="$PWD/bin/agentconnect"
home=$(mktemp -d /tmp/agentconnect-demo.XXXXXX)
export AGENTCONNECT_HOME="$home"
say() { printf '\n\033[1m== %s\033[0m\n' "$*"; }
cleanup() {
	"$ac" session ls --json 2>/dev/null | sed -n 's/.*"id": "\([0-9a-f]*\)".*/\1/p' | while read -r id; do
		"$ac" session rm --force "$id" >/dev/null 2>&1 || true
	done
	[ -n "${daemon:-}" ] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null || true
	rm -rf "$home" "${marker:-}"
}
trap cleanup EXIT

start_daemon() {
	# A secret in the daemon's environment: no session may see it.
	DEMO_DAEMON_SECRET=hunter2 "$ac" run >>"$home/daemon.log" 2>&1 &
	daemon=$!
	i=0
	until "$ac" status >/dev/null 2>&1; do
		i=$((i + 1)); [ $i -lt 200 ] || { cat "$home/daemon.log"; exit 1; }
		sleep 0.05
	done
}

say "What this host offers (agentconnect probe)"
"$ac" probe || true
# Without KVM or vhost-vsock, a VM still runs under software emulation
# (TCG) over a virtio-serial port: offer that rather than no VM at all.
if ! "$ac" probe --json | tr -d '\n ' | grep -q '"name":"microsandbox","available":true'; then
	echo '{"sandbox": {"microsandbox": {"accelerator": "tcg", "transport": "serial", "cpus": 1, "memoryMiB": 1024}}}' >"$home/config.json"
	echo "(microsandbox with the defaults is not available here; trying it with software emulation:)"
	"$ac" probe | grep microsandbox || true
fi

say "Starting a daemon in $home"
start_daemon
"$ac" status

best=$("$ac" status --json | sed -n 's/.*"defaultStrategy": "\(.*\)".*/\1/p')
for s in srt microsandbox; do
	if "$ac" status --json | tr -d '\n ' | grep -q "\"name\":\"$s\",\"available\":true"; then best=$s; fi
done
say "The strongest strategy here: $best"

# A server on the host's loopback: the sandbox reaches it only through its
# policy proxy, and only because the agent's allowlist names it.
python3 -m http.server 0 --bind 127.0.0.1 --directory "$home" >"$home/http.log" 2>&1 &
web=$!
port=""
for _ in $(seq 100); do
	port=$(sed -n 's/.*port \([0-9]*\).*/\1/p' "$home/http.log" | head -1)
	[ -n "$port" ] && break
	sleep 0.05
done

marker=$(mktemp /tmp/agentconnect-demo-marker.XXXXXX)
# The pids limit shows in srt and host sessions; a VM's cgroup holds QEMU
# and virtiofsd, and the guest's processes are the guest kernel's.
pids="--pids 64"
[ "$best" = microsandbox ] && pids=""
# What the session tries, each line "allowed" or "denied".
probe='
try() { what=$1; shift; if "$@" >/dev/null 2>&1; then echo "  allowed: $what"; else echo "  denied:  $what"; fi; }
echo "runtime: uid $(id -u), pid $$, cwd $PWD"
echo "HOME=$HOME"
'
if [ "$best" = microsandbox ]; then
	probe=$probe'
echo "kernel: $(uname -r) (the host runs $DEMO_HOST_KERNEL)"
try "write in the workspace" sh -c "echo hi > demo.txt"
try "write in its private home" sh -c "echo hi > \"\$HOME/demo.txt\""
try "commit in the workspace'"'"'s repository (the daemon made it)" sh -c "git add demo.txt && git -c user.name=demo -c user.email=demo@demo commit -qm demo"
try "plant a git hook there, which git on the host would run" sh -c "echo x > .git/hooks/pre-commit"
try "plant a shell rc file in its home" sh -c "echo x >> \"\$HOME/.bashrc\""
try "read the daemon home ($DEMO_HOME)" ls "$DEMO_HOME/sessions"
try "see a file in the host'"'"'s /tmp" test -e "$DEMO_MARKER"
try "see the daemon'"'"'s secret in its environment" sh -c "env | grep -q DEMO_DAEMON_SECRET"
try "write to /etc (the VM'"'"'s own)" sh -c "echo x > /etc/agentconnect-demo"
try "resolve a name not on the allowlist (DNS)" getent hosts example.com
try "reach the host loopback port on the allowlist (raw TCP)" bash -c "exec 3<>/dev/tcp/192.168.127.254/$DEMO_PORT"
try "reach another host loopback port" bash -c "exec 3<>/dev/tcp/192.168.127.254/1"
try "fetch from it over HTTP, no proxy involved" curl -sf --max-time 5 "http://host.agentconnect.internal:$DEMO_PORT/"
'
else
	probe=$probe'
try "write in the workspace" sh -c "echo hi > demo.txt"
try "write in its private home" sh -c "echo hi > \"\$HOME/demo.txt\""
try "commit in the workspace'"'"'s repository (the daemon made it)" sh -c "git add demo.txt && git -c user.name=demo -c user.email=demo@demo commit -qm demo"
try "plant a git hook there, which git on the host would run" sh -c "echo x > .git/hooks/pre-commit"
try "plant a shell rc file in its home" sh -c "echo x >> \"\$HOME/.bashrc\""
try "read the daemon home ($DEMO_HOME)" ls "$DEMO_HOME/sessions"
try "read /root" sh -c "ls -A /root | grep -q ."
try "write to /etc" sh -c "echo x > /etc/agentconnect-demo"
try "see the daemon'"'"'s secret in its environment" sh -c "env | grep -q DEMO_DAEMON_SECRET"
try "plant a git hook in .git/hooks" sh -c "echo x > .git/hooks/pre-commit"
try "create a unix socket" python3 -c "import socket; socket.socket(socket.AF_UNIX)"
try "resolve a name (DNS)" getent hosts example.com
try "reach the host loopback directly" python3 -c "import socket; socket.create_connection((\"127.0.0.1\", $DEMO_PORT), 2)"
try "reach it through the proxy (allowlisted)" curl -sf --noproxy "" -x "$HTTP_PROXY" "http://127.0.0.1:$DEMO_PORT/"
try "reach another loopback port through the proxy" curl -sf --noproxy "" -x "$HTTP_PROXY" "http://127.0.0.1:1/"
echo "cgroup: $(grep -E ":pids:|^0::" /proc/self/cgroup | head -1)"
try "fork 100 processes (the agent'"'"'s pids limit is 64)" sh -c "for i in \$(seq 100); do sleep 1 & done; wait"
wait
'
fi
"$ac" agent create demo --strategy "$best" --env DEMO_HOME="$home" --env DEMO_PORT="$port" \
	--env DEMO_MARKER="$marker" --env DEMO_HOST_KERNEL="$(uname -r)" \
	--allow-domain "127.0.0.1:$port" $pids -- sh -c "$probe" >/dev/null
git init -q "$("$ac" agent show demo --json | sed -n 's/.*"dir": "\(.*\)".*/\1/p')/workspace"
say "A session of agent 'demo' ($best): what the boundary allows and denies"
"$ac" exec demo
kill "$web" 2>/dev/null || true
rm -f "$marker"

say "Sessions outlive the supervisor: start one, SIGKILL the daemon, start it again"
"$ac" agent create ticker --strategy "$best" -- sh -c 'i=0; while :; do i=$((i+1)); echo "tick $i"; sleep 0.2; done' >/dev/null
id=$("$ac" session start ticker)
sleep 1
"$ac" session ls
kill -9 "$daemon"; wait "$daemon" 2>/dev/null || true
echo "daemon killed (SIGKILL); the session keeps running in its shim..."
sleep 1
start_daemon
"$ac" session ls
"$ac" session stop "$id" >/dev/null
echo "its whole output, no tick lost across the restart:"
"$ac" session logs "$id" | tr '\n' ' '; echo

say "Stopping the daemon; removing $home"
