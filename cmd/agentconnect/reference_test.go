package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

var update = flag.Bool("update", false, "write docs/cli.md from the commands (make docs)")

const cliReferencePath = "../../docs/cli.md"

// TestCLIReference: docs/cli.md is the commands' own help, every command and
// flag of it, so a flag added without its words, or a documented flag
// removed, fails here. make docs rewrites it.
func TestCLIReference(t *testing.T) {
	got := cliReference(newRootCommand())
	if *update {
		if err := os.WriteFile(cliReferencePath, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	data, err := os.ReadFile(cliReferencePath)
	if err != nil {
		t.Fatalf("%v: make docs writes it", err)
	}
	want := string(data)
	if got == want {
		return
	}
	gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < max(len(gl), len(wl)); i++ {
		g, w := "", ""
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			t.Fatalf("docs/cli.md does not match the commands from its line %d:\n  the commands: %q\n  docs/cli.md:  %q\nrun make docs, and commit docs/cli.md with the change", i+1, g, w)
		}
	}
}

// cliReference is the Markdown reference of root's command tree: each
// command with its description, usage, examples and flags; hidden commands
// and flags (the tests' own) are left out.
func cliReference(root *cobra.Command) string {
	var b strings.Builder
	b.WriteString("# Command reference\n\n")
	b.WriteString("Generated from the commands' own help by `make docs`; a test fails when it differs from the\ncode. `agentconnect COMMAND --help` prints the same.\n\n")
	b.WriteString("Every command takes the global flags:\n\n")
	flagTable(&b, root.PersistentFlags())
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		if c.Hidden || c.Name() == "help" || c.Name() == "completion" {
			return
		}
		fmt.Fprintf(&b, "## %s\n\n", c.CommandPath())
		text := c.Long
		if text == "" {
			text = c.Short
		}
		b.WriteString(strings.TrimSpace(text) + "\n\n")
		if c.Runnable() {
			fmt.Fprintf(&b, "```\n%s\n```\n\n", c.UseLine())
		}
		if len(c.Aliases) > 0 {
			fmt.Fprintf(&b, "Also: %s.\n\n", strings.Join(c.Aliases, ", "))
		}
		if c.Example != "" {
			fmt.Fprintf(&b, "Examples:\n\n```\n%s\n```\n\n", strings.Trim(c.Example, "\n"))
		}
		if c != root {
			flagTable(&b, c.LocalNonPersistentFlags())
		}
		if subs := visible(c.Commands()); len(subs) > 0 {
			b.WriteString("Commands:\n\n")
			for _, s := range subs {
				fmt.Fprintf(&b, "- `%s`: %s\n", s.CommandPath(), s.Short)
			}
			b.WriteString("\n")
		}
		for _, s := range c.Commands() {
			walk(s)
		}
	}
	walk(root)
	return strings.TrimRight(b.String(), "\n") + "\n"
}

func visible(cs []*cobra.Command) []*cobra.Command {
	var out []*cobra.Command
	for _, c := range cs {
		if !c.Hidden && c.Name() != "help" && c.Name() != "completion" {
			out = append(out, c)
		}
	}
	return out
}

// flagTable writes fs's visible flags as a table, or nothing.
func flagTable(b *strings.Builder, fs *pflag.FlagSet) {
	var rows []string
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Hidden || f.Name == "help" {
			return
		}
		name := "--" + f.Name
		if f.Shorthand != "" {
			name = "-" + f.Shorthand + ", " + name
		}
		if typ, _ := pflag.UnquoteUsage(f); typ != "" {
			name += " " + typ
		}
		usage := f.Usage
		if f.DefValue != "" && f.DefValue != "false" && f.DefValue != "[]" && f.DefValue != "0" {
			usage += fmt.Sprintf(" (default %s)", f.DefValue)
		}
		rows = append(rows, fmt.Sprintf("| `%s` | %s |", name, strings.ReplaceAll(usage, "|", "\\|")))
	})
	if len(rows) == 0 {
		return
	}
	b.WriteString("| flag | meaning |\n|---|---|\n")
	b.WriteString(strings.Join(rows, "\n") + "\n\n")
}
