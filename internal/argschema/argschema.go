// Package argschema checks a run's arguments (JSON) against the JSON
// Schema a job's workers announce for them, without the job's code: the
// scheduler refuses a misspelt field, a string for a number or a value out
// of a stated range where no live worker can run the job's Validate, and
// workers check the constraints of argument types' jsonschema tags.
//
// It knows the subset of JSON Schema that pkg/mapreduce emits: type,
// properties, additionalProperties, items, required, minimum, maximum,
// exclusiveMinimum, exclusiveMaximum and enum. It is never stricter than
// encoding/json's strict decoding into the job's type: null fits anything,
// and field names match whatever their case.
package argschema

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math/big"
	"slices"
	"strings"
)

// Check reports the first way args do not fit schema, or nil. Empty args
// are null, which decodes into an object as {} does; an empty schema, or
// one that is not a JSON object, is not judged.
func Check(schema, args []byte) error {
	if len(schema) == 0 {
		return nil
	}
	s, ok := decode(schema).(map[string]any)
	if !ok {
		return nil // not ours to judge: the worker checks the arguments too
	}
	var v any
	if len(bytes.TrimSpace(args)) > 0 {
		d := json.NewDecoder(bytes.NewReader(args))
		d.UseNumber()
		if err := d.Decode(&v); err != nil {
			return fmt.Errorf("not JSON: %w", err)
		}
	}
	if v == nil && s["type"] == "object" {
		v = map[string]any{} // the run's arguments are the zero value
	}
	return fits(s, v, "")
}

// decode decodes JSON keeping numbers exact, or returns nil.
func decode(b []byte) any {
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	if d.Decode(&v) != nil {
		return nil
	}
	return v
}

// fits checks v against schema s; path names v in messages.
func fits(s map[string]any, v any, path string) error {
	if v == nil {
		return nil
	}
	want, _ := s["type"].(string)
	ok := true
	switch want {
	case "boolean":
		_, ok = v.(bool)
	case "integer":
		n, isNum := v.(json.Number)
		ok = isNum && !strings.ContainsAny(n.String(), ".eE")
	case "number":
		_, ok = v.(json.Number)
	case "string":
		_, ok = v.(string)
	case "array":
		items, isArray := v.([]any)
		if ok = isArray; ok {
			is, _ := s["items"].(map[string]any)
			for i, item := range items {
				if err := fits(is, item, fmt.Sprintf("%s[%d]", path, i)); err != nil {
					return err
				}
			}
		}
	case "object":
		obj, isObject := v.(map[string]any)
		if ok = isObject; ok {
			return fitsObject(s, obj, path)
		}
	}
	if !ok {
		return fmt.Errorf("%s is %s, not %s", name(path), kind(v), article(want))
	}
	if n, isNum := v.(json.Number); isNum {
		if err := inRange(s, n, path); err != nil {
			return err
		}
	}
	return inEnum(s, v, path)
}

// inRange checks a number against the schema's bounds.
func inRange(s map[string]any, n json.Number, path string) error {
	x, ok := new(big.Rat).SetString(n.String())
	if !ok {
		return nil
	}
	for _, b := range []struct {
		key  string
		bad  func(cmp int) bool
		says string
	}{
		{"minimum", func(c int) bool { return c < 0 }, "under its minimum"},
		{"exclusiveMinimum", func(c int) bool { return c <= 0 }, "not over its exclusive minimum"},
		{"maximum", func(c int) bool { return c > 0 }, "over its maximum"},
		{"exclusiveMaximum", func(c int) bool { return c >= 0 }, "not under its exclusive maximum"},
	} {
		bound, isNum := s[b.key].(json.Number)
		if !isNum {
			continue
		}
		y, ok := new(big.Rat).SetString(bound.String())
		if ok && b.bad(x.Cmp(y)) {
			return fmt.Errorf("%s is %s, %s %s", name(path), n, b.says, bound)
		}
	}
	return nil
}

// inEnum checks v against the schema's enum, if it states one.
func inEnum(s map[string]any, v any, path string) error {
	enum, ok := s["enum"].([]any)
	if !ok {
		return nil
	}
	for _, e := range enum {
		if same(e, v) {
			return nil
		}
	}
	allowed := make([]string, len(enum))
	for i, e := range enum {
		b, _ := json.Marshal(e)
		allowed[i] = string(b)
	}
	return fmt.Errorf("%s is %s, not one of %s", name(path), kind(v), strings.Join(allowed, ", "))
}

// same compares two scalars, numbers by value.
func same(a, b any) bool {
	na, okA := a.(json.Number)
	nb, okB := b.(json.Number)
	if okA && okB {
		x, okX := new(big.Rat).SetString(na.String())
		y, okY := new(big.Rat).SetString(nb.String())
		return okX && okY && x.Cmp(y) == 0
	}
	return a == b
}

func fitsObject(s map[string]any, obj map[string]any, path string) error {
	props, _ := s["properties"].(map[string]any)
	fields := make([]string, 0, len(props))
	for f := range props {
		fields = append(fields, f)
	}
	slices.Sort(fields)
	// field is the property k names: encoding/json matches names whatever
	// their case.
	field := func(k string) string {
		if _, ok := props[k]; !ok {
			if i := slices.IndexFunc(fields, func(f string) bool { return strings.EqualFold(f, k) }); i >= 0 {
				return fields[i]
			}
		}
		return k
	}
	given := map[string]bool{}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
		if obj[k] != nil {
			given[field(k)] = true
		}
	}
	slices.Sort(keys)
	if required, ok := s["required"].([]any); ok {
		for _, r := range required {
			if f, _ := r.(string); f != "" && !given[f] {
				return fmt.Errorf("%s is missing: it is required", name(join(path, f)))
			}
		}
	}
	for _, k := range keys {
		if ps, ok := props[field(k)].(map[string]any); ok {
			if err := fits(ps, obj[k], join(path, k)); err != nil {
				return err
			}
			continue
		}
		switch more := s["additionalProperties"].(type) {
		case bool:
			if !more {
				known := "it takes none"
				if len(fields) > 0 {
					known = "its fields: " + strings.Join(fields, ", ")
				}
				if path != "" {
					return fmt.Errorf("unknown field %q in %s (%s)", k, name(path), known)
				}
				return fmt.Errorf("unknown field %q (%s)", k, known)
			}
		case map[string]any:
			if err := fits(more, obj[k], join(path, k)); err != nil {
				return err
			}
		}
	}
	return nil
}

func join(path, field string) string {
	if path == "" {
		return field
	}
	return path + "." + field
}

func name(path string) string {
	if path == "" {
		return "the value"
	}
	return fmt.Sprintf("field %q", path)
}

func kind(v any) string {
	switch v := v.(type) {
	case bool:
		return fmt.Sprintf("a boolean (%v)", v)
	case json.Number:
		return fmt.Sprintf("a number (%s)", v)
	case string:
		return fmt.Sprintf("a string (%.40q)", v)
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

func article(typ string) string {
	switch typ {
	case "integer", "array", "object":
		return "an " + typ
	case "number":
		return "a number"
	case "boolean":
		return "a boolean"
	}
	return "a " + typ
}
