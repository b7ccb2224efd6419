package testbed

import "syscall"

// sysProcAttr makes a subprocess die with the process that started it, so a
// test binary that crashes or times out leaves no broker or agent behind.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
