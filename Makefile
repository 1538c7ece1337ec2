# agentconnect. `make demo` and `make test` set up everything they need on a
# fresh Debian machine (as root): see scripts/deps.sh.

export PATH := $(CURDIR)/bin/tools:/usr/local/go/bin:$(PATH)
export GOTOOLCHAIN := local
# Static binaries: cgo stays out (the shim's memory and start time pay for a
# dynamic libc on every session).
export CGO_ENABLED := 0

VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/agentconnect-md/agentconnect/internal/version.Version=$(VERSION)
PREFIX ?= /usr/local
BINARIES := bin/agentconnect bin/agentconnect-shim bin/agentconnect-shim-vm bin/agentconnect-vmimage bin/agentconnect-inject

.PHONY: all build deps proto image test fresh-test unit integration lint demo bench fuzz chaos docs install clean

all: build

deps:
	@./scripts/deps.sh

# The guest agent is stripped (-s -w): its file is in every VM's RAM, the initramfs.
build:
	go build -ldflags '$(LDFLAGS)' -o bin/ ./cmd/agentconnect ./cmd/agentconnect-shim ./cmd/agentconnect-shim-vm ./cmd/agentconnect-vmimage ./cmd/agentconnect-inject
	go build -ldflags '-s -w $(LDFLAGS)' -o bin/agentconnect-vmagent ./cmd/agentconnect-vmagent

# The default microsandbox guest image (kernel, initramfs with the vmagent,
# Debian root with git and Node.js), into bin/image; quick when up to date.
image: build
	./scripts/build-image.sh bin/image bin/agentconnect-vmagent

# Regenerate the API code from api/**/*.proto (the result is committed).
proto: deps
	./api/generate.sh

# Every test, under the race detector (which needs cgo; the binaries the
# integration tests drive stay static): unit tests beside the code, then the
# integration tests that drive the built binaries. Root-only tests skip with a
# message elsewhere.
test: deps build image lint
	CGO_ENABLED=1 AGENTCONNECT_BIN=$(CURDIR)/bin go test -race -count=1 -timeout 18m ./...

# Every fuzz target for FUZZTIME each (default 30s), one after another; the
# seeds, and what earlier runs found, are replayed by make test.
fuzz: deps
	./scripts/fuzz.sh $(FUZZTIME)

# docs/cli.md from the commands' own help (a test fails when it is stale);
# docs/config.md is written by hand and checked against the parser.
docs:
	go test ./cmd/agentconnect -run '^TestCLIReference$$' -count=1 -update

# Session churn in every strategy while the supervisor is SIGKILLed, shims
# and runtimes are killed and the home's disk fills once; the promises are
# checked after every round (chaos/main.go). SEED=N replays a plan;
# CHAOS_DURATION bounds the rounds (default 8m: the whole run stays under 10).
chaos: deps build image
	AGENTCONNECT_BIN=$(CURDIR)/bin go run ./chaos -seed $(or $(SEED),0) -duration $(or $(CHAOS_DURATION),8m)

# `make test` on a fresh Debian 12 machine made with debootstrap (as root;
# about 10 minutes): what the README promises, checked. FRESH_TEST_FLAGS:
# --keep, --cached-base (see the script).
fresh-test:
	./scripts/fresh-machine-test.sh $(FRESH_TEST_FLAGS)

lint: deps
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	go vet ./...
	staticcheck ./...

demo: deps build image
	./scripts/demo.sh

# Measurements, side by side with the reference sandbox-runtime (srt from
# npm, installed into bin/tools by scripts/bench-deps.sh); the table goes to
# BENCHMARKS.md too.
bench: deps build image
	./scripts/bench-deps.sh
	AGENTCONNECT_BIN=$(CURDIR)/bin go run ./bench -md BENCHMARKS.md

install: build image
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/share/agentconnect/image
	install -m 0755 $(BINARIES) $(DESTDIR)$(PREFIX)/bin/
	cp --sparse=always bin/image/vmlinuz bin/image/initrd.img bin/image/rootfs.img bin/image/image.json \
		$(DESTDIR)$(PREFIX)/share/agentconnect/image/

clean:
	rm -rf bin
