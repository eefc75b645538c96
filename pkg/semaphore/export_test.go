package semaphore

// Script hashes, so that tests can inject faults into one script's calls.
var (
	AcquireScriptHash = scriptAcquire.Hash()
	ReleaseScriptHash = scriptRelease.Hash()
	RefreshScriptHash = scriptRefresh.Hash()
)
