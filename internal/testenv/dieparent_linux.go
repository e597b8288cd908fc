package testenv

import (
	"os/exec"
	"syscall"
)

// DieWithParent makes the process cmd starts end with the test binary that
// starts it (SIGKILL when its parent thread ends): a test binary that times
// out panics without running the tests' cleanups, and left its servers
// running, holding their ports and temporary folders. Go ends a thread
// only when a goroutine locked to it exits, which the tests' goroutines
// never are, so the parent thread lives as long as the binary.
func DieWithParent(cmd *exec.Cmd) {
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.Pdeathsig = syscall.SIGKILL
}
