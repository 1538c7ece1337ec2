#!/bin/sh
# Regenerates the Go code of the APIs into OUT (default: the repository).
# Needs protoc, protoc-gen-go and protoc-gen-go-ttrpc on PATH (make tools).
set -eu
cd "$(dirname "$0")/.."
out=${1:-.}
mkdir -p "$out"
for p in api/admin/v1/admin.proto api/shim/v1/shim.proto api/vmagent/v1/vmagent.proto; do
	protoc -I . --go_out="$out" --go_opt=paths=source_relative \
		--go-ttrpc_out="$out" --go-ttrpc_opt=paths=source_relative "$p"
done
