//go:build !linux

package testbed

import "errors"

func localPortsTo(pid, port int) ([]int, error) {
	return nil, errors.New("finding a process's connections needs Linux's /proc")
}

func pidWithArg(arg string) (int, error) {
	return 0, errors.New("finding a process by its arguments needs Linux's /proc")
}
