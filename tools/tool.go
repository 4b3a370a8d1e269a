package tools

import (
	"context"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"text/template"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/sandboxd/sandboxd/workspaceshell"
)

// A tool is one tool of the catalogue, as a value: its name and skill,
// what the model is told about it, the JSON Schemas of its arguments and of
// its structured result, both derived from Go types, and its handler. Each
// is made by newTool in the file of its handler and listed once, in
// catalogue order, in catalogue (catalogue.go). New picks a session's tools
// from that list, and the skills table, MCP's tools/list, `sandboxd tools
// --json` and the HTTP listing are built from the values.
type tool struct {
	name string
	// skill activates the tool: one of skillDefs', SkillWorkspaceShell,
	// SkillJournal, or "" for load_skill, which is always active.
	skill string
	// describe is the tool's description under a set's settings.
	describe func(s *Set) string
	// in is the argument schema. Descriptions of its properties that hold
	// {{…}} are templates over argText (texts), filled in for each set;
	// static is in as JSON when it has none.
	in     *jsonschema.Schema
	texts  map[string]*template.Template
	static json.RawMessage
	// out is the schema of the structured content: one of the result's
	// shapes, or an ErrorResult.
	out json.RawMessage
	// run decodes the arguments and calls the handler.
	run toolFunc
	// offered says whether a set of the tool's profile offers it (nil: it
	// does); readOnlyIf and journaledIf say whether it is read-only and
	// journaled under the set's settings (nil: it is not).
	offered, readOnlyIf, journaledIf func(s *Set) bool
	// omit names the arguments a set's settings leave out of the schema
	// (nil: none).
	omit func(s *Set) []string
	// companion, when set, is the tool this one is offered with (bash's
	// bash_output and bash_kill): it is not one of the profile's tools a
	// configuration names, but comes with its companion.
	companion string
}

// spec declares a tool whose arguments decode into In and whose structured
// result is an Out, the way the MCP SDK's AddTool[In, Out] does: In's JSON
// Schema is derived from its fields (json names; a field without omitempty
// is required; the jsonschema tag is the description, a text/template over
// argText), Out's from its type.
type spec[In, Out any] struct {
	name, skill string
	describe    func(s *Set) string
	// handle runs one call with its decoded arguments. A Result that is not
	// an error carries an Out as Structured.
	handle func(s *Set, ctx context.Context, p In, c *call) (Result, error)
	// constrain adds to the properties of In's schema what its Go type does
	// not say: bounds, enums, a least number of items. A call is held to
	// the bounds there (checkBounds); handlers do not check them again.
	constrain func(props map[string]*jsonschema.Schema)
	// tolerate names arguments whose bounds the schema states for clients
	// but whose handler takes a value outside them as its default, rather
	// than refuse it (journal_list's limit 0).
	tolerate []string
	// variants are, when Out is an interface, the types that implement it
	// (as values): the result is one of their shapes.
	variants []any
	// offered, readOnly and journaled: see tool's offered, readOnlyIf,
	// journaledIf.
	offered, readOnly, journaled func(s *Set) bool
	// omit and companion: see tool's.
	omit      func(s *Set) []string
	companion string
}

