package argschema

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
		if err := Check([]byte(schema), []byte(args)); err != nil {
			t.Errorf("Check(%s): %v, want nil", args, err)
		}
	}
	if err := Check(nil, []byte(`{"anything": 1}`)); err != nil {
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
		err := Check([]byte(schema), []byte(tc.args))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%s): %v, want %q", tc.args, err, tc.want)
		}
	}
}

// The schema a worker announces for
//
//	struct {
//		PageSize int    `json:"page_size" jsonschema:"required,minimum=1,maximum=100000"`
//		Ratio    float64 `json:"ratio" jsonschema:"exclusiveMinimum=0,exclusiveMaximum=1"`
//		Mode     string `json:"mode" jsonschema:"enum=full,enum=delta"`
//		Level    uint8  `json:"level" jsonschema:"enum=1,enum=3"`
//	}
const bounded = `{"type": "object", "additionalProperties": false, "required": ["page_size"], "properties": {
	"page_size": {"type": "integer", "minimum": 1, "maximum": 100000},
	"ratio": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1},
	"mode": {"type": "string", "enum": ["full", "delta"]},
	"level": {"type": "integer", "minimum": 0, "maximum": 255, "enum": [1, 3]}}}`

func TestArgsWithinTheStatedBoundsPass(t *testing.T) {
	for _, args := range []string{
		`{"page_size": 1}`, `{"page_size": 100000, "ratio": 0.5, "mode": "delta", "level": 3}`,
		`{"Page_Size": 5}`, // encoding/json matches names whatever their case
		`{"page_size": 5, "mode": null, "ratio": null}`,
		`{"page_size": 5, "ratio": 1e-3}`,
	} {
		if err := Check([]byte(bounded), []byte(args)); err != nil {
			t.Errorf("Check(%s): %v, want nil", args, err)
		}
	}
}

func TestArgsOutOfTheStatedBoundsAreRefusedNamingTheFieldAndTheBound(t *testing.T) {
	for _, tc := range []struct{ args, want string }{
		{`{}`, `field "page_size" is missing: it is required`},
		{`null`, `field "page_size" is missing: it is required`},
		{``, `field "page_size" is missing: it is required`},
		{`{"page_size": null}`, `field "page_size" is missing: it is required`},
		{`{"page_size": -1}`, `field "page_size" is -1, under its minimum 1`},
		{`{"page_size": 100001}`, `field "page_size" is 100001, over its maximum 100000`},
		{`{"page_size": 5, "ratio": 0}`, `field "ratio" is 0, not over its exclusive minimum 0`},
		{`{"page_size": 5, "ratio": 1.0}`, `field "ratio" is 1.0, not under its exclusive maximum 1`},
		{`{"page_size": 5, "mode": "half"}`, `field "mode" is a string ("half"), not one of "full", "delta"`},
		{`{"page_size": 5, "level": 2}`, `field "level" is a number (2), not one of 1, 3`},
		{`{"page_size": 5, "level": 256}`, `field "level" is 256, over its maximum 255`},
	} {
		err := Check([]byte(bounded), []byte(tc.args))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Check(%s): %v, want %q", tc.args, err, tc.want)
		}
	}
}
