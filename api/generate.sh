#!/bin/sh
# Regenerates the Go code of the APIs into OUT (default: the repository).
# Needs protoc, protoc-gen-go and protoc-gen-go-ttrpc on PATH (make proto installs them).
set -eu
cd "$(dirname "$0")/.."
out=${1:-.}
mkdir -p "$out"
for p in api/admin/v1/admin.proto api/vmagent/v1/vmagent.proto; do
	protoc -I . --go_out="$out" --go_opt=paths=source_relative \
		--go-ttrpc_out="$out" --go-ttrpc_opt=paths=source_relative "$p"
done
# The shim API's Go code is written by hand (api/shim/v1/messages.go), so
# that a shim links no protobuf runtime. The generated code is its reference:
# the tests compare the two encodings and talk to the ttrpc library with it.
mod=github.com/agentconnect-md/agentconnect
ref=Mapi/shim/v1/shim.proto=$mod/api/shim/v1/internal/shimpb\;shimpb
protoc -I . --go_out="$out" --go_opt=module=$mod --go_opt="$ref" \
	--go-ttrpc_out="$out" --go-ttrpc_opt=module=$mod --go-ttrpc_opt="$ref" api/shim/v1/shim.proto
