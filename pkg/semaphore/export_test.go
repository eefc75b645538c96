package semaphore

// ScriptID names one script both ways a client may call it, so that tests
// can inject faults into that script's calls.
type ScriptID struct{ Hash, Function string }

var (
	AcquireScript = ScriptID{scriptAcquire.eval.Hash(), scriptAcquire.function}
	ReleaseScript = ScriptID{scriptRelease.eval.Hash(), scriptRelease.function}
	RefreshScript = ScriptID{scriptRefresh.eval.Hash(), scriptRefresh.function}
)

// UsesFunctions reports whether s runs its scripts as functions.
func (s *Semaphore) UsesFunctions() bool { return s.scriptMode.Load() == modeFunctions }

// LibraryName is the name of this build's Redis function library.
var LibraryName = libraryName
