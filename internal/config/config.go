// Package config reads a daemon's config.json: which strategies it offers,
// their settings, and the retired keys older daemons wrote.
package config

import (
	"bytes"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"regexp"
	"sort"
	"strings"
	"sync"

	"github.com/agentconnect-md/agentconnect/api/session"
	"github.com/agentconnect-md/agentconnect/strategy"
)

// VM holds the microsandbox settings: daemon defaults that agents may override.
type VM struct {
	CPUs        int    `json:"cpus"`
	MemoryMiB   int    `json:"memoryMiB"`
	DiskGiB     int    `json:"diskGiB"`     // capacity of each writable disk
	Image       string `json:"image"`       // empty: the default image
	Accelerator string `json:"accelerator"` // kvm or tcg
	Transport   string `json:"transport"`   // vsock or serial
	// TCGCacheMiB bounds QEMU's translation cache per VM under tcg; 0:
	// QEMU's default (up to 1 GiB, resident as code is translated).
	TCGCacheMiB int `json:"tcgCacheMiB"`
	// Resolver is the DNS server ("IP:port") the VMs' network asks for
	// the guests' names; empty: the system's resolver.
	Resolver string `json:"resolver"`
}

// Host holds the host strategy's settings.
type Host struct {
	// User, when set, is the account host sessions' runtimes run as under
	// a root daemon (a service user such as agentconnect): Claude Code,
	// among others, refuses to run as root outside a sandbox.
	User string `json:"user"`
}

// SRT holds the srt settings.
type SRT struct {
	// Resolver is the DNS server ("IP:port") the sessions' policy proxy
	// asks; empty: the system's resolver.
	Resolver string `json:"resolver"`
}

// DefaultVM is what "microsandbox": true means.
var DefaultVM = VM{CPUs: 2, MemoryMiB: 2048, DiskGiB: 10, Accelerator: "kvm", Transport: "vsock"}

// Config is a daemon's configuration after reading and validation.
type Config struct {
	// Path is the file read, or "" when there was none.
	Path string
	// Offered maps each strategy to whether this daemon offers it.
	Offered map[strategy.Name]bool
	// OffReason says why a strategy is not offered, in the words users see.
	OffReason map[strategy.Name]string
	VM        VM
	SRT       SRT
	Host      Host
	// Backend is the retired sandbox.backend: the sandbox legacy agents with
	// runInSandbox on are mapped to. Empty when not set.
	Backend strategy.Name
	// SocketGroup, when set, makes the admin socket 0660 with this group.
	SocketGroup string
	// LogLevel is debug, info, warn or error.
	LogLevel string
	// OutputLimitMiB bounds each session's output log: the run that
	// reaches it is stopped.
	OutputLimitMiB int
	// TrustedCAPEM is trustedCAFile's content: certificates the sessions'
	// proxies trust, besides the system's store, for the hosts secrets are
	// sent to (a private gateway's CA).
	TrustedCAPEM string
	// Warnings are reported once at startup: unknown and retired keys.
	Warnings []string
}

// Default is the configuration with no config.json: every strategy offered.
func Default() *Config {
	c := &Config{
		Offered:        map[strategy.Name]bool{},
		OffReason:      map[strategy.Name]string{},
		VM:             DefaultVM,
		LogLevel:       "info",
		OutputLimitMiB: session.DefaultOutputLimitMiB,
	}
	for _, n := range strategy.All {
		c.Offered[n] = true
	}
	return c
}

// Load reads the config file at path. A missing file is the default
// configuration unless mustExist (an explicit --config) is set.
func Load(path string, mustExist bool) (*Config, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) && !mustExist {
		return Default(), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	c, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	c.Path = path
	return c, nil
}

// RequireSandbox turns host off, as --require-sandbox does.
func (c *Config) RequireSandbox(why string) {
	c.Offered[strategy.Host] = false
	c.OffReason[strategy.Host] = why
}

// Parse reads and validates a config document.
func Parse(data []byte) (*Config, error) {
	c := Default()
	if len(bytes.TrimSpace(data)) == 0 {
		return c, nil
	}
	var top map[string]any
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	if err := dec.Decode(&top); err != nil {
		return nil, syntaxError(data, err)
	}
	if dec.More() {
		return nil, errors.New("invalid JSON: more than one value")
	}
	if top == nil {
		return nil, errors.New("want a JSON object at the top")
	}
	p := parser{c: c}
	for _, key := range sortedKeys(top) {
		v := top[key]
		switch key {
		case "sandbox":
			p.sandbox(v)
		case "security":
			p.security(v)
		case "socketGroup":
			c.SocketGroup = p.str("socketGroup", v)
		case "logLevel":
			c.LogLevel = p.oneOf("logLevel", v, "debug", "info", "warn", "error")
		case "outputLimitMiB":
			c.OutputLimitMiB = p.integer("outputLimitMiB", v, 1, 1<<20)
		case "trustedCAFile":
			c.TrustedCAPEM = p.caFile("trustedCAFile", v)
		default:
			p.unknown(key)
		}
	}
	if p.err != nil {
		return nil, p.err
	}
	return c, nil
}