// newTool makes a tool of a spec. It panics when a type has no JSON Schema
// or a description is not a valid template: the declarations are static,
// and every one is built when the package is initialised.
func newTool[In, Out any](sp spec[In, Out]) *tool {
	in, err := jsonschema.For[In](nil)
	if err != nil {
		panic(fmt.Sprintf("tool %s: %v", sp.name, err))
	}
	optionalNotNull(in)
	if sp.constrain != nil {
		sp.constrain(in.Properties)
	}
	t := &tool{
		name: sp.name, skill: sp.skill, describe: sp.describe, in: in, texts: map[string]*template.Template{},
		out:     mustJSON(resultSchema(reflect.TypeFor[Out](), sp.variants)),
		offered: sp.offered, readOnlyIf: sp.readOnly, journaledIf: sp.journaled,
		omit: sp.omit, companion: sp.companion,
	}
	for name, p := range in.Properties {
		if strings.Contains(p.Description, "{{") {
			t.texts[name] = template.Must(template.New(sp.name + "." + name).Funcs(textFuncs).Parse(p.Description))
		}
	}
	if len(t.texts) == 0 {
		t.static = mustJSON(in)
	}
	t.run = func(s *Set, ctx context.Context, args json.RawMessage, c *call) (Result, error) {
		var p In
		if err := decodeArgs(args, &p, func() []string { return t.argNames(s) }); err != nil {
			return Result{}, err
		}
		if err := checkBounds(in, args, sp.tolerate); err != nil {
			return Result{}, err
		}
		res, err := sp.handle(s, ctx, p, c)
		if err == nil && !res.IsError {
			if _, ok := res.Structured.(Out); !ok {
				return Result{}, fmt.Errorf("tool %s answered a %T, not its result type %v", sp.name, res.Structured, reflect.TypeFor[Out]())
			}
		}
		return res, err
	}
	return t
}

// args returns the tool's argument schema under s's settings.
func (t *tool) args(s *Set) json.RawMessage {
	var omit []string
	if t.omit != nil {
		omit = t.omit(s)
	}
	if t.static != nil && len(omit) == 0 {
		return t.static
	}
	in := t.in.CloneSchemas()
	for _, name := range omit {
		delete(in.Properties, name)
	}
	data := s.argText()
	for name, tmpl := range t.texts {
		if slices.Contains(omit, name) {
			continue
		}
		var b strings.Builder
		if err := tmpl.Execute(&b, data); err != nil {
			panic(fmt.Sprintf("tool %s: %v", t.name, err)) // a template names what argText has: tested
		}
		in.Properties[name].Description = b.String()
	}
	return mustJSON(in)
}

// argNames lists the arguments the tool takes under s's settings, sorted.
func (t *tool) argNames(s *Set) []string {
	var omit []string
	if t.omit != nil {
		omit = t.omit(s)
	}
	var out []string
	for name := range t.in.Properties {
		if !slices.Contains(omit, name) {
			out = append(out, name)
		}
	}
	slices.Sort(out)
	return out
}

// argText is what the description of an argument may name, as {{.Name}}:
// the settings (every field of Config) and what a set derives from them.
// {{seconds .BashTimeoutMs}} writes milliseconds as whole seconds.
type argText struct {
	Config
	// Root is the workspace root.
	Root string
	// Shell is what runs the bash tool's commands: "bash", or the
	// workspace's shell when it has no bash.
	Shell string
	// Executables are what workspace_exec runs: "any executable", or the
	// allowlist; ExecTimeoutMS is its default timeout, MaxExecTimeoutMS
	// the most a call may ask for.
	Executables      string
	ExecTimeoutMS    int64
	MaxExecTimeoutMS int64
}

var textFuncs = template.FuncMap{"seconds": func(ms int64) int64 { return ms / 1000 }}

func (s *Set) argText() argText {
	t := argText{Config: s.cfg, Root: s.root, Shell: "bash", Executables: "any executable",
		ExecTimeoutMS: s.shell.TimeoutMS(), MaxExecTimeoutMS: workspaceshell.MaxTimeoutMS}
	if sh := s.notBash(); sh != "" {
		t.Shell = sh + " (this workspace has no bash)"
	}
	if !s.shell.Commands.All {
		t.Executables = strings.Join(s.shell.Commands.Names, ", ")
	}
	return t
}

// optionalNotNull takes out the null that jsonschema.For allows for a
// pointer or a slice: an argument is given or left out, and the schema
// says the type it has when given (decoding still takes null as left out).
func optionalNotNull(s *jsonschema.Schema) {
	if s == nil {
		return
	}
	if len(s.Types) == 2 && s.Types[0] == "null" {
		s.Type, s.Types = s.Types[1], nil
	}
	for _, p := range s.Properties {
		optionalNotNull(p)
	}
	optionalNotNull(s.Items)
	optionalNotNull(s.AdditionalProperties)
}

