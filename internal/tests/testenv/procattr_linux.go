package testenv

import "syscall"

// dieWithParent makes a child process get SIGKILL when the test binary
// dies, so that a killed test run leaves no server behind.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
