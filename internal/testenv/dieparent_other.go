//go:build !linux

package testenv

import "os/exec"

// DieWithParent does nothing where the kernel offers no parent-death
// signal (Linux's Pdeathsig): the tests run on Linux (see
// dieparent_linux.go).
func DieWithParent(*exec.Cmd) {}
