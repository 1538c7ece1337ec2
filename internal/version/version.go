// Package version is the release of this build, set by the linker
// (-X github.com/agentconnect-md/agentconnect/internal/version.Version=...).
package version

// Version is the release; "dev" in builds that did not set it.
var Version = "dev"
