package main

import (
	"strings"
	"testing"
)

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

func TestArgsThatFitTheAnnouncedSchemaPass(t *testing.T) {
	for _, args := range []string{
		`null`, `{}`,
		`{"n": 1, "ratio": 1.5, "name": "x", "tags": ["a", "b"], "opts": {"On": true}, "extra": {"k": 2}}`,
		`{"N": 1, "opts": {"on": false}}`,                     // encoding/json matches names whatever their case
		`{"n": null, "tags": null, "opts": null, "ratio": 2}`, // null fits anything; an integer is a number
		`{"n": -3, "ratio": 1e3}`,
	} {
		if err := checkArgs([]byte(schema), []byte(args)); err != nil {
			t.Errorf("checkArgs(%s): %v, want nil", args, err)
		}
	}
	if err := checkArgs(nil, []byte(`{"anything": 1}`)); err != nil {
		t.Errorf("with no schema announced: %v, want nil (the worker checks)", err)
	}
}

func TestArgsThatDoNotFitTheSchemaAreRefusedNamingTheField(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{`{"pagesize": 1}`, `unknown field "pagesize" (its fields: extra, n, name, opts, ratio, tags)`},
		{`{"opts": {"Off": true}}`, `unknown field "Off" in field "opts" (its fields: On)`},
		{`{"n": "5"}`, `field "n" is a string ("5"), not an integer`},
		{`{"n": 1.5}`, `field "n" is a number (1.5), not an integer`},
		{`{"ratio": "x"}`, `field "ratio" is a string ("x"), not a number`},
		{`{"tags": ["a", 2]}`, `field "tags[1]" is a number (2), not a string`},
		{`{"extra": {"k": true}}`, `field "extra.k" is a boolean (true), not an integer`},
		{`[1, 2]`, `the value is an array, not an object`},
	} {
		err := checkArgs([]byte(schema), []byte(tc.args))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("checkArgs(%s): %v, want %q", tc.args, err, tc.want)
		}
	}
}
