// Package rediserr classifies Redis client errors for the packages that
// retry them.
package rediserr

import (
	"context"
	"errors"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/redis/go-redis/v9"
)

// Transient reports whether err may go away by itself (the network, a
// failover, a server still loading), so that a caller keeps trying while
// its context lives. Anything else — wrong credentials, a key of the wrong
// type, a script error, a closed client — will not heal by retrying.
func Transient(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if errors.Is(err, redis.ErrClosed) {
		return false // the client was closed: nothing will reopen it
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, net.ErrClosed) {
		return true
	}
	// A reply of Redis's own starts with its code, also when a caller
	// wrapped it ("mapreduce: start …: READONLY …").
	msg := err.Error()
	reply := msg
	var re redis.Error
	if errors.As(err, &re) {
		reply = re.Error()
	} else if _, after, ok := strings.Cut(msg, asynqScriptError); ok {
		// asynq formats a script's error into its own text, the reply
		// last ("UNKNOWN: redis eval error: LOADING Redis is loading…"):
		// enqueues against a restarting Redis failed the split for good.
		reply = after
	}
	for _, prefix := range []string{"LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "MOVED", "ASK"} {
		if strings.HasPrefix(reply, prefix) {
			return true
		}
	}
	return strings.Contains(msg, "EOF") || strings.Contains(msg, "connection refused") ||
		strings.Contains(msg, "connection reset") || strings.Contains(msg, "broken pipe") ||
		strings.Contains(msg, "i/o timeout") || strings.Contains(msg, "pool timeout")
}

// asynqScriptError is what asynq (v0.26) puts before the error of one of
// its scripts, which it keeps only as text.
const asynqScriptError = "redis eval error: "

// Tx returns the error of a MULTI/EXEC transaction whose commands are
// cmds: when Redis refused a command as it was queued (over maxmemory,
// say), EXEC answers only "EXECABORT Transaction discarded because of
// previous errors", and the refusal that says why is the command's; Tx
// returns that one.
func Tx(cmds []redis.Cmder, err error) error {
	if err == nil || !strings.HasPrefix(err.Error(), "EXECABORT") {
		return err
	}
	for _, c := range cmds {
		if cerr := c.Err(); cerr != nil && !strings.HasPrefix(cerr.Error(), "EXECABORT") {
			return cerr
		}
	}
	return err
}

// StaleSlots reports whether err, from a command sent to a node of a
// Redis Cluster, says that the client's map of slots to primaries may be
// out of date: the node could not be reached or dropped the connection
// (dead, or on the far side of a partition), the cluster is down
// (CLUSTERDOWN: a primary is failing and not yet replaced), the slot moved
// (MOVED), or the node is a replica now (READONLY). The caller's own
// cancellation or deadline says nothing of the node.
func StaleSlots(err error) bool {
	if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, redis.ErrClosed) {
		return false
	}
	var netErr net.Error
	if errors.As(err, &netErr) || errors.Is(err, net.ErrClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE) {
		return true
	}
	if redis.IsClusterDownError(err) || redis.IsReadOnlyError(err) {
		return true
	}
	_, moved := redis.IsMovedError(err)
	return moved
}