// parser keeps the first error, so each rule reads as one line.
type parser struct {
	c   *Config
	err error
}

func (p *parser) fail(key, format string, args ...any) {
	if p.err == nil {
		p.err = fmt.Errorf("%s: %s", key, fmt.Sprintf(format, args...))
	}
}

func (p *parser) unknown(key string) {
	p.c.Warnings = append(p.c.Warnings, fmt.Sprintf("config: unknown key %s (ignored)", key))
}

func (p *parser) sandbox(v any) {
	obj, ok := v.(map[string]any)
	if !ok {
		p.fail("sandbox", "want an object such as {\"host\": true, \"srt\": true, \"microsandbox\": true}, got %s", describe(v))
		return
	}
	for _, key := range sortedKeys(obj) {
		v := obj[key]
		switch key {
		case "host":
			p.host(v)
		case "srt":
			p.srt(v)
		case "microsandbox":
			p.microsandbox(v)
		case "backend":
			s := p.oneOf("sandbox.backend", v, "srt", "microsandbox")
			if s != "" {
				p.c.Backend = strategy.Name(s)
			}
			p.c.Warnings = append(p.c.Warnings, "config: sandbox.backend is retired: every strategy is offered as the sandbox object says, "+
				"and backend only picks the sandbox for agents that had Run in sandbox on. Remove it from config.json.")
		default:
			p.unknown("sandbox." + key)
		}
	}
}

func (p *parser) offer(n strategy.Name, on bool) {
	p.c.Offered[n] = on
	if on {
		delete(p.c.OffReason, n)
	} else {
		p.c.OffReason[n] = fmt.Sprintf("sandbox.%s is off on this daemon", n)
	}
}

func (p *parser) host(v any) {
	switch v := v.(type) {
	case bool:
		p.offer(strategy.Host, v)
		return
	case map[string]any:
		p.offer(strategy.Host, true)
		for _, key := range sortedKeys(v) {
			name := "sandbox.host." + key
			switch key {
			case "user":
				p.c.Host.User = p.str(name, v[key])
				if !userName().MatchString(p.c.Host.User) && p.err == nil {
					p.fail(name, "want the name of an account such as \"agentconnect\", got %q", p.c.Host.User)
				}
			default:
				p.unknown(name)
			}
		}
		return
	}
	p.fail("sandbox.host", "want true, false or an object of host settings such as {\"user\": \"agentconnect\"}, got %s", describe(v))
}

// userName is an account name as useradd takes it.
// Compiled when first used, not at every start of the binary.
var userName = sync.OnceValue(func() *regexp.Regexp { return regexp.MustCompile(`^[a-z_][a-z0-9_.-]{0,31}$`) })

func (p *parser) srt(v any) {
	switch v := v.(type) {
	case bool:
		p.offer(strategy.SRT, v)
		return
	case map[string]any:
		p.offer(strategy.SRT, true)
		for _, key := range sortedKeys(v) {
			name := "sandbox.srt." + key
			switch key {
			case "resolver":
				p.c.SRT.Resolver = p.resolver(name, v[key])
			default:
				p.unknown(name)
			}
		}
		return
	}
	p.fail("sandbox.srt", "want true, false or an object of srt settings, got %s", describe(v))
}

// resolver reads a DNS server address, "IP:port".
func (p *parser) resolver(name string, v any) string {
	r := p.str(name, v)
	if _, err := netip.ParseAddrPort(r); err != nil && p.err == nil {
		p.fail(name, "want an IP address and port such as \"127.0.0.1:53\", got %q", r)
	}
	return r
}

