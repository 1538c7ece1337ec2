package netpolicy

import "time"

// ProtocolFile marks what a run wrote that host tools would run (a git hook
// or config of a repository it created, found when the run ended), kept
// with the session's refusals so that one place warns a person of both.
const ProtocolFile = "file"

// Violation is one destination the policy refused: what the srt proxy and
// the microsandbox network report, and what a session's violations file
// keeps. It lives here because both reporters already judge with this
// package, which imports nothing of the daemon's.
type Violation struct {
	Time time.Time `json:"time"`
	// Protocol is how it was asked for: "http", "connect" or "socks5" (the
	// srt proxy); "tcp", "udp" or "dns" (the microsandbox network); or
	// ProtocolFile.
	Protocol string `json:"protocol"`
	// Host is the name or IP literal the destination was judged as, as the
	// client gave it; for ProtocolFile, the file's path on the host.
	Host string `json:"host"`
	// Port is 0 for "dns": a name is refused on every port.
	Port int `json:"port"`
	// Addr is the resolved address that was refused, when it got that far
	// ("127.0.0.1" for the microsandbox host address); "" otherwise.
	Addr   string `json:"addr"`
	Reason string `json:"reason"`
}
