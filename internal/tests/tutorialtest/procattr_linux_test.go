package tutorialtest

import "syscall"

// dieWithTest makes a subprocess get SIGKILL when the test binary dies, so
// that a killed test run leaves no worker behind.
func dieWithTest() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