func (p *parser) microsandbox(v any) {
	switch v := v.(type) {
	case bool:
		p.offer(strategy.Microsandbox, v)
		return
	case map[string]any:
		p.offer(strategy.Microsandbox, true)
		vm := &p.c.VM
		for _, key := range sortedKeys(v) {
			name := "sandbox.microsandbox." + key
			switch key {
			case "cpus":
				vm.CPUs = p.integer(name, v[key], 1, 256)
			case "memoryMiB":
				vm.MemoryMiB = p.integer(name, v[key], 128, 1<<20)
			case "diskGiB":
				vm.DiskGiB = p.integer(name, v[key], 1, 16384)
			case "image":
				vm.Image = p.str(name, v[key])
				if vm.Image == "" && p.err == nil {
					p.fail(name, "want an image reference; delete the key to use the default image")
				}
			case "accelerator":
				vm.Accelerator = p.oneOf(name, v[key], "kvm", "tcg")
			case "transport":
				vm.Transport = p.oneOf(name, v[key], "vsock", "serial")
			case "tcgCacheMiB":
				vm.TCGCacheMiB = p.integer(name, v[key], 16, 4096)
			case "resolver":
				vm.Resolver = p.resolver(name, v[key])
			default:
				p.unknown(name)
			}
		}
		return
	}
	p.fail("sandbox.microsandbox", "want true, false or an object of VM settings, got %s", describe(v))
}

func (p *parser) security(v any) {
	obj, ok := v.(map[string]any)
	if !ok {
		p.fail("security", "want an object, got %s", describe(v))
		return
	}
	for _, key := range sortedKeys(obj) {
		switch key {
		case "requireSandbox":
			if p.boolean("security.requireSandbox", obj[key]) {
				p.c.RequireSandbox("security.requireSandbox turns host off on this daemon")
			}
			p.c.Warnings = append(p.c.Warnings, "config: security.requireSandbox is retired: requireSandbox: true is read as "+
				"\"sandbox\": {\"host\": false}. Remove it from config.json and set sandbox.host instead.")
		default:
			p.unknown("security." + key)
		}
	}
}

func (p *parser) boolean(key string, v any) bool {
	b, ok := v.(bool)
	if !ok {
		p.fail(key, "want true or false, got %s", describe(v))
	}
	return b
}

// caFile reads a PEM file of CA certificates named by key.
func (p *parser) caFile(key string, v any) string {
	path := p.str(key, v)
	if path == "" {
		return ""
	}
	data, err := os.ReadFile(path)
	if err != nil {
		p.fail(key, "%v", err)
		return ""
	}
	// PEM blocks only: crypto/x509 would weigh on every binary that reads
	// the config (the VM shim among them); agentconnect-inject parses them.
	if block, _ := pem.Decode(data); block == nil || block.Type != "CERTIFICATE" {
		p.fail(key, "%s holds no PEM certificate (-----BEGIN CERTIFICATE-----)", path)
		return ""
	}
	return string(data)
}

func (p *parser) str(key string, v any) string {
	s, ok := v.(string)
	if !ok {
		p.fail(key, "want a string, got %s", describe(v))
	}
	return s
}

func (p *parser) oneOf(key string, v any, allowed ...string) string {
	s, ok := v.(string)
	for _, a := range allowed {
		if ok && s == a {
			return s
		}
	}
	p.fail(key, "want %s, got %s", strings.Join(quoteAll(allowed), " or "), describe(v))
	return ""
}

func (p *parser) integer(key string, v any, lo, hi int64) int {
	n, ok := v.(json.Number)
	i, err := n.Int64()
	if !ok || err != nil || i < lo || i > hi {
		p.fail(key, "want a whole number from %d to %d, got %s", lo, hi, describe(v))
		return 0
	}
	return int(i)
}

func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return fmt.Sprintf("%t", v)
	case string:
		return fmt.Sprintf("the string %q", v)
	case json.Number:
		return v.String()
	case []any:
		return "a list"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%v", v)
}

func quoteAll(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = fmt.Sprintf("%q", s)
	}
	return out
}

func sortedKeys(m map[string]any) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	return keys
}

// syntaxError names the line and column of a JSON syntax error.
func syntaxError(data []byte, err error) error {
	var se *json.SyntaxError
	var te *json.UnmarshalTypeError
	off := int64(-1)
	switch {
	case errors.As(err, &se):
		off = se.Offset
	case errors.As(err, &te):
		return errors.New("want a JSON object at the top")
	}
	if off < 0 {
		return fmt.Errorf("invalid JSON: %w", err)
	}
	line, col := 1, 1
	for _, b := range data[:min(int(off), len(data))] {
		if b == '\n' {
			line, col = line+1, 1
		} else {
			col++
		}
	}
	return fmt.Errorf("invalid JSON at line %d, column %d: %w", line, col, err)
}
