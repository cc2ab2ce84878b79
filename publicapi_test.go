package actionbus_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// publicPackages are the packages a user imports; what they export is
// documented by go doc, which shows no field of an internal type (an
// alias of one prints "type Skill = skills.Skill" and nothing more) and
// which the user cannot name.
var publicPackages = []string{".", "catalog", "client", "events", "executor", "actionbustest"}

// TestThePublicAPINamesNoInternalType: no exported declaration of a public
// package — an alias, a type's exported fields and methods, a function's
// parameters and results, a constant's or variable's type and value —
// names a type or value of an internal package.
func TestThePublicAPINamesNoInternalType(t *testing.T) {
	for _, dir := range publicPackages {
		t.Run(dir, func(t *testing.T) {
			files, err := filepath.Glob(filepath.Join(dir, "*.go"))
			require.NoError(t, err)
			require.NotEmpty(t, files, "package %s has Go files", dir)
			for _, path := range files {
				if strings.HasSuffix(path, "_test.go") {
					continue
				}
				for _, leak := range internalNames(t, path) {
					t.Errorf("%s", leak)
				}
			}
		})
	}
}

// TestInternalNamesFindsALeak keeps the check above honest: an alias of an
// internal type, an exported field of one and a function returning one are
// each found, and unexported uses are not.
func TestInternalNamesFindsALeak(t *testing.T) {
	src := `package p

import (
	"github.com/actionbus/actionbus/events"
	in "github.com/actionbus/actionbus/internal/actions"
)

type Alias = in.Mode
type S struct {
	Public  in.Definition
	private in.Definition
	Fine    events.Workflow
}
func New() (*in.Definition, error) { return nil, nil }
func hidden(in.Mode) {}
const C = in.ModeRead
`
	path := filepath.Join(t.TempDir(), "p.go")
	require.NoError(t, os.WriteFile(path, []byte(src), 0o600))
	leaks := internalNames(t, path)
	require.Len(t, leaks, 4, "%q", leaks)
	for i, name := range []string{"Alias", "S.Public", "New", "C"} {
		require.Contains(t, leaks[i], name+" names in.")
	}
}

// internalNames lists the exported declarations of the Go file at path
// that name an identifier of an internal package.
func internalNames(t *testing.T, path string) []string {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.SkipObjectResolution)
	require.NoError(t, err)
	internal := map[string]bool{} // local names of internal imports
	for _, imp := range f.Imports {
		p, err := strconv.Unquote(imp.Path.Value)
		require.NoError(t, err)
		if !strings.Contains(p, "/internal/") {
			continue
		}
		name := p[strings.LastIndex(p, "/")+1:]
		if imp.Name != nil {
			name = imp.Name.Name
		}
		internal[name] = true
	}
	var leaks []string
	check := func(what string, n ast.Node) {
		if n == nil {
			return
		}
		ast.Inspect(n, func(n ast.Node) bool {
			if sel, ok := n.(*ast.SelectorExpr); ok {
				if x, ok := sel.X.(*ast.Ident); ok && internal[x.Name] {
					leaks = append(leaks, fset.Position(sel.Pos()).String()+": "+what+" names "+x.Name+"."+sel.Sel.Name)
				}
			}
			return true
		})
	}
	checkType := func(name string, typ ast.Expr) {
		switch tt := typ.(type) {
		case *ast.StructType:
			for _, fld := range tt.Fields.List {
				if len(fld.Names) == 0 { // embedded: its fields are promoted
					check(name, fld.Type)
				}
				for _, n := range fld.Names {
					if n.IsExported() {
						check(name+"."+n.Name, fld.Type)
					}
				}
			}
		case *ast.InterfaceType:
			for _, m := range tt.Methods.List {
				if len(m.Names) == 0 || m.Names[0].IsExported() {
					check(name, m.Type)
				}
			}
		default:
			check(name, typ)
		}
	}
	for _, decl := range f.Decls {
		switch d := decl.(type) {
		case *ast.FuncDecl:
			if !d.Name.IsExported() || (d.Recv != nil && !exportedReceiver(d.Recv)) {
				continue
			}
			check(d.Name.Name, d.Type)
		case *ast.GenDecl:
			for _, spec := range d.Specs {
				switch s := spec.(type) {
				case *ast.TypeSpec:
					if s.Name.IsExported() {
						checkType(s.Name.Name, s.Type)
					}
				case *ast.ValueSpec:
					for i, n := range s.Names {
						if !n.IsExported() {
							continue
						}
						check(n.Name, s.Type)
						if i < len(s.Values) {
							check(n.Name, s.Values[i])
						}
					}
				}
			}
		}
	}
	return leaks
}

// exportedReceiver reports whether a method's receiver type is exported.
func exportedReceiver(recv *ast.FieldList) bool {
	typ := recv.List[0].Type
	if star, ok := typ.(*ast.StarExpr); ok {
		typ = star.X
	}
	if idx, ok := typ.(*ast.IndexExpr); ok {
		typ = idx.X
	}
	if idx, ok := typ.(*ast.IndexListExpr); ok {
		typ = idx.X
	}
	id, ok := typ.(*ast.Ident)
	return ok && id.IsExported()
}
