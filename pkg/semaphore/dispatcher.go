package semaphore

import (
	"context"
	"errors"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// dispatchBlock is how long one BLPOP waits. Grants end it at once and Close
// pushes a message to end it; the timeout only bounds how long a dispatcher
// can miss a stop when Redis could not take Close's message.
const dispatchBlock = 5 * time.Second

// dispatch is the one goroutine per Semaphore that waits on this process's
// wake list and routes each grant to its local waiter. However many
// goroutines wait, the process blocks on one Redis connection.
func (s *Semaphore) dispatch() {
	defer s.wg.Done()
	backoff := 10 * time.Millisecond
	for {
		select {
		case <-s.stop:
			return
		default:
		}
		res, err := s.rdb.BLPop(context.Background(), dispatchBlock, s.wakeKey).Result()
		if errors.Is(err, redis.Nil) {
			continue
		}
		if errors.Is(err, redis.ErrClosed) {
			s.log.Warn("semaphore: the redis client was closed before the semaphore; waiters here will not be woken: call Semaphore.Close first")
			return
		}
		if err != nil {
			// A grant pushed while we cannot read it is not lost: it stays on
			// the list, and the watchdog's next refresh reports it too.
			s.log.Warn("semaphore: waiting for wake-ups failed, retrying", "error", err, "retry_in", backoff)
			select {
			case <-s.stop:
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		backoff = 10 * time.Millisecond
		token, value, ok := strings.Cut(res[1], " ")
		if !ok {
			continue // Close's wake-up: the loop head sees stop.
		}
		if value == "!" {
			s.reject(token)
			continue
		}
		fence, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			s.log.Warn("semaphore: malformed wake-up ignored", "message", res[1])
			continue
		}
		s.deliver(token, fence, time.Time{})
		runtime.Gosched() // the new holder runs before our next BLPOP is sent
	}
}
