//go:build linux

// Command pause is the test bed's pod sandbox image (rb.test/pause:3.10,
// containerd's sandbox_image): it holds the pod's namespaces open by doing
// nothing until SIGTERM or SIGINT, then exits 0. As PID 1 of a pod that
// shares its process namespace it is also the reaper of orphaned processes,
// so it waits for every child that exits (SIGCHLD).
package main

import (
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	sigs := make(chan os.Signal, 8)
	signal.Notify(sigs, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	// After Notify, so that whoever reads this line may signal us.
	if os.Getpid() != 1 {
		fmt.Fprintln(os.Stderr, "pause: warning: not PID 1, so orphans are not ours to reap")
	}
	reap() // children that exited before Notify sent no SIGCHLD we could see

	for sig := range sigs {
		if sig == syscall.SIGCHLD {
			reap()
			continue
		}
		fmt.Fprintf(os.Stderr, "pause: %v, exiting\n", sig)
		os.Exit(0)
	}
}

// reap waits for every child that has exited. Signals coalesce, so one
// SIGCHLD may stand for many children: loop until none is left to wait for.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if pid <= 0 || err != nil {
			return // no child has exited (0) or there are no children (ECHILD)
		}
	}
}
