// Package procname names a process of the fleet as a semaphore handle
// calls it in Redis (its Process in Stats), so that the worker catalogue,
// which knows a worker by its host and pid, can be matched to it.
package procname

import (
	"fmt"
	"strings"
)

// Prefix is how the name of a handle opened by process pid on host
// begins: host-pid-, with the characters Redis keys and the catalogue
// treat specially (':', ' ', '{', '}') replaced by '_'.
func Prefix(host string, pid int) string {
	if host == "" {
		host = "host"
	}
	return strings.Map(func(r rune) rune {
		if r == ':' || r == ' ' || r == '{' || r == '}' {
			return '_'
		}
		return r
	}, fmt.Sprintf("%s-%d-", host, pid))
}