// resultSchema is the schema of a tool's structured content: {"type":
// "object", "oneOf": [the result's shapes…, ErrorResult]}. A failed call's
// content is an ErrorResult (MCP's isError); the shapes do not overlap, as
// every one refuses properties it does not name.
func resultSchema(out reflect.Type, variants []any) *jsonschema.Schema {
	var shapes []reflect.Type
	if out.Kind() == reflect.Interface {
		for _, v := range variants {
			vt := reflect.TypeOf(v)
			if !reflect.PointerTo(vt).Implements(out) {
				panic(fmt.Sprintf("result variant %v does not implement %v", vt, out))
			}
			shapes = append(shapes, vt)
		}
	} else {
		shapes = append(shapes, out)
	}
	s := &jsonschema.Schema{Type: "object"}
	for _, t := range append(shapes, reflect.TypeFor[ErrorResult]()) {
		for t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		shape, err := jsonschema.ForType(t, nil)
		if err != nil {
			panic(fmt.Sprintf("result type %v: %v", t, err))
		}
		s.OneOf = append(s.OneOf, shape)
	}
	return s
}

func mustJSON(v any) json.RawMessage {
	data, err := json.Marshal(v)
	if err != nil {
		panic(err) // schemas of static types: cannot fail
	}
	return data
}

// lookupTool finds a tool of the catalogue by name.
func lookupTool(name string) *tool {
	i := slices.IndexFunc(catalogue, func(t *tool) bool { return t.name == name })
	if i < 0 {
		return nil
	}
	return catalogue[i]
}

// toolsOf names the tools of the catalogue whose skill is one of skills,
// in catalogue order.
func toolsOf(skills ...string) []string {
	var out []string
	for _, t := range catalogue {
		if slices.Contains(skills, t.skill) {
			out = append(out, t.name)
		}
	}
	return out
}

// checkBounds refuses an argument outside the bounds its property has in
// the argument schema (constrain): a bound is stated there once, for a
// client to read and for every call to be held to, and no handler checks
// it again. An argument left out or null, or one the tool tolerates, is
// not judged.
//
// Only a bounded property's argument is decoded: a tool with none (write,
// edit) costs no pass over its arguments, a 4 KB content among them.
func checkBounds(in *jsonschema.Schema, args json.RawMessage, tolerate []string) error {
	bounded := func(p *jsonschema.Schema) bool {
		return p != nil && (p.ExclusiveMinimum != nil || p.Minimum != nil || p.Maximum != nil)
	}
	if in == nil || !slices.ContainsFunc(slices.Collect(maps.Values(in.Properties)), bounded) {
		return nil
	}
	var fields map[string]json.RawMessage
	if json.Unmarshal(args, &fields) != nil {
		return nil // decodeArgs judged the shape
	}
	for _, name := range slices.Sorted(maps.Keys(fields)) {
		p, raw := in.Properties[name], fields[name]
		var v float64
		if !bounded(p) || string(raw) == "null" || slices.Contains(tolerate, name) || json.Unmarshal(raw, &v) != nil {
			continue
		}
		switch {
		case p.ExclusiveMinimum != nil && v <= *p.ExclusiveMinimum && *p.ExclusiveMinimum == 0:
			return invalid("%s must be positive, got %v", name, v)
		case p.ExclusiveMinimum != nil && v <= *p.ExclusiveMinimum:
			return invalid("%s must be above %v, got %v", name, *p.ExclusiveMinimum, v)
		case p.Minimum != nil && v < *p.Minimum && *p.Minimum == 0:
			return invalid("%s must not be negative, got %v", name, v)
		case p.Minimum != nil && v < *p.Minimum:
			return invalid("%s must be at least %v, got %v", name, *p.Minimum, v)
		case p.Maximum != nil && v > *p.Maximum:
			return invalid("%s must be at most %v, got %v", name, *p.Maximum, v)
		}
	}
	return nil
}

// minimum sets the least value of the named properties.
func minimum(props map[string]*jsonschema.Schema, min float64, names ...string) {
	for _, n := range names {
		props[n].Minimum = &min
	}
}

// yes is a readOnly, journaled or offered that always holds.
func yes(*Set) bool { return true }
