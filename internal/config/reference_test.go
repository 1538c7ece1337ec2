package config

import (
	"encoding/json"
	"go/ast"
	goparser "go/parser"
	"go/token"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// docKey is a key row of docs/config.md: | `KEY` | ...
var docKey = regexp.MustCompile("(?m)^\\| `([A-Za-z.]+)` \\|")

// TestConfigReference: docs/config.md documents every key the parser reads,
// and every key it documents is one the parser reads.
func TestConfigReference(t *testing.T) {
	data, err := os.ReadFile("../../docs/config.md")
	if err != nil {
		t.Fatal(err)
	}
	var documented []string
	for _, m := range docKey.FindAllStringSubmatch(string(data), -1) {
		documented = append(documented, m[1])
	}
	if len(documented) == 0 {
		t.Fatal("docs/config.md has no key rows (| `KEY` | ...)")
	}
	known := parserKeys(t)
	for _, k := range known {
		if !slices.Contains(documented, k) {
			t.Errorf("config key %s is read by the parser and not in docs/config.md: add its row", k)
		}
	}
	for _, k := range documented {
		if !slices.Contains(known, k) {
			t.Errorf("docs/config.md documents %s, which the parser does not read: remove the row, or fix its name", k)
		}
		// And the parser, run: a key it knows is never "unknown", whatever
		// its value.
		c, err := Parse(nest(k))
		if err == nil && slices.ContainsFunc(c.Warnings, func(w string) bool { return strings.Contains(w, "unknown key "+k+" ") }) {
			t.Errorf("docs/config.md documents %s, and Parse says it is unknown", k)
		}
	}
}

// nest is a document that sets key (a.b.c) to null.
func nest(key string) []byte {
	var v any
	parts := strings.Split(key, ".")
	for i := len(parts) - 1; i >= 0; i-- {
		v = map[string]any{parts[i]: v}
	}
	b, _ := json.Marshal(v)
	return b
}

// parserKeys reads the keys from config.go itself: each switch over a key
// whose default case calls p.unknown(PREFIX + key) (or p.unknown(name), name
// being PREFIX + key) knows PREFIX + each case's string. Keys that take an
// object as well as a value (sandbox.host) are the prefixes' own.
func parserKeys(t *testing.T) []string {
	fset := token.NewFileSet()
	f, err := goparser.ParseFile(fset, "config.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var keys []string
	add := func(k string) {
		if k != "" && !slices.Contains(keys, k) {
			keys = append(keys, k)
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		loop, ok := n.(*ast.RangeStmt)
		if !ok {
			return true
		}
		prefixOf := map[string]string{} // name := "prefix." + key
		for _, st := range loop.Body.List {
			if as, ok := st.(*ast.AssignStmt); ok && len(as.Lhs) == 1 && len(as.Rhs) == 1 {
				if id, ok := as.Lhs[0].(*ast.Ident); ok {
					if p, ok := prefix(as.Rhs[0], nil); ok {
						prefixOf[id.Name] = p
					}
				}
			}
			sw, ok := st.(*ast.SwitchStmt)
			if !ok {
				continue
			}
			pre, found := "", false
			var cases []string
			for _, cc := range sw.Body.List {
				clause := cc.(*ast.CaseClause)
				if clause.List == nil { // default: p.unknown(...)
					for _, s := range clause.Body {
						if call, ok := s.(*ast.ExprStmt); ok {
							if ce, ok := call.X.(*ast.CallExpr); ok && isMethod(ce, "unknown") && len(ce.Args) == 1 {
								pre, found = prefix(ce.Args[0], prefixOf)
							}
						}
					}
					continue
				}
				for _, e := range clause.List {
					if lit, ok := e.(*ast.BasicLit); ok && lit.Kind == token.STRING {
						s, _ := strconv.Unquote(lit.Value)
						cases = append(cases, s)
					}
				}
			}
			if !found {
				continue
			}
			for _, c := range cases {
				add(pre + c)
			}
		}
		return true
	})
	if len(keys) == 0 {
		t.Fatal("found no keys in config.go: the switches this test reads have changed shape; update parserKeys")
	}
	slices.Sort(keys)
	return keys
}

// prefix reads "lit" + key as "lit", key as "", and a name prefixOf knows.
func prefix(e ast.Expr, prefixOf map[string]string) (string, bool) {
	switch e := e.(type) {
	case *ast.Ident:
		if e.Name == "key" {
			return "", true
		}
		p, ok := prefixOf[e.Name]
		return p, ok
	case *ast.BinaryExpr:
		lit, ok := e.X.(*ast.BasicLit)
		id, ok2 := e.Y.(*ast.Ident)
		if ok && ok2 && e.Op == token.ADD && lit.Kind == token.STRING && id.Name == "key" {
			s, _ := strconv.Unquote(lit.Value)
			return s, true
		}
	}
	return "", false
}

func isMethod(ce *ast.CallExpr, name string) bool {
	sel, ok := ce.Fun.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == name
}
