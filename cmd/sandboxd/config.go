package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	_ "embed"

	"github.com/sandboxd/sandboxd/tools"
)

// configSchema is the JSON Schema of serve's configuration file, checked in
// as config.schema.json and served at /v1/config.schema.json. A test
// derives it from serveConfig and the types it holds, with their doc
// comments as descriptions, and fails when this copy differs ("go test
// ./cmd/sandboxd -run TestConfigSchema -update" writes it anew).
//
//go:embed config.schema.json
var configSchema []byte

// A configError is a configuration key that cannot be used as written. Path
// is the key's full path in the file ("policy.images",
// "tenants[1].tokens[0]"); Reason says what is wrong and what to write
// instead. Neither ever holds the value written: a tenant's token is a
// secret.
type configError struct {
	Path, Reason string
	// Meant, for an unknown key, is the full path of the known key it is
	// close to ("" when none is).
	Meant string
}

func (e *configError) Error() string {
	reason := e.Reason
	if e.Meant != "" {
		reason += fmt.Sprintf("; did you mean %q? (keys are case-sensitive)", e.Meant)
	}
	if e.Path == "" {
		return reason
	}
	return e.Path + ": " + reason
}

// decodeConfig decodes the JSON object data into v, a pointer to a struct,
// after checking it against v's type: keys are matched exactly (as JSON
// Schema matches them, not case-insensitively as encoding/json does), and
// the first unknown key or value of the wrong kind is a *configError naming
// its full path. A json.RawMessage field is not checked: its owner decodes
// it (see parseToolsConfig). An error never shows a value of the file, only
// its JSON kind.
func decodeConfig(data []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	var raw json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return &configError{Reason: "not JSON: " + syntaxReason(err)}
	}
	if dec.More() {
		return &configError{Reason: "more than one JSON value"}
	}
	if err := checkJSON("", raw, reflect.TypeOf(v).Elem()); err != nil {
		return err
	}
	dec = json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	return dec.Decode(v) // what checkJSON let through decodes
}

// syntaxReason is a JSON syntax error without the json package's prefix,
// with its offset.
func syntaxReason(err error) string {
	var se *json.SyntaxError
	if errors.As(err, &se) {
		return fmt.Sprintf("%s (at byte %d)", strings.TrimPrefix(se.Error(), "json: "), se.Offset)
	}
	return strings.TrimPrefix(err.Error(), "json: ")
}

var unmarshalerType = reflect.TypeFor[json.Unmarshaler]()

// checkJSON reports the first place raw, at path, does not fit t.
func checkJSON(path string, raw json.RawMessage, t reflect.Type) error {
	if string(raw) == "null" {
		return nil // leaves the field as it is, as encoding/json does
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(unmarshalerType) {
		// The type reads its own JSON (a duration, "all" or a list); its
		// errors say what it wants.
		if err := reflect.New(t).Interface().(json.Unmarshaler).UnmarshalJSON(raw); err != nil {
			return &configError{Path: path, Reason: err.Error()}
		}
		return nil
	}
	switch t.Kind() {
	case reflect.Struct:
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) != nil {
			return wantKind(path, "an object", raw)
		}
		fields := jsonFields(t)
		for _, key := range slices.Sorted(maps.Keys(obj)) {
			f, ok := fields[key]
			if !ok {
				return unknownKey(path, key, fields)
			}
			if err := checkJSON(join(path, key), obj[key], f.Type); err != nil {
				return err
			}
		}
		return nil
	case reflect.Map:
		var obj map[string]json.RawMessage
		if json.Unmarshal(raw, &obj) != nil {
			return wantKind(path, "an object", raw)
		}
		for _, key := range slices.Sorted(maps.Keys(obj)) {
			if err := checkJSON(join(path, key), obj[key], t.Elem()); err != nil {
				return err
			}
		}
		return nil
	case reflect.Slice, reflect.Array:
		var list []json.RawMessage
		if json.Unmarshal(raw, &list) != nil {
			return wantKind(path, "a list", raw)
		}
		for i, e := range list {
			if err := checkJSON(path+"["+strconv.Itoa(i)+"]", e, t.Elem()); err != nil {
				return err
			}
		}
		return nil
	case reflect.Interface:
		return nil
	}
	if json.Unmarshal(raw, reflect.New(t).Interface()) != nil {
		switch t.Kind() {
		case reflect.String:
			return wantKind(path, "a string", raw)
		case reflect.Bool:
			return wantKind(path, "true or false", raw)
		case reflect.Float32, reflect.Float64:
			return wantKind(path, "a number", raw)
		default:
			return wantKind(path, fmt.Sprintf("a whole number (%s)", t.Kind()), raw)
		}
	}
	return nil
}

// wantKind is the error of a value of the wrong kind: it names the kind found,
// never the value.
func wantKind(path, what string, raw json.RawMessage) error {
	got := "a number"
	switch raw[0] {
	case '"':
		got = "a string"
	case '{':
		got = "an object"
	case '[':
		got = "a list"
	case 't', 'f':
		got = "a boolean"
	}
	if got == "a number" && strings.HasPrefix(what, "a whole number") {
		got = "a number that is not one, or out of range"
	}
	return &configError{Path: path, Reason: "want " + what + ", got " + got}
}

// unknownKey is the error of a key that is not one of fields: it names the
// key meant when one is close, else lists them.
func unknownKey(path, key string, fields map[string]reflect.StructField) *configError {
	names := slices.Sorted(maps.Keys(fields))
	e := &configError{Path: join(path, key), Reason: "unknown key"}
	bestDist := 3 // suggest only a close key
	for _, n := range names {
		d := editDistance(strings.ToLower(key), strings.ToLower(n))
		if d < bestDist {
			e.Meant, bestDist = join(path, n), d
		}
	}
	if e.Meant == "" {
		e.Reason = "unknown key; the keys that may stand here are " + strings.Join(names, ", ")
	}
	return e
}

// jsonFields are t's fields by their JSON names, as encoding/json names
// them: the tag's name, else the Go name; fields of an untagged embedded
// struct count as the outer struct's.
func jsonFields(t reflect.Type) map[string]reflect.StructField {
	fields := map[string]reflect.StructField{}
	for _, f := range reflect.VisibleFields(t) {
		if !f.IsExported() {
			continue
		}
		tag, ok := f.Tag.Lookup("json")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" || f.Anonymous && !ok && f.Type.Kind() == reflect.Struct {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if had, dup := fields[name]; !dup || len(f.Index) < len(had.Index) {
			fields[name] = f // the shallower field wins, as in encoding/json
		}
	}
	return fields
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

// parseToolsConfig is tools.ParseConfig with the errors of decodeConfig:
// keys matched exactly, and every error a *configError whose path is the
// key's full path under at ("tools" in serve's file, "" in a file of tool
// options alone).
func parseToolsConfig(data []byte, at string) (tools.Config, error) {
	prefix := func(err error) error {
		var ce *configError
		if errors.As(err, &ce) {
			ce.Path = join(at, ce.Path)
			if ce.Meant != "" {
				ce.Meant = join(at, ce.Meant)
			}
		}
		return err
	}
	if err := decodeConfig(data, new(tools.Config)); err != nil {
		return tools.Config{}, prefix(err)
	}
	cfg, err := tools.ParseConfig(data)
	if err != nil {
		var oe *tools.OptionError
		if errors.As(err, &oe) {
			return tools.Config{}, &configError{Path: join(at, oe.Option), Reason: oe.Reason}
		}
		return tools.Config{}, prefix(&configError{Reason: err.Error()})
	}
	return cfg, nil
}
