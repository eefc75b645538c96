package semaphore

import "time"

// An Observer learns what one handle's callers do with the semaphore, for
// metrics (package metrics implements it). Its methods are called from the
// goroutines of those callers and of the handle's watchdog, never under a
// lock of the handle, and must return quickly: a slow Observer slows the
// Acquire, Release or refresh it is called from. They may be called
// concurrently, and must not panic: a panic in Granted unwinds an Acquire
// whose permit the handle then still holds and refreshes until Close.
//
// The calls are this process's view: a grant made by another process is
// observed there, not here. Every permit that Granted reports is later
// reported once by Released — after Release, or after Close took the
// permit back — and possibly before that by LeaseLost.
type Observer interface {
	// Granted reports that an Acquire (or TryAcquire) of weight returned a
	// permit after waiting for it (the whole call: queueing, Redis round
	// trips, retries through an outage).
	Granted(sem string, weight int, waited time.Duration)
	// Released reports that a permit of weight granted here was given
	// back after being held for held: by Release (whether or not its lease
	// was lost before) or by Close. It is called when the permit stops
	// being this process's, before Redis confirms the release.
	Released(sem string, weight int, held time.Duration)
	// LeaseLost reports that a permit of weight granted here lost its
	// lease before it was released: it was not refreshed in time, or Redis
	// no longer held it. It is called just before the holder's context is
	// cancelled with ErrLeaseLost.
	LeaseLost(sem string, weight int)
}
