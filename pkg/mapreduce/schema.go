package mapreduce

import (
	"encoding"
	"encoding/json"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/batchmr/batchmr/internal/argschema"
)

// argsSchema is the JSON Schema of an argument type, built once per type.
type argsSchema struct {
	json []byte
	// constrained is true when a jsonschema tag states a bound, an enum or
	// a required field: only then do workers check values against it.
	constrained bool
	// err names a malformed jsonschema tag.
	err error
}

var argsSchemas sync.Map // reflect.Type -> *argsSchema

// argsSchemaOf returns the schema of t, as workers announce it.
func argsSchemaOf(t reflect.Type) *argsSchema {
	if s, ok := argsSchemas.Load(t); ok {
		return s.(*argsSchema)
	}
	var b schemaBuilder
	s := &argsSchema{}
	s.json, _ = json.Marshal(b.schemaOf(t, 0))
	s.constrained, s.err = b.constrained, b.err
	argsSchemas.Store(t, s)
	return s
}

// schemaBuilder describes types as encoding/json encodes them, as a JSON
// Schema, so that a person starting a run from the command line sees which
// fields --args takes, and the scheduler can check them with no worker.
type schemaBuilder struct {
	constrained bool
	err         error
}

// schemaOf describes t. Types that encode themselves (json.Marshaler,
// encoding.TextMarshaler) are described as any value, except time.Time.
// Integers state the range of their Go type where it is narrower than
// JSON's: uint's minimum 0, int8's -128 to 127.
func (b *schemaBuilder) schemaOf(t reflect.Type, depth int) map[string]any {
	if depth > 8 {
		return map[string]any{}
	}
	if t == reflect.TypeFor[time.Time]() {
		return map[string]any{"type": "string", "format": "date-time"}
	}
	for _, custom := range []reflect.Type{reflect.TypeFor[json.Marshaler](), reflect.TypeFor[encoding.TextMarshaler](),
		reflect.TypeFor[json.Unmarshaler](), reflect.TypeFor[encoding.TextUnmarshaler]()} {
		if t.Implements(custom) || reflect.PointerTo(t).Implements(custom) {
			return map[string]any{} // decodes itself: any value
		}
	}
	if t == reflect.TypeFor[json.Number]() {
		return map[string]any{"type": "number"}
	}
	switch t.Kind() {
	case reflect.Pointer:
		return b.schemaOf(t.Elem(), depth+1)
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int8, reflect.Int16, reflect.Int32:
		bits := t.Bits()
		return map[string]any{"type": "integer", "minimum": -(1 << (bits - 1)), "maximum": 1<<(bits-1) - 1}
	case reflect.Uint8, reflect.Uint16, reflect.Uint32:
		return map[string]any{"type": "integer", "minimum": 0, "maximum": uint64(1)<<t.Bits() - 1}
	case reflect.Uint, reflect.Uint64, reflect.Uintptr:
		return map[string]any{"type": "integer", "minimum": 0}
	case reflect.Int, reflect.Int64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Slice, reflect.Array:
		if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": "string", "contentEncoding": "base64"}
		}
		return map[string]any{"type": "array", "items": b.schemaOf(t.Elem(), depth+1)}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": b.schemaOf(t.Elem(), depth+1)}
	case reflect.Struct:
		props := map[string]any{}
		var required []string
		b.addFields(t, props, &required, depth)
		s := map[string]any{"type": "object", "properties": props, "additionalProperties": false}
		if len(required) > 0 {
			s["required"] = required
		}
		return s
	}
	return map[string]any{}
}

// addFields adds a struct's JSON fields to props, embedded structs'
// fields inline, as encoding/json does, and those their jsonschema tag
// requires to required.
func (b *schemaBuilder) addFields(t reflect.Type, props map[string]any, required *[]string, depth int) {
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		if tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		ft := f.Type
		if ft.Kind() == reflect.Pointer {
			ft = ft.Elem()
		}
		if f.Anonymous && name == "" && ft.Kind() == reflect.Struct {
			b.addFields(ft, props, required, depth+1)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		if strings.Contains(","+opts+",", ",string,") {
			props[name] = map[string]any{} // quoted: a string holding the value
			continue
		}
		s := b.schemaOf(f.Type, depth+1)
		if c, ok := f.Tag.Lookup("jsonschema"); ok {
			req, err := constrain(s, c)
			if err != nil && b.err == nil {
				b.err = fmt.Errorf("field %s of %v: jsonschema tag %q: %w", f.Name, t, c, err)
			}
			if req {
				*required = append(*required, name)
			}
			b.constrained = b.constrained || req || hasAny(s, "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "enum")
		}
		props[name] = s
	}
}

// constrain adds to a field's schema s what its jsonschema tag states,
// in invopop/jsonschema's spelling: required, minimum=N, maximum=N,
// exclusiveMinimum=N, exclusiveMaximum=N, and enum=V once per value
// (a number for a number field). Other keys (title, description, …) are
// left to the tools that read them.
func constrain(s map[string]any, tag string) (required bool, err error) {
	typ, _ := s["type"].(string)
	var enum []any
	for _, part := range strings.Split(tag, ",") {
		key, val, _ := strings.Cut(strings.TrimSpace(part), "=")
		switch key {
		case "required":
			required = true
		case "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum":
			if typ != "integer" && typ != "number" {
				return required, fmt.Errorf("%s applies to numbers, and the field is not one", key)
			}
			if !isNumber(val) {
				return required, fmt.Errorf("%s=%s: write a number, e.g. %s=1", key, val, key)
			}
			s[key] = json.Number(val) // in place of its Go type's bound, if any
		case "enum":
			switch typ {
			case "integer", "number":
				if !isNumber(val) {
					return required, fmt.Errorf("enum=%s: the field is a number: write numbers", val)
				}
				enum = append(enum, json.Number(val))
			case "boolean":
				v, err := strconv.ParseBool(val)
				if err != nil {
					return required, fmt.Errorf("enum=%s: the field is a boolean: write true or false", val)
				}
				enum = append(enum, v)
			default:
				enum = append(enum, val)
			}
		}
	}
	if enum != nil {
		s["enum"] = enum
	}
	return required, nil
}

// isNumber reports whether s is a JSON number.
func isNumber(s string) bool {
	d := json.NewDecoder(strings.NewReader(s))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil || d.More() {
		return false
	}
	_, ok := v.(json.Number)
	return ok
}

// checkTags checks arguments against the bounds, enums and required fields
// of their type's jsonschema tags, as JSON encodes them.
func (j Job[A, P, R, O]) checkTags(a A) error {
	if c := j.Options.Codec; c != nil && c != JSON {
		return nil
	}
	s := argsSchemaOf(reflect.TypeFor[A]())
	if !s.constrained || s.err != nil {
		return nil
	}
	b, err := json.Marshal(a)
	if err != nil {
		return nil // not ours to report: encoding the arguments fails anyway
	}
	return argschema.Check(s.json, b)
}

// hasAny reports whether m has any of keys.
func hasAny(m map[string]any, keys ...string) bool {
	for _, k := range keys {
		if _, ok := m[k]; ok {
			return true
		}
	}
	return false
}
