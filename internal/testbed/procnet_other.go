//go:build !linux

package testbed

import "errors"

func localPortsTo(pid, port int) ([]int, error) {
	return nil, errors.New("finding a process's connections needs Linux's /proc")
}
