package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// citedGoal is a goal row as the README cites it:
// - `MEASUREMENT` · `STAT` ≤ GOAL
var citedGoal = regexp.MustCompile("(?m)^- `([^`]+)` · `([^`]+)`")

// TestDocsCiteBenchRows: every goal row the README cites is a row of
// BENCHMARKS.md (which make bench writes) with a goal, so a row renamed or
// dropped from the bench fails here, not in a reader's hands.
func TestDocsCiteBenchRows(t *testing.T) {
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	table, err := os.ReadFile("../BENCHMARKS.md")
	if err != nil {
		t.Fatal(err)
	}
	goals := map[[2]string]string{} // measurement, stat → goal
	last := ""
	for _, line := range strings.Split(string(table), "\n") {
		cells := strings.Split(line, " | ")
		if len(cells) < 6 || !strings.HasPrefix(line, "| ") {
			continue
		}
		m := strings.TrimPrefix(cells[0], "| ")
		if m == "" {
			m = last
		}
		last = m
		goals[[2]string{m, cells[1]}] = cells[3]
	}
	cited := citedGoal.FindAllStringSubmatch(string(readme), -1)
	if len(cited) == 0 {
		t.Fatal("the README cites no goal row (- `MEASUREMENT` · `STAT` ...)")
	}
	for _, c := range cited {
		goal, ok := goals[[2]string{c[1], c[2]}]
		if !ok {
			t.Errorf("the README cites %q · %q, which BENCHMARKS.md does not have: run make bench, or fix the citation", c[1], c[2])
		} else if goal == "" {
			t.Errorf("the README cites %q · %q as a goal row, and BENCHMARKS.md gives it no goal", c[1], c[2])
		}
	}
}
