// Package mountinfo reads what /proc/PID/mountinfo says.
package mountinfo

import (
	"strconv"
	"strings"
)

// Unescape undoes mountinfo's octal escapes: the kernel writes a blank,
// tab, newline and backslash in a path as \040, \011, \012 and \134, and
// any other byte as it is.
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
