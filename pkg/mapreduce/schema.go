package mapreduce

import (
	"encoding"
	"encoding/json"
	"reflect"
	"strings"
	"time"
)

// schemaOf describes t as encoding/json encodes it, as a JSON Schema, so
// that a person starting a run from the command line sees which fields
// --args takes. Types that encode themselves (json.Marshaler,
// encoding.TextMarshaler) are described as any value, except time.Time.
func schemaOf(t reflect.Type, depth int) map[string]any {
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
		return schemaOf(t.Elem(), depth+1)
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return map[string]any{"type": "integer"}
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Slice, reflect.Array:
		if t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.Uint8 {
			return map[string]any{"type": "string", "contentEncoding": "base64"}
		}
		return map[string]any{"type": "array", "items": schemaOf(t.Elem(), depth+1)}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": schemaOf(t.Elem(), depth+1)}
	case reflect.Struct:
		props := map[string]any{}
		addFields(t, props, depth)
		return map[string]any{"type": "object", "properties": props, "additionalProperties": false}
	}
	return map[string]any{}
}

// addFields adds a struct's JSON fields to props, embedded structs'
// fields inline, as encoding/json does.
func addFields(t reflect.Type, props map[string]any, depth int) {
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
			addFields(ft, props, depth+1)
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
		props[name] = schemaOf(f.Type, depth+1)
	}
}
