package testbed

import (
	"errors"
	"fmt"
	"syscall"
)

// Freeze stops the cluster's API server and agent where they are (SIGSTOP),
// as a cluster cut off from the others: its API server accepts connections
// and answers nothing, its agent neither advertises nor answers; its nodes
// and their containers run on. Thaw (SIGCONT) resumes both; Close thaws a
// frozen cluster first.
func (c *Cluster) Freeze() error {
	return c.freeze(syscall.SIGSTOP)
}

// Thaw resumes what Freeze stopped.
func (c *Cluster) Thaw() error {
	return c.freeze(syscall.SIGCONT)
}

func (c *Cluster) freeze(sig syscall.Signal) error {
	if c.env == nil {
		return fmt.Errorf("%s: no control plane", c.Name)
	}
	api, err := pidWithArg("--cert-dir=" + c.env.ControlPlane.GetAPIServer().CertDir)
	if err != nil {
		return fmt.Errorf("%s: the API server's process: %w", c.Name, err)
	}
	pids := []int{api}
	if c.Agent != nil && c.Agent.Running() {
		pids = append(pids, c.Agent.Pid())
	}
	var errs []error
	for _, pid := range pids {
		if err := syscall.Kill(pid, sig); err != nil {
			errs = append(errs, fmt.Errorf("%s: %s to %d: %w", c.Name, sig, pid, err))
		}
	}
	c.mu.Lock()
	c.frozen = sig == syscall.SIGSTOP
	c.mu.Unlock()
	return errors.Join(errs...)
}

// Frozen tells whether Freeze stopped the cluster and Thaw did not resume it.
func (c *Cluster) Frozen() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.frozen
}
