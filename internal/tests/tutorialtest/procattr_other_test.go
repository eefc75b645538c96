//go:build !linux

package tutorialtest

import "syscall"

// dieWithTest: only Linux ties a child's life to its parent's; elsewhere
// the test's cleanup stops the subprocesses.
func dieWithTest() *syscall.SysProcAttr { return nil }
