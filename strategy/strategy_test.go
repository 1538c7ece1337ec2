package strategy

import "testing"

func TestParse(t *testing.T) {
	for _, n := range All {
		got, err := Parse(string(n))
		if err != nil || got != n {
			t.Errorf("Parse(%q) = %q, %v; want %q, nil", n, got, err, n)
		}
	}
	for _, bad := range []string{"", "Host", "docker", "sandbox"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) succeeded, want an error", bad)
		}
	}
}
