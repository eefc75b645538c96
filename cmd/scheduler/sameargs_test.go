package main

import "testing"

// The schema a worker announces for
//
//	struct {
//		N     int               `json:"n"`
//		Ratio float64           `json:"ratio"`
//		Name  string            `json:"name"`
//		Tags  []string          `json:"tags"`
//		Opts  struct{ On bool } `json:"opts"`
//		Extra map[string]int    `json:"extra"`
//	}
const schema = `{"type": "object", "additionalProperties": false, "properties": {
	"n": {"type": "integer"}, "ratio": {"type": "number"}, "name": {"type": "string"},
	"tags": {"type": "array", "items": {"type": "string"}},
	"opts": {"type": "object", "additionalProperties": false, "properties": {"On": {"type": "boolean"}}},
	"extra": {"type": "object", "additionalProperties": {"type": "integer"}}}}`

func TestArgsThatMeanTheSameAreTheSameHoweverWritten(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{`{"n": 1, "tags": ["a"]}`, `{ "tags": ["a"], "n": 1 }`},
		{`null`, `{}`},
		{``, `{"n": 0, "name": "", "opts": {"On": false}, "tags": [], "extra": {}}`},
		{`{"n": 1}`, `{"N": 1, "ratio": null}`},
		{`{"ratio": 1.5}`, `{"ratio": 1.50}`},
		{`{"ratio": 1000}`, `{"ratio": 1e3}`},
	} {
		if !sameArgs([]byte(schema), []byte(tc.a), []byte(tc.b)) {
			t.Errorf("sameArgs(%s, %s) = false, want true", tc.a, tc.b)
		}
	}
}

func TestArgsThatMeanOtherwiseDiffer(t *testing.T) {
	for _, tc := range []struct{ a, b string }{
		{`{"n": 1}`, `{"n": 2}`},
		{`{"n": 1}`, `{}`},
		{`{"tags": ["a", "b"]}`, `{"tags": ["b", "a"]}`},
		{`{"extra": {"k": 0}}`, `{"extra": {}}`}, // a map's key is data
		{`{"opts": {"On": true}}`, `{"opts": {}}`},
	} {
		if sameArgs([]byte(schema), []byte(tc.a), []byte(tc.b)) {
			t.Errorf("sameArgs(%s, %s) = true, want false", tc.a, tc.b)
		}
	}
	// With no schema announced, a left-out field is not known to be zero.
	if sameArgs(nil, []byte(`{"n": 0}`), []byte(`{}`)) {
		t.Errorf(`sameArgs with no schema: {"n": 0} and {} are the same, want not known to be`)
	}
	if !sameArgs(nil, []byte(`null`), []byte(`{}`)) || !sameArgs(nil, []byte(`{"a":1,"b":2}`), []byte(`{"b": 2, "a": 1}`)) {
		t.Errorf("sameArgs with no schema: want null and {} the same, and order forgiven")
	}
}
