package outage

import "errors"

// Mark returns err marked as caused by cause, or nil for a nil err: a
// package that knows which server an error came from (pgsource's queries:
// Postgres) says so for CauseOf, as the error itself may not (a bare
// "unexpected EOF"). It says nothing of whether err is an outage's:
// callers decide that (mapreduce.IsTransient) before they ask CauseOf.
func Mark(err error, cause Cause) error {
	if err == nil {
		return nil
	}
	return &marked{err: err, cause: cause}
}

// CauseOf returns the cause of the outermost Mark in err's tree, or "".
func CauseOf(err error) Cause {
	var m *marked
	if errors.As(err, &m) {
		return m.cause
	}
	return ""
}

type marked struct {
	err   error
	cause Cause
}

func (m *marked) Error() string { return m.err.Error() }
func (m *marked) Unwrap() error { return m.err }
