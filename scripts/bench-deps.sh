#!/bin/sh
# Installs what `make bench` needs beyond `make deps`: the reference
# sandbox-runtime (`srt`, npm @anthropic-ai/sandbox-runtime, pinned) into
# bin/tools/sandbox-runtime, and the Debian packages srt itself needs on Linux
# (socat, ripgrep; bubblewrap and node come with `make deps`). It installs
# nothing that is already there, so it is quick on a prepared machine.
#
# A failure here does not stop the bench: it reports the srt column as
# unavailable, with the reason.
set -eu
cd "$(dirname "$0")/.."

SRT_VERSION=0.0.83
dir=bin/tools/sandbox-runtime
pkg="$dir/node_modules/@anthropic-ai/sandbox-runtime/package.json"

# command -> Debian package
missing=""
need() {
	command -v "$1" >/dev/null 2>&1 || missing="$missing $2"
}
need bwrap bubblewrap
need socat socat
need rg ripgrep
need npm npm

if [ -n "$missing" ]; then
	if [ "$(id -u)" -ne 0 ]; then
		echo "bench-deps: missing Debian packages:$missing (run as root, or: apt-get install$missing); srt will be reported unavailable" >&2
	else
		echo "bench-deps: installing$missing"
		# shellcheck disable=SC2086
		if ! { apt-get update -q >/dev/null &&
			DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends $missing >/dev/null; }; then
			echo "bench-deps: could not install$missing; srt will be reported unavailable" >&2
		fi
	fi
fi

installed=""
if [ -f "$pkg" ]; then
	installed=$(sed -n 's/^[[:space:]]*"version":[[:space:]]*"\([^"]*\)".*/\1/p' "$pkg" | head -n 1)
fi
if [ "$installed" != "$SRT_VERSION" ] || [ ! -x "$dir/node_modules/.bin/srt" ]; then
	if ! command -v npm >/dev/null 2>&1; then
		echo "bench-deps: npm is missing: cannot install @anthropic-ai/sandbox-runtime; srt will be reported unavailable" >&2
		exit 0
	fi
	echo "bench-deps: npm install @anthropic-ai/sandbox-runtime@$SRT_VERSION into $dir"
	mkdir -p "$dir"
	# engines asks for node >= 22.12; the CLI runs on Debian's node 20 too,
	# so the engine mismatch is not fatal (npm only warns).
	if ! npm install --prefix "$dir" --save-exact --no-audit --no-fund --loglevel=error \
		"@anthropic-ai/sandbox-runtime@$SRT_VERSION" >/dev/null; then
		echo "bench-deps: npm install failed; srt will be reported unavailable" >&2
	fi
fi
