package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/sandboxd/sandboxd/runner"
	"github.com/sandboxd/sandboxd/tools"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

var update = flag.Bool("update", false, "write config.schema.json anew from the Go types")

// TestConfigSchema derives the configuration's JSON Schema from serveConfig
// and the types it holds, with their doc comments as descriptions, and
// checks the copy checked in (and served) is that schema: a key added to
// the Go types without a new schema fails here.
func TestConfigSchema(t *testing.T) {
	got := deriveConfigSchema(t)
	if *update {
		if err := os.WriteFile("config.schema.json", got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if !bytes.Equal(got, configSchema) {
		t.Errorf("config.schema.json is not the schema of serveConfig: run go test ./cmd/sandboxd -run TestConfigSchema -update")
	}
}

// deriveConfigSchema is the JSON Schema of serveConfig, indented.
func deriveConfigSchema(t *testing.T) []byte {
	t.Helper()
	strOrList := &jsonschema.Schema{Types: []string{"string", "array"}, Items: &jsonschema.Schema{Type: "string"}}
	opts := &jsonschema.ForOptions{TypeSchemas: map[reflect.Type]*jsonschema.Schema{
		reflect.TypeFor[runner.Duration]():         {Types: []string{"string", "number"}},
		reflect.TypeFor[tools.Profiles]():          strOrList,
		reflect.TypeFor[workspaceshell.Commands](): strOrList,
	}}
	s, err := jsonschema.ForType(reflect.TypeFor[serveConfig](), opts)
	if err != nil {
		t.Fatal(err)
	}
	// "tools" is decoded by package tools, from its defaults.
	if s.Properties["tools"], err = jsonschema.ForType(reflect.TypeFor[tools.Config](), opts); err != nil {
		t.Fatal(err)
	}
	s.Schema = "https://json-schema.org/draft/2020-12/schema"
	s.Title = "sandboxd serve --config"
	d := describer{t: t, fset: token.NewFileSet(), pkgs: map[string]map[string]*ast.StructType{}}
	d.describe(s, reflect.TypeFor[serveConfig](), nil)
	d.describe(s.Properties["tools"], reflect.TypeFor[tools.Config](), nil)
	optional(s)
	s.Properties["tenants"].Items.Required = []string{"name", "tokens"}
	out, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(out, '\n')
}

// optional makes every key optional: the file leaves out what it does not
// change (jsonschema.For requires the fields without omitempty).
func optional(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	s.Required = nil
	for _, p := range s.Properties {
		optional(p)
	}
	optional(s.Items)
	optional(s.AdditionalProperties)
}

// describer sets a schema's descriptions from the doc comments of the Go
// fields its properties come from, read from this module's source.
type describer struct {
	t    *testing.T
	fset *token.FileSet
	pkgs map[string]map[string]*ast.StructType // package dir → type name → struct
}

// describe describes the properties of s, the schema of the struct type t,
// whose declaration is st (nil: find it by t's name in its package).
func (d *describer) describe(s *jsonschema.Schema, t reflect.Type, st *ast.StructType) {
	if st == nil {
		if st = d.structOf(t); st == nil {
			return // a type from outside this module keeps no descriptions
		}
	}
	fields := jsonFields(t)
	var shared *ast.CommentGroup // a comment above fields that it names together
	for _, f := range st.Fields.List {
		if len(f.Names) == 0 { // embedded: its fields are the struct's
			var name string
			switch ft := f.Type.(type) {
			case *ast.Ident:
				name = ft.Name
			case *ast.SelectorExpr: // of another package
				name = ft.Sel.Name
			}
			if ef, ok := t.FieldByName(name); ok && ef.Anonymous {
				d.describe(s, ef.Type, nil)
			}
			continue
		}
		doc := f.Doc
		if doc != nil {
			shared = doc
		} else if shared != nil && strings.Contains(shared.Text(), f.Names[0].Name) {
			doc = shared
		}
		for _, n := range f.Names {
			rf, ok := t.FieldByName(n.Name)
			if !ok {
				continue
			}
			name := jsonName(rf)
			p := s.Properties[name]
			if p == nil || fields[name].Name != n.Name {
				continue
			}
			p.Description = docText(doc, n.Name, name)
			// Describe the struct the property holds, directly or in a
			// list, a map or a pointer.
			ft, ps := rf.Type, p
			for {
				switch ft.Kind() {
				case reflect.Pointer:
					ft = ft.Elem()
					continue
				case reflect.Slice, reflect.Array:
					ft, ps = ft.Elem(), ps.Items
					continue
				case reflect.Map:
					ft, ps = ft.Elem(), ps.AdditionalProperties
					continue
				}
				break
			}
			if ft.Kind() == reflect.Struct && ps != nil && ps.Properties != nil {
				inner, _ := f.Type.(*ast.StructType) // an anonymous struct's fields are here
				d.describe(ps, ft, inner)
			}
		}
	}
}

// structOf finds the declaration of the named struct type t in this
// module's source.
func (d *describer) structOf(t reflect.Type) *ast.StructType {
	const module = "github.com/sandboxd/sandboxd"
	dir := "."
	if t.PkgPath() != "main" {
		rel, ok := strings.CutPrefix(t.PkgPath(), module+"/")
		if !ok {
			return nil
		}
		dir = filepath.Join("..", "..", rel)
	}
	types, ok := d.pkgs[dir]
	if !ok {
		types = map[string]*ast.StructType{}
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			d.t.Fatal(err)
		}
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(d.fset, file, nil, parser.ParseComments)
			if err != nil {
				d.t.Fatal(err)
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if ts, ok := n.(*ast.TypeSpec); ok {
					if st, ok := ts.Type.(*ast.StructType); ok {
						types[ts.Name.Name] = st
					}
				}
				return true
			})
		}
		d.pkgs[dir] = types
	}
	return types[t.Name()]
}

