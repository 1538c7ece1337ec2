package vmagent

import (
	"reflect"
	"testing"
)

func TestParseCmdline(t *testing.T) {
	tests := []struct {
		cmdline string
		want    bootConfig
	}{
		{"console=ttyS0 quiet panic=-1", bootConfig{"serial", 1024}},
		{"console=ttyS0 agentconnect.transport=serial\n", bootConfig{"serial", 1024}},
		{"agentconnect.transport=vsock agentconnect.port=10789 quiet", bootConfig{"vsock", 10789}},
		{`root=/dev/vda init="/init x" agentconnect.port=2000`, bootConfig{"serial", 2000}},
		{"agentconnect.transport=vsock agentconnect.transport=serial", bootConfig{"serial", 1024}},
	}
	for _, tt := range tests {
		got, err := parseCmdline(tt.cmdline)
		if err != nil || got != tt.want {
			t.Errorf("parseCmdline(%q) = %+v, %v; want %+v, nil", tt.cmdline, got, err, tt.want)
		}
	}
	for _, bad := range []string{
		"agentconnect.transport=tcp",
		"agentconnect.transport=",
		"agentconnect.port=0",
		"agentconnect.port=-1",
		"agentconnect.port=4294967295",
		"agentconnect.port=4294967296",
		"agentconnect.port=http",
	} {
		if got, err := parseCmdline(bad); err == nil {
			t.Errorf("parseCmdline(%q) = %+v, nil; want an error", bad, got)
		}
	}
}

func TestSplitCmdline(t *testing.T) {
	tests := []struct {
		in   string
		want []string
	}{
		{"", nil},
		{"  a  b\n", []string{"a", "b"}},
		{`a="x y" b`, []string{"a=x y", "b"}},
		{`"a b"c d`, []string{"a bc", "d"}},
		{`x=""`, []string{"x="}},
	}
	for _, tt := range tests {
		if got := splitCmdline(tt.in); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("splitCmdline(%q) = %q, want %q", tt.in, got, tt.want)
		}
	}
}
