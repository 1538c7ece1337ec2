package mountinfo

import "testing"

func TestUnescape(t *testing.T) {
	for in, want := range map[string]string{
		`/a\040b`: "/a b", `/plain`: "/plain", `/x\`: `/x\`, `/y\04`: `/y\04`,
		`/t\011u\012v\134w`: "/t\tu\nv\\w",
	} {
		if got := Unescape(in); got != want {
			t.Errorf("Unescape(%q) = %q, want %q", in, got, want)
		}
	}
}