func jsonName(f reflect.StructField) string {
	name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
	if name == "" {
		return f.Name
	}
	return name
}

var space = regexp.MustCompile(`\s+`)

// docText is a field's doc comment as one paragraph, its first word, the
// Go name, written as the JSON key.
func docText(doc *ast.CommentGroup, goName, key string) string {
	if doc == nil {
		return ""
	}
	text := strings.TrimSpace(space.ReplaceAllString(doc.Text(), " "))
	if rest, ok := strings.CutPrefix(text, goName); ok && (rest == "" || strings.ContainsAny(rest[:1], " ,")) {
		text = key + rest
	}
	return text
}

// TestReadmeConfigExample: the complete example in README.md loads, the
// schema accepts it, serve starts on it, and the README's reference names
// every key of the schema but the tool options and the seccomp profile's
// (documented with their own).
func TestReadmeConfigExample(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, after, ok := strings.Cut(string(readme), "<!-- TestReadmeConfigExample -->\n```json\n")
	example, _, ok2 := strings.Cut(after, "```")
	if !ok || !ok2 {
		t.Fatal("README.md has no configuration example after <!-- TestReadmeConfigExample -->")
	}
	var c serveConfig
	if err := c.parse([]byte(example)); err != nil {
		t.Fatalf("the README's example: %v", err)
	}
	if len(c.Tenants) != 2 || len(c.Policy.Images) == 0 || len(c.Pools) == 0 {
		t.Errorf("the example lacks two tenants, allowed images or a pool: %+v", c)
	}

	var schema jsonschema.Schema
	if err := json.Unmarshal(configSchema, &schema); err != nil {
		t.Fatal(err)
	}
	resolved, err := schema.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	var instance any
	if err := json.Unmarshal([]byte(example), &instance); err != nil {
		t.Fatal(err)
	}
	if err := resolved.Validate(instance); err != nil {
		t.Errorf("the schema refuses the README's example: %v", err)
	}
	// The schema is no rubber stamp: it refuses a key the loader refuses.
	if err := resolved.Validate(map[string]any{"policy": map[string]any{"image": "x"}}); err == nil {
		t.Error("the schema accepts policy.image")
	}

	for key, p := range schema.Properties {
		keys := []string{key}
		if key != "tools" {
			for sub := range p.Properties {
				keys = append(keys, sub)
			}
			if p.Items != nil {
				for sub := range p.Items.Properties {
					keys = append(keys, sub)
				}
			}
		}
		for _, k := range keys {
			if !strings.Contains(string(readme), "`"+k+"`") && !strings.Contains(string(readme), `"`+k+`"`) {
				t.Errorf("README.md's configuration reference does not name %s (in %s)", k, key)
			}
		}
	}

	file := filepath.Join(t.TempDir(), "sandboxd.json")
	if err := os.WriteFile(file, []byte(example), 0o600); err != nil {
		t.Fatal(err)
	}
	startServe(t, "--config", file, "--backend", "memory")
}
