// Package backoff paces the retries of the broker, its client and the
// agents, all alike: apimachinery's wait.Backoff, from an initial wait
// doubling up to a cap, each wait lengthened by up to half of itself at
// random so that clients that failed together do not come back together.
package backoff

import (
	"math"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Exponential waits initial, then twice as long after each failure, at most
// max (plus the jitter: a wait is between d and 1.5 d). Call Step for each
// wait; start again from a copy after a success.
func Exponential(initial, max time.Duration) wait.Backoff {
	// Steps only bounds the doubling (wait.Backoff stops growing when they
	// run out); Cap ends it.
	return wait.Backoff{Duration: initial, Factor: 2, Jitter: 0.5, Steps: math.MaxInt32, Cap: max}
}

// Nth is the wait after the n-th consecutive failure (n >= 1): b's n-th step.
// For a loop that keeps its count of failures rather than a wait.Backoff
// (in an object's status, across restarts).
func Nth(b wait.Backoff, n int) time.Duration {
	for i := 1; i < n && b.Steps > 0; i++ { // without Steps left, every step is the cap
		b.Step()
	}
	return b.Step()
}
