package mapreduce

import "errors"

var (
	// ErrUnknownJob is returned for a job name that neither this process
	// registered nor any worker announced in the catalogue.
	ErrUnknownJob = errors.New("unknown job")
	// ErrRunExists is returned by Start when a run with the same ID (the
	// same job and Key) already exists; the ID returned is that run's.
	ErrRunExists = errors.New("run already exists")
	// ErrRunActive is returned by Start and Retry when the job forbids
	// overlapping runs and another run of it has not ended.
	ErrRunActive = errors.New("another run of the job is still active")
	// ErrRunNotEnded is returned by Retry for a run that is still going:
	// only a failed or cancelled run can be resumed.
	ErrRunNotEnded = errors.New("run has not ended")
	// ErrRunSucceeded is returned by Retry for a run that succeeded: it has
	// nothing to re-run; start a new run instead.
	ErrRunSucceeded = errors.New("run already succeeded")
	// ErrRunNotFound is returned for a run ID Redis does not know: never
	// started, or expired after its retention.
	ErrRunNotFound = errors.New("run not found")
	// ErrRunEnded is returned by Cancel for a run that already succeeded
	// or failed.
	ErrRunEnded = errors.New("run already ended")
	// ErrInvalidArgs is returned by Start and StartJSON for arguments that
	// do not decode into the job's argument type or that its Validate
	// rejects; nothing is created.
	ErrInvalidArgs = errors.New("invalid arguments")
	// ErrHandedBack is wrapped by the error of a task that its worker
	// handed back without doing its work, to be offered again (to this
	// worker or another) without spending a retry: the worker does not run
	// the task's job, or it is stopping and the step had not got its first
	// permit. An Observer's step ends with it then; it is not a failure.
	// A Split, Map or Reduce may return an error wrapping it when this
	// worker cannot do the step and another may (worker.Database does, on
	// a worker without a database): the step is offered again 2.5–7.5 s
	// later, however often that happens, spending no retry.
	ErrHandedBack = errors.New("handed back")
	// ErrRunCancelled is the cause of the context of a Split, Map or
	// Reduce whose run was cancelled, and what emit returns then.
	ErrRunCancelled = errors.New("run cancelled")
)
