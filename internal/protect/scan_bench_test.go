package protect

import (
	"fmt"
	"os"
	"path/filepath"
	"testing"
)

// BenchmarkFindGitDirs scans a root of 17*17*17 directories three levels
// deep (the scan's depth), with no repository: what a start and a warm
// claim pay for a large workspace.
func BenchmarkFindGitDirs(b *testing.B) {
	ws := b.TempDir()
	for i := 0; i < 17; i++ {
		for j := 0; j < 17; j++ {
			for k := 0; k < 17; k++ {
				if err := os.MkdirAll(filepath.Join(ws, fmt.Sprint("d", i), fmt.Sprint("d", j), fmt.Sprint("d", k)), 0o755); err != nil {
					b.Fatal(err)
				}
			}
		}
	}
	dir, err := os.Open(ws)
	if err != nil {
		b.Fatal(err)
	}
	defer dir.Close()
	b.ResetTimer()
	for b.Loop() {
		if _, err := findGitDirs(Root{Host: ws, Dir: dir}); err != nil {
			b.Fatal(err)
		}
	}
}
