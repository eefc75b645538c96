package main

import "github.com/batchmr/batchmr/internal/argschema"

// checkArgs reports the first way args (JSON) do not fit the JSON Schema a
// job's workers announced for its arguments (mapreduce.JobInfo.ArgsSchema),
// or nil. It lets the scheduler refuse a misspelt field, a string for a
// number or a value out of a stated range where no live worker can check
// them first: a run of a job nobody runs now, and serve's --args at
// start-up. A live worker's check (the job's strict decoding and its
// Validate, through StartJSON) is the authority.
func checkArgs(schema, args []byte) error { return argschema.Check(schema, args) }
