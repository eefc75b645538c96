package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// checkArgs reports the first way args (JSON) do not fit the JSON Schema a
// job's workers announced for its arguments (mapreduce.JobInfo.ArgsSchema),
// or nil. It lets the scheduler refuse a misspelt field or a string for a
// number where no live worker can check them first: a run of a job nobody
// runs now, and serve's --args at start-up. A live worker's check (the
// job's strict decoding and its Validate, through StartJSON) is the
// authority; this one is never stricter than encoding/json's strict
// decoding: null fits anything, and field names match whatever their case.
func checkArgs(schema, args []byte) error {
	if len(args) == 0 || len(schema) == 0 {
		return nil
	}
	var s map[string]any
	if json.Unmarshal(schema, &s) != nil {
		return nil // not ours to judge: the worker checks the arguments too
	}
	d := json.NewDecoder(bytes.NewReader(args))
	d.UseNumber()
	var v any
	if err := d.Decode(&v); err != nil {
		return fmt.Errorf("not JSON: %w", err)
	}
	return fits(s, v, "")
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
	return nil
}

func fitsObject(s map[string]any, obj map[string]any, path string) error {
	props, _ := s["properties"].(map[string]any)
	fields := make([]string, 0, len(props))
	for f := range props {
		fields = append(fields, f)
	}
	slices.Sort(fields)
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		field := k
		if _, ok := props[k]; !ok {
			// encoding/json matches field names whatever their case.
			if i := slices.IndexFunc(fields, func(f string) bool { return strings.EqualFold(f, k) }); i >= 0 {
				field = fields[i]
			}
		}
		if ps, ok := props[field].(map[string]any); ok {
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
