package console

import (
	"fmt"
	"unicode/utf8"
)

// clipAt is how many characters of a long value (arguments, a result, an
// error, a page descriptor) a page shows before "show all", as asynqmon
// does.
const clipAt = 200

// clipped is a value as the "clip" template shows it: whole when short,
// else its first clipAt characters with the whole value a click away.
type clipped struct {
	ID    string // the element holding the whole value; its <details> is ID-all
	Pre   bool   // <pre> (errors, results), else <code>
	Short string // the first clipAt characters, when Cut
	Full  string
	Cut   bool
	Len   int // characters
}

// clip returns v (a string, []byte or json.RawMessage) clipped for the
// element id.
func clip(id string, pre bool, v any) clipped {
	full := fmt.Sprintf("%s", v)
	c := clipped{ID: id, Pre: pre, Full: full, Len: utf8.RuneCountInString(full)}
	if c.Len > clipAt {
		c.Cut = true
		n := 0
		for i := range full {
			if n == clipAt {
				c.Short = full[:i]
				break
			}
			n++
		}
	}
	return c
}
