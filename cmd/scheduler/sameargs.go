package main

import (
	"bytes"
	"encoding/json"
	"math/big"
	"reflect"
	"slices"
	"strings"
)

// sameArgs reports whether two runs' arguments (JSON) mean the same to a
// job whose workers announced schema (mapreduce.JobInfo.ArgsSchema), as
// encoding/json decodes them into the job's type: however spaced or
// ordered, a field left out the same as its zero value or null, {} the
// same as none, field names whatever their case, numbers whatever their
// spelling. With no schema, only spacing, order and {} for none are
// forgiven. A
// pointer field's 0 and its absence count as the same: the schema does
// not tell them apart.
func sameArgs(schema, a, b []byte) bool {
	var s map[string]any
	if len(schema) > 0 {
		_ = json.Unmarshal(schema, &s)
	}
	va, okA := decodeArgs(a)
	vb, okB := decodeArgs(b)
	if !okA || !okB {
		return bytes.Equal(a, b)
	}
	if s == nil {
		return reflect.DeepEqual(va, vb) || isEmpty(va) && isEmpty(vb)
	}
	return reflect.DeepEqual(canonical(s, va), canonical(s, vb))
}

func decodeArgs(b []byte) (any, bool) {
	if len(bytes.TrimSpace(b)) == 0 {
		return nil, true
	}
	d := json.NewDecoder(bytes.NewReader(b))
	d.UseNumber()
	var v any
	return v, d.Decode(&v) == nil
}

// isEmpty reports whether v is null or {}.
func isEmpty(v any) bool {
	m, isObject := v.(map[string]any)
	return v == nil || isObject && len(m) == 0
}

// canonical returns v, described by schema s, with what does not change
// its decoded value taken out: zero values and nulls of a struct's fields,
// empty arrays and maps, and the spelling of numbers and field names. An
// empty struct becomes nil.
func canonical(s map[string]any, v any) any {
	switch v := v.(type) {
	case bool:
		if !v {
			return nil
		}
	case string:
		if v == "" {
			return nil
		}
	case json.Number:
		r, ok := new(big.Rat).SetString(v.String())
		if !ok {
			return v.String()
		}
		if r.Sign() == 0 {
			return nil
		}
		return r.RatString()
	case []any:
		if len(v) == 0 {
			return nil
		}
		items, _ := s["items"].(map[string]any)
		out := make([]any, len(v))
		for i, item := range v {
			out[i] = canonical(items, item)
		}
		return out
	case map[string]any:
		props, isStruct := s["properties"].(map[string]any)
		if !isStruct {
			// A map (or no schema): its keys are data, kept as written.
			more, _ := s["additionalProperties"].(map[string]any)
			out := make(map[string]any, len(v))
			for k, item := range v {
				out[k] = canonical(more, item)
			}
			if len(out) == 0 {
				return nil
			}
			return out
		}
		fields := make([]string, 0, len(props))
		for f := range props {
			fields = append(fields, f)
		}
		slices.Sort(fields)
		out := map[string]any{}
		for k, item := range v {
			field := k
			if _, ok := props[k]; !ok {
				if i := slices.IndexFunc(fields, func(f string) bool { return strings.EqualFold(f, k) }); i >= 0 {
					field = fields[i]
				}
			}
			ps, _ := props[field].(map[string]any)
			if c := canonical(ps, item); c != nil {
				out[field] = c
			}
		}
		if len(out) == 0 {
			return nil
		}
		return out
	}
	return v
}
