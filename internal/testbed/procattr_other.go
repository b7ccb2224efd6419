//go:build !linux

package testbed

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
