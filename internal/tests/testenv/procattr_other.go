//go:build !linux

package testenv

import "syscall"

// dieWithParent: only Linux can tie a child's life to its parent's; on
// other systems the test's cleanup stops the child.
func dieWithParent() *syscall.SysProcAttr { return nil }
