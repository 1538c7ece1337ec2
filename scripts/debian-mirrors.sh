# Sourced by the scripts that debootstrap Debian (build-image.sh,
# fresh-machine-test.sh). `debian_mirrors SUITE [APT_DIR]` sets mirror and
# secmirror to this machine's Debian mirrors for SUITE, read from its apt
# sources (APT_DIR, /etc/apt by default) in either format: deb822 .sources,
# as cloud images write them, or one-line sources.list, as the installer does.
# A source counts only if it carries the suite itself (SUITE, SUITE-security),
# which third-party repositories never do. Without one: deb.debian.org.
# shellcheck shell=sh

debian_mirrors() {
	set -- "$1" "${2:-/etc/apt}"
	_files=""
	for _f in "$2/sources.list" "$2"/sources.list.d/*.list "$2"/sources.list.d/*.sources; do
		[ ! -f "$_f" ] || _files="$_files $_f"
	done
	# shellcheck disable=SC2086 # apt source file names have no spaces
	_m=$(awk -v suite="$1" '
		function pick(uri, suites,   n, s, i) {
			n = split(suites, s, /[ \t]+/)
			for (i = 1; i <= n; i++) {
				if (s[i] == suite && main == "") main = uri
				if (s[i] == suite "-security" && sec == "") sec = uri
			}
		}
		function flush(   u) {
			split(uris, u, /[ \t]+/)
			if (types ~ /(^|[ \t])deb([ \t]|$)/ && tolower(enabled) != "no" && u[1] != "") pick(u[1], suites)
			types = uris = suites = enabled = key = ""
		}
		FNR == 1 { flush() }
		FILENAME ~ /\.sources$/ {
			if ($0 ~ /^[ \t]*$/) { flush(); next }
			if ($0 ~ /^#/) next
			if ($0 ~ /^[ \t]/) { # a continuation line
				if (key == "uris") uris = uris " " $0
				if (key == "suites") suites = suites " " $0
				next
			}
			key = tolower($1); sub(/:$/, "", key)
			val = $0; sub(/^[^:]*:[ \t]*/, "", val)
			if (key == "types") types = val
			else if (key == "uris") uris = val
			else if (key == "suites") suites = val
			else if (key == "enabled") enabled = val
			next
		}
		$1 == "deb" {
			i = 2
			if ($i ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ } # [options]
			pick($i, $(i + 1))
		}
		END { flush(); print (main == "" ? "-" : main), (sec == "" ? "-" : sec) }
	' /dev/null $_files)
	mirror=${_m%% *}
	secmirror=${_m#* }
	[ -n "$mirror" ] && [ "$mirror" != - ] || mirror=http://deb.debian.org/debian
	[ -n "$secmirror" ] && [ "$secmirror" != - ] || secmirror=http://deb.debian.org/debian-security
	unset _f _files _m
}
